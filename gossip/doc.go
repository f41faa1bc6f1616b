// Package gossip is Starling's GossipSub control plane and its gossip
// averaging algorithms.
//
// # Control plane
//
// A ControlPlane runs one GossipSub router on a libp2p host (a real one or
// a mocknet one) with strict message signing, and two topics per swarm:
//
//	/starling/<namespace>/members/1  heartbeats: peer, seq, model id, model
//	                                 version, samples/s, listen addresses
//	/starling/<namespace>/deltas/1   announcements: a vector (delta, model
//	                                 or gradient) is ready: version, base,
//	                                 codec, length, size, SHA-256, holder, key
//
// Messages are a compact versioned binary encoding (wire.go) of at most
// Config.MaxMessageSize bytes. Tensors never ride GossipSub: an
// announcement says where to pull, and node/'s tensor streams carry the
// bytes.
//
// Topic validators drop, and count by reason (Stats), messages that are
// oversized, malformed, carry a NaN or Inf, name a peer other than their
// signer, belong to another model, or replay a sequence number (a sliding
// window per sender tolerates GossipSub's reordering). GossipSub itself
// drops unsigned and badly signed messages; a tracer counts those too.
// Received heartbeats feed a Membership view (live peers, last seen,
// expiry by an injected Clock); received announcements queue for Next.
//
//	cp, err := gossip.New(h, cfg)
//	defer cp.Close()
//	cp.SetStatus(version, samplesPerSec)    // carried by the next heartbeat
//	cp.Announce(ctx, gossip.Announcement{…}) // after the vector is servable
//	for {
//		a, err := cp.Next(ctx)               // announcements from others
//		// pull a.Key from a.Source() over node/, check a.Digest, apply
//	}
//
// # Gossip averaging
//
// Two decentralised averaging schemes, as pure state plus small
// concurrency-safe peers:
//
//   - Push-sum (Stochastic Gradient Push, Assran et al. 2019): each peer
//     holds (X, W) and its model is X/W; every step it keeps half and
//     pushes half to one out-neighbour of the time-varying exponential graph
//     (ExpGraphPeer: i + 2^(k mod log₂n)). Σ W is invariant, delays only
//     postpone mass. PushSum is the pure state, PushSumPeer the driver side.
//   - AD-PSGD pairwise averaging (Lian et al. 2018): an active peer and a
//     random passive peer atomically replace both models by their mean.
//     The active/passive split (RoleOf) makes it deadlock-free.
//     PairwiseAverage is the pure step, PairwisePeer the driver side.
//
// Vectors move through an Exchanger, a narrow interface that node/'s tensor
// streams implement; MemNetwork is its in-memory fake for tests and
// simulations.
//
// Pure parts (wire codecs, Membership, PushSum, PairwiseAverage, the graph
// functions) start no goroutines, do no I/O and read no clock. ControlPlane,
// PushSumPeer and PairwisePeer are safe for concurrent use.
package gossip
