// Package traintest holds in-memory fakes of the networks train's
// strategies run on, for tests (train's own, sim's, a user's) and
// simulations: no libp2p, no sockets, everything in one process.
//
//   - MemBus: a train.AsyncNet fabric for FedAsync and FedBuff
//     (RunAsync). Publish reaches every other member at once; Inject
//     delivers hand-made announcements, for bad-input tests.
//   - MemGossipNet: a train.GossipNet (and GossipProgress, with a
//     StepBoard) over an average.MemNetwork, for AD-PSGD and SGP
//     (RunGossip).
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
