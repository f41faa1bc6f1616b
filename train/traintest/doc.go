// Package traintest holds in-memory fakes of the networks train's
// strategies run on, for tests (train's own, a user's) and small
// experiments: no libp2p, no sockets, everything in one process. They
// implement the interfaces swarm implements over libp2p, and behave as it
// does where a strategy can tell.
//
//   - Net: a train.Net for Federated and Sync, over an aggregate.Runner
//     (on any aggregate.Transport, aggtest's in-memory network in tests)
//     and a Board shared by the peers (membership, statuses, states).
//   - MemBus: a train.AsyncNet fabric for FedAsync and FedBuff
//     (RunAsync). Publish reaches every other member at once; Inject
//     delivers hand-made announcements, for bad-input tests.
//   - MemGossipNet: a train.GossipNet (and GossipProgress, with a
//     StepBoard) over an average.MemNetwork, for AD-PSGD and SGP
//     (RunGossip).
//   - PSFabric: a train.PSNet fabric for the parameter-server mode (RunPS),
//     with Kill and Stall to take a server down.
//   - MemPipe: the links of a train.Pipeline's stages (activations and
//     gradients between neighbours); Kill takes a stage down.
//
// A run of asynchronous peers on one bus:
//
//	bus := traintest.NewMemBus()
//	for i, w := range workers {
//		net := bus.Join(peerid.ID(fmt.Sprint("p", i)), cfg.Model, 1024)
//		go train.RunAsync(ctx, w, net, cfg, rec)
//	}
//
// The fakes are safe for concurrent use; they start no goroutines, and
// every call runs on its caller's.
package traintest
