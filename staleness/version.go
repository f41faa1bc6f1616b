package staleness

import (
	"fmt"
	"sort"
	"time"
)

// Version is a model version: the number of updates applied to a model since
// its initialisation. Versions only grow.
type Version uint64

// Staleness returns τ = current − base. A base newer than current is an
// error (ErrFutureVersion): the contribution cannot have been computed from
// a model this peer has not reached yet, so either the sender lies or the
// two peers do not share a version lineage.
func Staleness(current, base Version) (uint64, error) {
	if base > current {
		return 0, fmt.Errorf("%w: base %d > local %d", ErrFutureVersion, base, current)
	}
	return uint64(current - base), nil
}

// VersionClock is one peer's view of model versions: its own local version
// and the latest version each other peer announced, with when it was heard.
// Peers not heard from for ttl are ignored by Slowest and removed by Expire,
// so a crashed peer cannot hold an SSP gate shut forever. With SetStall,
// neither can a peer that is heard from but does not move on: a hung one,
// or one that lies about its version.
//
// Every method that needs the time takes it as an argument; VersionClock
// never reads the wall clock. It is not safe for concurrent use.
type VersionClock struct {
	local Version
	ttl   time.Duration
	stall time.Duration
	peers map[string]peerVersion
}

type peerVersion struct {
	v    Version
	seen time.Time
	// high is the highest version heard from the peer, and moved when
	// it was first heard.
	high  Version
	moved time.Time
}

// NewVersionClock returns a clock at version start whose peers expire when
// not heard from for ttl (ttl ≤ 0: never).
func NewVersionClock(start Version, ttl time.Duration) *VersionClock {
	return &VersionClock{local: start, ttl: ttl, peers: make(map[string]peerVersion)}
}

// Local returns the local version.
func (c *VersionClock) Local() Version { return c.local }

// Tick advances the local version by one and returns the new version.
func (c *VersionClock) Tick() Version {
	c.local++
	return c.local
}

// Set moves the local version to v (for example after loading a
// checkpoint or adopting a peer's newer model). It may move backwards.
func (c *VersionClock) Set(v Version) { c.local = v }

// Staleness returns τ of a contribution computed from base, against the
// local version.
func (c *VersionClock) Staleness(base Version) (uint64, error) {
	return Staleness(c.local, base)
}

// Observe records that peer was at version v at time now. The latest
// observation wins, even if v is lower than before (a peer may restart from
// a checkpoint); callers that need replay protection check sequence numbers
// before calling Observe.
func (c *VersionClock) Observe(peer string, v Version, now time.Time) {
	p, ok := c.peers[peer]
	if !ok || v > p.high {
		p.high, p.moved = v, now
	}
	p.v, p.seen = v, now
	c.peers[peer] = p
}

// SetStall makes Slowest ignore a peer whose highest version has not grown
// for d (d ≤ 0: never), until it grows: an SSP gate then waits at most d
// for a peer that is heard from but stays behind.
func (c *VersionClock) SetStall(d time.Duration) { c.stall = d }

// Forget removes peer.
func (c *VersionClock) Forget(peer string) { delete(c.peers, peer) }

// Peer returns the version last observed for peer and whether it is known.
func (c *VersionClock) Peer(peer string) (Version, bool) {
	p, ok := c.peers[peer]
	return p.v, ok
}

func (c *VersionClock) live(p peerVersion, now time.Time) bool {
	return c.ttl <= 0 || now.Sub(p.seen) < c.ttl
}

// Slowest returns the live peer with the lowest version (ties broken by the
// smaller peer name, so results are deterministic), leaving out stalled
// peers (SetStall). ok is false when no peer counts.
func (c *VersionClock) Slowest(now time.Time) (peer string, v Version, ok bool) {
	for name, p := range c.peers {
		if !c.live(p, now) || (c.stall > 0 && now.Sub(p.moved) >= c.stall) {
			continue
		}
		if !ok || p.v < v || (p.v == v && name < peer) {
			peer, v, ok = name, p.v, true
		}
	}
	return peer, v, ok
}

// Lag returns how many versions the local version is ahead of the slowest
// live peer (0 if none is live or none is behind).
func (c *VersionClock) Lag(now time.Time) uint64 {
	_, v, ok := c.Slowest(now)
	if !ok || v >= c.local {
		return 0
	}
	return uint64(c.local - v)
}

// Expire removes the peers not heard from for ttl at time now and returns
// their names, sorted.
func (c *VersionClock) Expire(now time.Time) []string {
	var gone []string
	for name, p := range c.peers {
		if !c.live(p, now) {
			gone = append(gone, name)
			delete(c.peers, name)
		}
	}
	sort.Strings(gone)
	return gone
}

// Live returns the number of peers heard from within ttl at time now.
func (c *VersionClock) Live(now time.Time) int {
	n := 0
	for _, p := range c.peers {
		if c.live(p, now) {
			n++
		}
	}
	return n
}

// Len returns the number of peers tracked (live or not yet expired).
func (c *VersionClock) Len() int { return len(c.peers) }
