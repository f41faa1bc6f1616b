package gossip

import (
	"time"

	"github.com/starling-ml/starling/peerid"
)

// ReplayWindow is how far behind a sender's highest sequence number a
// message may arrive and still be accepted (GossipSub delivers over several
// paths, so a sender's messages can arrive out of order).
const ReplayWindow = 64

// replayGuard is an anti-replay filter per sender (the sliding window of
// RFC 4303, §3.4.3): it accepts a sequence number above the highest seen,
// or within ReplayWindow below it if not seen before, and rejects the
// rest. State for a sender is kept until Prune finds it unused for the
// retention time. Pure: times are arguments. Not safe for concurrent use.
type replayGuard struct {
	peers map[peerid.ID]*replayState
}

type replayState struct {
	top  uint64 // highest sequence number accepted
	seen uint64 // bit i set: top−i was accepted
	last time.Time
}

func newReplayGuard() *replayGuard { return &replayGuard{peers: make(map[peerid.ID]*replayState)} }

// Check reports whether seq from p is new, and records it if so.
func (g *replayGuard) Check(p peerid.ID, seq uint64, now time.Time) bool {
	s, ok := g.peers[p]
	if !ok {
		g.peers[p] = &replayState{top: seq, seen: 1, last: now}
		return true
	}
	switch {
	case seq > s.top:
		shift := seq - s.top
		if shift >= ReplayWindow {
			s.seen = 1
		} else {
			s.seen = s.seen<<shift | 1
		}
		s.top = seq
	case s.top-seq >= ReplayWindow:
		return false
	default:
		bit := uint64(1) << (s.top - seq)
		if s.seen&bit != 0 {
			return false
		}
		s.seen |= bit
	}
	s.last = now
	return true
}

// Prune forgets senders whose last accepted message is older than
// retention.
func (g *replayGuard) Prune(now time.Time, retention time.Duration) {
	for p, s := range g.peers {
		if now.Sub(s.last) > retention {
			delete(g.peers, p)
		}
	}
}

// Len returns the number of senders tracked.
func (g *replayGuard) Len() int { return len(g.peers) }
