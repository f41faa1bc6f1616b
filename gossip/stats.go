package gossip

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/starling-ml/starling/gossip/wire"
)

// DropReason says why a control message was not delivered.
type DropReason uint8

// Drop reasons.
const (
	DropOversized    DropReason = iota // larger than Config.MaxMessageSize
	DropMalformed                      // does not decode
	DropNonFinite                      // NaN or Inf in a float field
	DropOrigin                         // peer field differs from the signer
	DropModel                          // model id differs from ours
	DropReplay                         // sequence number already seen or too old
	DropUnsigned                       // no signature (pubsub strict signing)
	DropBadSignature                   // invalid or unexpected signature
	DropThrottled                      // pubsub's validation queue was full
	DropOverflow                       // our announcement queue was full (oldest dropped)
	DropUndelivered                    // our subscription's buffer was full (the reader fell behind)
	DropSendQueue                      // a peer's outbound queue was full (counted by the sender)
	DropVersion                        // another wire format version (a peer on another release)
	numDropReasons
)

var dropNames = [numDropReasons]string{
	"oversized", "malformed", "nonfinite", "origin", "model", "replay",
	"unsigned", "bad-signature", "throttled", "overflow", "undelivered",
	"send-queue", "version",
}

func (r DropReason) String() string {
	if r < numDropReasons {
		return dropNames[r]
	}
	return fmt.Sprintf("drop(%d)", uint8(r))
}

// reasonOf maps a decode error to its drop reason.
func reasonOf(err error) DropReason {
	switch {
	case errors.Is(err, wire.ErrVersion):
		return DropVersion
	case errors.Is(err, wire.ErrTooLarge):
		return DropOversized
	case errors.Is(err, wire.ErrNonFinite):
		return DropNonFinite
	}
	return DropMalformed
}

// Stats is a snapshot of a control plane's counters.
type Stats struct {
	Heartbeats    uint64 // heartbeats from other peers delivered
	Announcements uint64 // announcements from other peers delivered
	// Repairs counts peers handed back to GossipSub because it had no
	// outbound stream to them while connected (see repairLoop).
	Repairs uint64
	Drops   [numDropReasons]uint64
}

// Drop returns the count for one reason.
func (s Stats) Drop(r DropReason) uint64 {
	if r >= numDropReasons {
		return 0
	}
	return s.Drops[r]
}

// Dropped returns the total of all drops.
func (s Stats) Dropped() uint64 {
	var n uint64
	for _, c := range s.Drops {
		n += c
	}
	return n
}

func (s Stats) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "heartbeats=%d announcements=%d", s.Heartbeats, s.Announcements)
	if s.Repairs > 0 {
		fmt.Fprintf(&b, " repairs=%d", s.Repairs)
	}
	for r, c := range s.Drops {
		if c > 0 {
			fmt.Fprintf(&b, " %s=%d", DropReason(r), c)
		}
	}
	return b.String()
}

// counters is the live, concurrently updated form of Stats.
type counters struct {
	heartbeats, announcements, repairs atomic.Uint64
	drops                              [numDropReasons]atomic.Uint64
}

func (c *counters) drop(r DropReason) { c.drops[r].Add(1) }

func (c *counters) snapshot() Stats {
	s := Stats{Heartbeats: c.heartbeats.Load(), Announcements: c.announcements.Load(), Repairs: c.repairs.Load()}
	for i := range c.drops {
		s.Drops[i] = c.drops[i].Load()
	}
	return s
}
