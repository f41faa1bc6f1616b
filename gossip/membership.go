package gossip

import (
	"slices"
	"time"

	ma "github.com/multiformats/go-multiaddr"

	"github.com/starling-ml/starling/gossip/wire"
	"github.com/starling-ml/starling/peerid"
)

// PeerInfo is what the membership view knows about one live peer: its last
// heartbeat and when it arrived (by the local clock).
type PeerInfo struct {
	ID          peerid.ID
	Addrs       []ma.Multiaddr
	Model       string
	wire.Status // from the peer's last heartbeat
	Seq         uint64
	FirstSeen   time.Time
	LastSeen    time.Time
}

// Membership is the view of live peers built from heartbeats: a peer is
// live from its first heartbeat until ttl passes without another. It is
// pure (times are arguments) and not safe for concurrent use; ControlPlane
// wraps one in a mutex.
type Membership struct {
	ttl   time.Duration
	peers map[peerid.ID]*PeerInfo
}

// NewMembership returns an empty view whose peers expire after ttl without
// a heartbeat.
func NewMembership(ttl time.Duration) *Membership {
	return &Membership{ttl: ttl, peers: make(map[peerid.ID]*PeerInfo)}
}

// Observe records hb, received at now, and reports whether hb.Peer is new
// to the view (or returns after expiring). A heartbeat with a sequence
// number not above the last one recorded is ignored (the transport's
// replay filter admits some reordering; membership keeps the newest).
func (m *Membership) Observe(hb *wire.Heartbeat, now time.Time) (joined bool) {
	p, ok := m.peers[hb.Peer]
	if ok && !m.live(p, now) {
		delete(m.peers, hb.Peer)
		ok = false
	}
	if !ok {
		p = &PeerInfo{ID: hb.Peer, FirstSeen: now}
		m.peers[hb.Peer] = p
	} else if hb.Seq <= p.Seq {
		return false
	}
	p.Addrs = slices.Clone(hb.Addrs)
	p.Model = hb.Model
	p.Status = hb.Status
	p.Seq = hb.Seq
	p.LastSeen = now
	return !ok
}

func (m *Membership) live(p *PeerInfo, now time.Time) bool {
	return now.Sub(p.LastSeen) < m.ttl
}

// Get returns the peer's info if it is live at now.
func (m *Membership) Get(id peerid.ID, now time.Time) (PeerInfo, bool) {
	p, ok := m.peers[id]
	if !ok || !m.live(p, now) {
		return PeerInfo{}, false
	}
	return *p, true
}

// Live returns the peers live at now, sorted by ID. The slice is owned by
// the caller.
func (m *Membership) Live(now time.Time) []PeerInfo {
	out := make([]PeerInfo, 0, len(m.peers))
	for _, p := range m.peers {
		if m.live(p, now) {
			out = append(out, *p)
		}
	}
	slices.SortFunc(out, func(a, b PeerInfo) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	return out
}

// Expire removes the peers not live at now and returns their IDs, sorted.
func (m *Membership) Expire(now time.Time) []peerid.ID {
	var gone []peerid.ID
	for id, p := range m.peers {
		if !m.live(p, now) {
			gone = append(gone, id)
			delete(m.peers, id)
		}
	}
	slices.Sort(gone)
	return gone
}

// Remove forgets id at once (its connections closed: a killed process).
// A later heartbeat makes it live again, with the status that heartbeat
// carries, not the one it had.
func (m *Membership) Remove(id peerid.ID) { delete(m.peers, id) }

// Len returns the number of peers held (live or not yet expired).
func (m *Membership) Len() int { return len(m.peers) }
