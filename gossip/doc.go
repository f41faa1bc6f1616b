// Package gossip is the networked half of Starling's gossip: the GossipSub
// control plane and the node/ stream transport of gossip averaging and
// announce-and-pull. What travels, and the algorithms, are pure packages
// of their own: gossip/wire (the control messages and their codecs) and
// gossip/average (push-sum, AD-PSGD and their Exchanger seam).
//
// Peers are named by peerid.ID throughout the API; this package converts
// to and from libp2p's peer.ID at its edge (the signer of a message, the
// target of a stream).
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
// Messages are wire's versioned binary encoding, of at most
// Config.MaxMessageSize bytes. Tensors never ride GossipSub: an
// announcement says where to pull, and node/'s tensor streams carry the
// bytes.
//
// Topic validators drop, and count by reason (Stats), messages that are
// oversized, malformed, carry a NaN or Inf, name a peer other than their
// signer, belong to another model, replay a sequence number (a sliding
// window per sender tolerates GossipSub's reordering), or come in another
// wire format version (a peer on another Starling release: logged once).
// GossipSub itself drops unsigned and badly signed messages; a tracer
// counts those too. Received heartbeats feed a Membership view (live
// peers, last seen, expiry by an injected Clock); received announcements
// queue for Next.
//
//	cp, err := gossip.New(h, cfg)
//	defer cp.Close()
//	cp.SetStatus(version, samplesPerSec)  // carried by the next heartbeat
//	cp.Announce(ctx, wire.Announcement{…}) // after the vector is servable
//	for {
//		a, err := cp.Next(ctx)             // announcements from others
//		// t.Fetch(ctx, a, buf): pull a.Key from a.Source(), check a.Digest
//	}
//
// # Stream transport
//
// A NodeTransport carries vectors over node/'s tensor streams: it is the
// average.Exchanger of push-sum and AD-PSGD (Bind installs the local
// average.Handler), and it serves (Serve) and fetches (Fetch) the vectors
// that announcements point at, checked against their size and digest.
//
// Membership and the replay window are pure (times are arguments).
// ControlPlane and NodeTransport are safe for concurrent use and own
// their goroutines; Close stops and waits for them.
package gossip
