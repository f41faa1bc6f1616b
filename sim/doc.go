// Package sim runs training experiments with N Starling peers in one
// process, on an in-memory libp2p network (mocknet) whose links have a set
// latency and bandwidth. Each peer is what `peer run` builds on a real host:
// a node/ tensor service (node.Attach), a GossipSub control plane
// (gossip.New), a train.Worker on its shard of the data, and one strategy
// from train/ driving them. Stragglers are emulated by Worker.Slowdown,
// message delays by a seeded uniform delay on every message, and peers can
// be killed mid-run. Everything random is seeded: peer identities, the
// data partition and order, model initialisation, partner choice, delays.
// Timing is not: peers share the machine's cores, so compare strategies
// only within one invocation, as ratios.
//
//	cfg := sim.DefaultConfig()
//	cfg.Peers, cfg.Strategy, cfg.Slow = 4, "fedasync", map[int]float64{0: 4}
//	res, err := sim.Run(ctx, cfg, trainSet, testSet)
//	err = res.WriteFiles("out/fedasync") // CSV, PNG plots, summary.json
//
// During the run, strategies hand parameter snapshots to a train.Recorder;
// they are evaluated on the test set after the run, off the clock, so
// evaluation never slows training down (except the optional monitor that
// stops a run at a target accuracy, which evaluates the latest snapshots
// every MonitorEvery).
//
// Strategies are registered by name (Register); "fedasync", "fedbuff"
// (train.RunAsync), "adpsgd", "sgp" (train.RunGossip), "sync" (train.Sync:
// synchronous data-parallel SGD, one all-reduce of the gradients per step
// through aggregate.Runner over aggregate/p2p), "ps" (train.RunPS: the
// parameter-server mode over swarm.PSTransport) and "local" (no
// communication) are built in.
package sim
