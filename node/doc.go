// Package node is a Starling peer on libp2p: identity, transports, private
// swarms, discovery, the tensor stream protocol and metrics. It knows
// nothing about SGD; gossip/ and aggregate/ build on it.
//
// # Host
//
// New builds a libp2p host from a Config (start from DefaultConfig):
//
//   - identity: an Ed25519 key persisted in Config.KeyFile (created 0600;
//     refused with ErrKeyPermissions if its group or others have access);
//   - transports: TCP and QUIC (TCP only with a swarm key), secured by TLS
//     1.3 or Noise — or, with Config.Insecure on a trusted network, by
//     nothing (libp2p's plaintext handshake, TCP only) — multiplexed by
//     yamux in frames of up to 256 KiB; a TLS connection writes the
//     records of one frame with one system call (gather.go);
//   - a resource manager and yamux sized together for 1–500 MB tensors
//     (limits.go explains the numbers: a yamux window grows only when the
//     resource manager grants its memory, and libp2p's default 32 MiB per
//     connection silently keeps striped windows small);
//   - a connection manager (ConnLow/ConnHigh) that never trims a peer with
//     a tensor in flight, nor one under Protect(peer, tag): protect the
//     partners of the current round;
//   - Close stops discovery, fails pending Recvs with ErrClosed, resets
//     open streams, closes the host and waits for its goroutines.
//
// Attach runs the same tensor service on an existing host (mocknet, the
// simulator) without discovery.
//
// # Private swarms
//
// Two independent gates, usable together:
//
//   - a pre-shared key (Config.PSKFile, the IPFS swarm.key format that
//     `peer keygen --psk` writes): every byte on the connection is
//     additionally XSalsa20-encrypted with the swarm key, and a peer without
//     it cannot complete a handshake. libp2p's private networks wrap the raw
//     byte stream, so they work over TCP (and WebSocket) only: with a PSK
//     the node listens and dials on TCP only, and an explicit QUIC listen
//     address is refused with ErrQUICWithPSK. The extra cipher pass costs
//     CPU per byte, which shows where the CPU is the limit (docs/results).
//   - an allowlist of peer IDs (Config.Allowlist), enforced by a connection
//     gater right after the security handshake proves the remote key: no
//     per-byte cost, but the swarm's existence and addresses stay
//     visible to strangers (they are refused, not unable to talk).
//
// # Discovery
//
// mDNS (on by default) finds peers of the same SwarmName on a LAN with no
// configuration. With DHT on, the node runs a Kademlia DHT server on the
// private prefix /starling/<SwarmName> (never the public IPFS DHT), joins
// it through Config.Bootstrap, and every RendezvousInterval advertises
// itself under the swarm name and connects to the members it finds.
// AutoNAT and DCUtR hole punching (Config.NATService, HolePunching) let
// peers behind NATs upgrade relayed control connections to direct ones.
// A node with static relays (Config.Relays, --relay) books a circuit v2
// slot on them at start; one that AutoNAT finds unreachable books one on
// a connected peer that offers the relay service (Config.AutoRelay,
// RelayService); so two peers that cannot dial each other meet there
// (TestNATHolePunch: two peers behind masquerading routers).
// Relays carry control traffic only: the tensor protocol never opens a
// stream on a limited (relayed) connection — Send waits for a direct one
// until its deadline, then fails with ErrLimitedConn — and the receiver
// resets any tensor stream that arrives on one.
//
// # Tensor streams
//
// Protocol /starling/tensor/1.0.0. A stream carries frames back to back;
// each frame is a header (magic, wire version, codec id from compression,
// dtype, shape, tag, model version, step, total payload length, stripe
// index and count, flags, CRC-32C of the header), one stripe of the
// payload, and a CRC-32C trailer of that stripe (frame.go has the byte
// layout). On a connection whose transport authenticates every byte (TLS,
// Noise, QUIC) the sender leaves the trailer at zero and says so in the
// flags: a corrupted byte fails the transport's AEAD first. A receiver takes
// such a frame only on such a connection. A tensor
// larger than 2*MinStripeBytes is split into up to Config.Stripes stripes
// sent on parallel streams; the receiver derives each stripe's offset from
// the header, so stripes can neither overlap nor leave holes.
//
// The receiver checks every header before it allocates or reads a payload
// byte: an announced payload or decoded size over MaxTensorBytes, an
// unknown codec or dtype, a shape that disagrees with a raw payload's
// length, bad stripe numbering, then — after the payload — a checksum
// mismatch or a stream that ends early: each is a typed error (ErrFrameTooLarge,
// ErrUnknownCodec, ErrUnknownDType, ErrShapeMismatch, ErrBadHeader,
// ErrChecksum, ErrTruncated, …), resets the stream, and is counted in
// starling_node_frames_rejected_total{reason}. Every read and write has a
// deadline (Config.IOTimeout per read or write of at most 1 MiB,
// IdleTimeout between frames)
// and every blocking call honours its ctx; cancelling a Send resets its
// streams, so the receiving Recv fails promptly with ErrReset. A Recv that
// gives up (its ctx ends) while its tensor arrives returns at once; the
// rest of the tensor is drained, not reset, because pooled streams carry
// frames back to back and those queued behind it — whose Sends have
// returned — must still arrive. A tensor too large for its Recv's buffer
// and one the admission hook (AddAdmit: by sender and metadata, before any
// payload byte is read) refuses are drained the same way.
//
// # API for all-reduce and gossip
//
// A tensor is addressed by (sender, Tag); the Tag is the caller's, e.g.
// round<<32 | chunk. Recv is a mailbox lookup with a deadline:
//
//	// one-shot
//	err := n.Send(ctx, peer, node.Tensor{Tag: tag, Codec: id, DType: node.Float32,
//		Shape: []int{len(v)}, Version: ver, Payload: encoded})
//	t, err := n.Recv(ctx, peer, tag, buf) // t.Payload aliases buf
//
//	// a fixed pair exchanging many chunks (ring or butterfly neighbours)
//	l, err := n.Link(ctx, next, 2) // 2 warm streams, peer protected until Close
//	defer l.Close()
//	for c := range chunks {
//		go l.Send(ctx, chunk(c)) // or sequentially: frames go back to back
//	}
//	for c := range chunks {
//		t, err := n.Recv(ctx, prev, node.Tag(round)<<32|node.Tag(c), bufs[c])
//		...
//	}
//
// Receive into caller buffers: a Recv posted before its tensor arrives has
// the payload copied from the stream through a small staging buffer into
// its buffer (no tensor-sized intermediate; post Recvs ahead, as an
// all-reduce knows what it will receive). A tensor
// that arrives first is parked in a buffer of its own, bounded by
// MaxParkedPerPeer for each sender and MaxParkedBytes in total, and copied
// into the Recv's buffer later; past either bound, the sender's stream
// waits (back-pressure) for a Recv. The peers SetMayPark does not admit
// (swarm/ admits the live members of the group) share MaxStrangerParked,
// 4 MiB. Parked
// tensors nobody claims are dropped after ParkedTTL. Recv(ctx, "", tag, …)
// takes the tag from any peer (gossip's unsolicited pushes): the first
// tensor to arrive whole, so that a slow sender holds up no other. Send returns
// when every byte is handed to the transport; confirmation of delivery is
// the protocol's own (the reply of the all-reduce step). Send and Recv are
// safe for concurrent use; one Recv at a time per (peer, tag). Tensors with
// one tag from one sender arrive one after another: one sent in a single
// frame (below 2*MinStripeBytes, or with Stripes 1) while another is still
// arriving waits for it. Striped tensors with one tag must not be in
// flight at once (their stripes cannot be told apart): the second fails
// both as ErrBadHeader.
//
// # Metrics
//
// All collectors live in the node's registry (WithRegistry, else a private
// one — never the global default, so that tests and simulations with many
// nodes in one process do not collide); Config.MetricsAddr serves it at
// /metrics. Ours: starling_node_stream_bytes_total{direction,protocol,peer},
// starling_node_tensors_total{direction},
// starling_node_transfer_seconds{direction},
// starling_node_frames_rejected_total{reason}; libp2p's: swarm, identify,
// holepunch, autonat, relay and resource-manager collectors.
//
// # Refusals in the log
//
// A rejected frame (malformed, refused by a hook, from a stranger), a
// connection the allowlist refuses and an inbound connection that fails
// the handshake (a wrong or missing swarm key) are logged at warn level,
// naming the peer (or the remote IP, when the handshake never told who)
// and the reason, at most once per peer and reason every 30 s. The
// dialling side of a failed handshake gets ErrSwarmKey, one sentence,
// instead of libp2p's framing errors; one that a peer's --allow refuses
// gets ErrNotAllowed, where libp2p would report success.
package node
