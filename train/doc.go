// Package train holds Starling's training strategies: Local (one peer
// alone), Federated (FedAvg, FedProx, FedOpt, DiLoCo, and Streaming DiLoCo
// through Streaming: one strided fragment of the model per sync, outer
// gradients in any codec, optional overlap), Sync (data-parallel
// SGD), RunAsync (FedAsync, FedBuff), RunGossip (AD-PSGD, SGP), RunPS
// (parameter servers with backup failover) and Pipeline (one stage of a
// model split over peers, GPipe or 1F1B). A Worker is one peer's model,
// optimiser and data shard; the strategies drive it and reach the network
// only through their own interfaces (Net, AsyncNet, GossipNet, PSNet,
// PipeLink), which swarm implements over libp2p and traintest in memory.
//
//	w, _ := train.NewWorker(train.DefaultWorkerConfig(), shard)
//	err := train.Federated(ctx, w, peer.Net(batch), train.DefaultFedConfig(), rec, onRound)
//
// Every strategy takes each protocol decision in a pure function of what
// it saw (fedplan.go, syncplan.go, asyncplan.go, gossipplan.go,
// psplan.go, pipeplan.go) and keeps the waiting and I/O in a thin loop
// around it. Time comes from the time package; the in-memory tests run
// the loops inside testing/synctest bubbles (docs/design.md). Loops check ctx between steps, stop with
// ErrDiverged when the loss stops being finite, and report progress
// through callbacks that must not block.
package train
