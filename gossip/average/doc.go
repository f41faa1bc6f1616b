// Package average holds Starling's decentralised averaging algorithms, the
// seam they exchange vectors through, and its in-memory fake:
//
//   - Push-sum (Stochastic Gradient Push, Assran et al. 2019): each peer
//     holds (X, W) and its model is X/W; every step it keeps half and
//     pushes half to one out-neighbour of the time-varying exponential
//     graph (ExpGraphPeer: i + 2^(k mod log₂n)). Σ W is invariant, delays
//     only postpone mass. PushSum is the pure state, PushSumPeer the side
//     a driver calls.
//   - AD-PSGD pairwise averaging (Lian et al. 2018): an active peer and a
//     random passive peer atomically replace both models by their mean.
//     The active/passive split (RoleOf, PickPassive) makes it
//     deadlock-free. PairwiseAverage is the pure step, PairwisePeer the
//     side a driver calls.
//
// Vectors move through an Exchanger, which delivers what arrives for a
// peer to its Handler (PushSumPeer and PairwisePeer are Handlers).
// gossip.NodeTransport implements it over node/'s tensor streams;
// MemNetwork is its in-memory fake for tests and simulations. Peers are
// named by peerid.ID. A driver (train.RunGossip) owns the loop:
//
//	ps := average.NewPushSumPeer(params)     // the peer owns params now
//	ex := net.Join(self, ps)                 // or NodeTransport.Bind(ps, dim)
//	for k := uint64(0); ; k++ {
//		ps.Update(localSGDStep)                // X ← X − lr·W·∇f(X/W)
//		to := peers[average.ExpGraphPeer(me, n, k)]
//		err := ps.Step(ctx, ex, to, k, version) // ErrNotDelivered: mass kept
//	}
//
// The pure parts (PushSum, PairwiseAverage, the graph functions, RoleOf)
// start no goroutines, do no I/O and read no clock. PushSumPeer,
// PairwisePeer and MemNetwork are safe for concurrent use and start no
// goroutines either: exchanges run on their callers' goroutines. Shares
// and models are checked before they touch a model (ErrShape,
// ErrNonFinite, ErrBadWeight); SetClip bounds what one lying peer can do
// (aggregate/rule's DistanceClip).
package average
