package gossip

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/starling-ml/starling/gossip/wire"
	"github.com/starling-ml/starling/peerid"
)

// newPeerID returns the ID of a libp2p Ed25519 key made from seed.
func newPeerID(t testing.TB, seed byte) peerid.ID {
	t.Helper()
	_, pub, err := crypto.GenerateEd25519Key(bytes.NewReader(bytes.Repeat([]byte{seed}, 64)))
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.IDFromPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return idOf(id)
}

func TestReplayGuard(t *testing.T) {
	g := newReplayGuard()
	t0 := time.Unix(0, 0)
	p := peerid.ID("p")
	steps := []struct {
		seq  uint64
		want bool
	}{
		{100, true},
		{100, false},          // exact replay
		{101, true},           // in order
		{99, true},            // reordered, within the window, new
		{99, false},           // and replayed
		{100 + 64, true},      // top moves to 164
		{102, true},           // 62 below top: in the window, unseen
		{101, false},          // 63 below top: in the window, seen before
		{98, false},           // 66 below top: out of the window
		{164, false},          // replay of top
		{1000, true},          // big jump clears the window
		{1000 - 63, true},     // in the window, unseen
		{1000 - 64, false},    // outside
		{1 << 63, true},       // huge jump
		{(1 << 63) - 1, true}, // just below
	}
	for i, s := range steps {
		if got := g.Check(p, s.seq, t0); got != s.want {
			t.Fatalf("step %d: Check(%d) = %v, want %v", i, s.seq, got, s.want)
		}
	}
	if !g.Check("q", 1, t0) || !g.Check("q", 0, t0) {
		t.Fatal("peers must not share state")
	}
	g.Check("r", 5, t0.Add(time.Hour))
	g.Prune(t0.Add(time.Hour), 10*time.Minute)
	if g.Len() != 1 {
		t.Fatalf("Prune left %d peers, want 1", g.Len())
	}
}

func TestMembership(t *testing.T) {
	t0 := time.Unix(100, 0)
	m := NewMembership(5 * time.Second)
	a, b := newPeerID(t, 1), newPeerID(t, 2)
	if !m.Observe(&wire.Heartbeat{Peer: a, Seq: 1, Status: wire.Status{Version: 3}}, t0) {
		t.Fatal("first heartbeat should join")
	}
	if m.Observe(&wire.Heartbeat{Peer: a, Seq: 2, Status: wire.Status{Version: 4}}, t0.Add(time.Second)) {
		t.Fatal("second heartbeat should not join")
	}
	// An older heartbeat arriving late does not roll the view back.
	m.Observe(&wire.Heartbeat{Peer: a, Seq: 1, Status: wire.Status{Version: 3}}, t0.Add(2*time.Second))
	if p, _ := m.Get(a, t0.Add(2*time.Second)); p.Version != 4 || !p.LastSeen.Equal(t0.Add(time.Second)) {
		t.Fatalf("stale heartbeat applied: %+v", p)
	}
	m.Observe(&wire.Heartbeat{Peer: b, Seq: 1, Status: wire.Status{Version: 9}}, t0.Add(3*time.Second))
	live := m.Live(t0.Add(4 * time.Second))
	if len(live) != 2 || live[0].ID > live[1].ID {
		t.Fatalf("Live = %+v", live)
	}
	// a was last seen at t0+1s: gone at t0+6s; b stays until t0+8s.
	if live := m.Live(t0.Add(6 * time.Second)); len(live) != 1 || live[0].ID != b {
		t.Fatalf("Live after a's TTL = %+v", live)
	}
	if _, ok := m.Get(a, t0.Add(6*time.Second)); ok {
		t.Fatal("Get returned an expired peer")
	}
	if gone := m.Expire(t0.Add(6 * time.Second)); len(gone) != 1 || gone[0] != a {
		t.Fatalf("Expire = %v", gone)
	}
	// A returning peer joins again, even with a lower sequence (restart).
	if !m.Observe(&wire.Heartbeat{Peer: a, Seq: 1}, t0.Add(7*time.Second)) {
		t.Fatal("returning peer should join")
	}
	if m.Len() != 2 {
		t.Fatalf("Len = %d", m.Len())
	}
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	bad := []func(*Config){
		func(c *Config) { c.Namespace = "" },
		func(c *Config) { c.Namespace = "a/b" },
		func(c *Config) { c.Model = "" },
		func(c *Config) { c.Model = string(make([]byte, wire.MaxModelIDLen+1)) },
		func(c *Config) { c.HeartbeatInterval = -1 },
		func(c *Config) { c.PeerTTL = c.HeartbeatInterval },
		func(c *Config) { c.MaxMessageSize = 100 },
		func(c *Config) { c.MaxMessageSize = 1 << 20 },
		func(c *Config) { c.AnnounceQueue = 0 },
		func(c *Config) { c.ReplayRetention = time.Second },
	}
	for i, f := range bad {
		c := DefaultConfig()
		f(&c)
		if err := c.Validate(); !errors.Is(err, ErrBadConfig) {
			t.Errorf("case %d: %v, want ErrBadConfig", i, err)
		}
	}
	c := DefaultConfig()
	c.HeartbeatInterval = 0 // manual heartbeats
	if err := c.Validate(); err != nil {
		t.Errorf("manual heartbeats: %v", err)
	}
}
