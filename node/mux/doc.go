// Package mux is Starling's stream multiplexer: a libp2p
// network.Multiplexer (protocol ID "/starling/mux/1.0.0") built to move
// large tensors with little CPU. Identities, security and the stream API
// stay libp2p's; only the framing inside one secured connection is ours.
//
// What it saves over yamux, per data frame:
//   - no send copy and no writer goroutine: Write sends the frame header and
//     the caller's own slice under the connection's write lock (one vectored
//     write where the connection supports it);
//   - no receive copy: when a Read is waiting, the connection's reader
//     goroutine reads the payload from the socket straight into the pending
//     Read's buffer; when none is, it offers a frame of 64 KiB or more to
//     the stream's next Read for up to ReadWait, and that Read reads the
//     payload from the socket itself. Only smaller frames and payload that
//     no Read takes in time are buffered (in pooled chunks) and copied out
//     later. Without the offer a reader that falls behind by one frame
//     stays behind (every frame arrives before its Read) and every byte is
//     copied.
//
// Wire format. Every frame starts with a 12-byte header:
//
//	type (1) | flags (1) | reserved (2) | stream id (4, BE) | length (4, BE)
//
//	typeData    length bytes of payload follow; flagSYN opens the stream,
//	            flagFIN ends the sender's half.
//	typeWindow  grants length more bytes of send credit on the stream;
//	            flagSYN opens the stream (with that grant), flagFIN ends
//	            the sender's half.
//	typeReset   aborts the stream; length is the error code.
//	typeGoAway  closes the connection; length is the error code.
//
// Flow control is per stream: each side may send initialWindow bytes on a
// new stream, and more as the receiver grants them. A receiver grants its
// configured window at once (if the peer scope grants the memory) and then
// returns credit as the application consumes data, in batches of half the
// window. A peer that sends beyond its credit, or a frame larger than
// maxFrameLen, breaks the protocol and the connection is closed.
//
// Stream ids: the dialer (client) uses odd ids, the listener even ones.
//
// Deadlines. Every blocking call ends at its deadline, on Close, Reset or
// the connection's end. A payload being read straight into a Read's buffer
// is read under that Read's deadline (set on the connection for the time of
// that read); what is left of the frame is offered again or buffered.
// A connection write that passes a stream's write deadline leaves the frame
// half written, so the connection is closed: a peer that reads nothing for
// a whole write deadline is treated as gone.
//
// Not implemented: keepalive pings (libp2p's TCP keepalive and the
// application's own deadlines cover dead peers).
package mux
