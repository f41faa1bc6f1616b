// Package wire holds the messages of Starling's GossipSub control plane
// and their binary codecs: Heartbeat (a peer's membership status) and
// Announcement (a vector is ready to be pulled), the caps on their
// fields, and Digest, the SHA-256 an announcement carries for the bytes
// it points at. Peers are named by peerid.ID.
//
// It is pure: no goroutines, no I/O, no clock, no libp2p. Package gossip
// publishes and validates the messages over GossipSub; strategies (train)
// read announcements without knowing how they travelled.
//
//	b := wire.AppendAnnouncement(buf[:0], &a) // encode, reusing buf
//	a, err := wire.DecodeAnnouncement(b)      // bytes from a peer
//	switch {
//	case errors.Is(err, wire.ErrVersion):     // a peer on another release
//	case err != nil:                          // malformed, too large, NaN
//	}
//	// pull a.Key from a.Source(); check the bytes against a.Size and a.Digest
//
// The format is versioned (FormatVersion, described in wire.go). Decoders
// check every field against its cap, refuse NaN and Inf, unknown kinds,
// codecs and trailing bytes, and never panic on bytes from a peer; errors
// wrap ErrVersion, ErrMalformed, ErrTooLarge or ErrNonFinite. A message of
// another format version fails with ErrVersion, so that a peer on another
// Starling release is told so rather than taken for a corrupt one.
package wire
