package gossip

import (
	"context"
	"crypto/sha256"
	"errors"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"

	"github.com/starling-ml/starling/compression"
	"github.com/starling-ml/starling/gossip/wire"
)

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Unix(1_700_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// eventually polls cond until it holds or the deadline passes. The things
// it waits for happen on mocknet goroutines, outside the test's control.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	if !waitUntil(d, cond) {
		t.Fatalf("timed out after %v waiting for %s", d, what)
	}
}

// waitUntil polls cond every 5 ms for up to d and reports whether it held.
func waitUntil(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		<-tick.C
	}
	return true
}

// mesh returns n mocknet hosts, linked but not yet connected: start the
// routers first and then call connect, as GossipSub learns a peer's topics
// when it connects (its own tests do the same).
func mesh(t *testing.T, n int) (mocknet.Mocknet, []host.Host) {
	t.Helper()
	mn := mocknet.New()
	t.Cleanup(func() { mn.Close() })
	hosts := make([]host.Host, n)
	for i := range hosts {
		h, err := mn.GenPeer()
		if err != nil {
			t.Fatal(err)
		}
		hosts[i] = h
	}
	if err := mn.LinkAll(); err != nil {
		t.Fatal(err)
	}
	return mn, hosts
}

func connect(t *testing.T, mn mocknet.Mocknet) {
	t.Helper()
	if err := mn.ConnectAllButSelf(); err != nil {
		t.Fatal(err)
	}
}

func manualConfig() Config {
	c := DefaultConfig()
	c.Namespace = "test"
	c.Model = "mnist-mlp"
	c.HeartbeatInterval = 0
	return c
}

func startPlanes(t *testing.T, hosts []host.Host, cfg Config, clock Clock) []*ControlPlane {
	t.Helper()
	cps := make([]*ControlPlane, len(hosts))
	for i, h := range hosts {
		cp, err := New(h, cfg, WithClock(clock))
		if err != nil {
			t.Fatal(err)
		}
		cps[i] = cp
		t.Cleanup(func() { cp.Close() })
	}
	return cps
}

// waitTopicPeers waits until every plane sees want peers on both topics, so
// that what is published next reaches everyone.
func waitTopicPeers(t *testing.T, cps []*ControlPlane, want int) {
	t.Helper()
	enough := func(cp *ControlPlane) bool {
		return len(cp.hbTopic.ListPeers()) >= want && len(cp.annTopic.ListPeers()) >= want
	}
	if waitUntil(20*time.Second, func() bool { return !slices.ContainsFunc(cps, func(cp *ControlPlane) bool { return !enough(cp) }) }) {
		return
	}
	// Say which pairs miss each other, and what their connections carry.
	for i, cp := range cps {
		if enough(cp) {
			continue
		}
		hb := cp.hbTopic.ListPeers()
		t.Logf("plane %d: hb %d ann %d repairs %d conns %d", i, len(hb), len(cp.annTopic.ListPeers()), cp.Stats().Repairs, len(cp.h.Network().Peers()))
		for j, o := range cps {
			if i == j || slices.Contains(hb, o.h.ID()) {
				continue
			}
			conns := cp.h.Network().ConnsToPeer(o.h.ID())
			outbound, inbound := pubsubStreams(conns)
			protos, _ := cp.h.Peerstore().SupportsProtocols(o.h.ID(), pubsub.GossipSubDefaultProtocols...)
			t.Logf("  missing %d: conns %d outbound pubsub stream %v inbound %v protos %v; other side lists us: %v",
				j, len(conns), outbound, inbound, protos, slices.Contains(o.hbTopic.ListPeers(), cp.h.ID()))
		}
	}
	t.Fatal("timed out waiting for topic peers")
}

func TestMembershipOn16Hosts(t *testing.T) {
	const n = 16
	mn, hosts := mesh(t, n)
	clock := newFakeClock()
	cps := startPlanes(t, hosts, manualConfig(), clock)
	connect(t, mn)
	waitTopicPeers(t, cps, n-1)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i, cp := range cps {
		cp.SetStatus(wire.Status{Version: uint64(100 + i), SamplesPerSec: float32(10 * i)})
		if err := cp.Beat(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for i, cp := range cps {
		if _, err := cp.WaitPeers(ctx, n-1); err != nil {
			t.Fatalf("host %d sees %d peers: %v", i, len(cp.Peers()), err)
		}
	}
	// The view carries what each peer announced, and addresses reach the
	// peerstore.
	for i, cp := range cps {
		for j, h := range hosts {
			if i == j {
				continue
			}
			p, ok := cp.Peer(idOf(h.ID()))
			if !ok || p.Version != uint64(100+j) || p.SamplesPerSec != float32(10*j) || p.Model != "mnist-mlp" {
				t.Fatalf("host %d's view of %d: %+v %v", i, j, p, ok)
			}
			if len(p.Addrs) == 0 || len(hosts[i].Peerstore().Addrs(h.ID())) == 0 {
				t.Fatalf("host %d has no addresses for %d", i, j)
			}
		}
		if st := cp.Stats(); st.Heartbeats < n-1 || st.Dropped() != 0 {
			t.Fatalf("host %d stats: %v", i, st)
		}
	}

	// Silence: after the TTL every view is empty and Expire reports all.
	clock.Advance(manualConfig().PeerTTL)
	for i, cp := range cps {
		if live := cp.Peers(); len(live) != 0 {
			t.Fatalf("host %d still sees %d peers after the TTL", i, len(live))
		}
	}
	if gone := cps[0].Expire(); len(gone) != n-1 {
		t.Fatalf("Expire = %d peers, want %d", len(gone), n-1)
	}
	// One peer speaks again and comes back.
	if err := cps[1].Beat(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "host 1 to come back", func() bool {
		p := cps[0].Peers()
		return len(p) == 1 && p[0].ID == idOf(hosts[1].ID())
	})
}

func TestAnnouncements(t *testing.T) {
	mn, hosts := mesh(t, 4)
	cps := startPlanes(t, hosts, manualConfig(), newFakeClock())
	connect(t, mn)
	waitTopicPeers(t, cps, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	a := wire.Announcement{
		Version: 12, Base: 10, Kind: wire.KindDelta, Codec: compression.IDInt8,
		Elems: 1000, Size: 1100, Samples: 64, Loss: 0.5,
		Digest: sha256.Sum256([]byte("bytes")), Key: "delta/12",
	}
	if err := cps[0].Announce(ctx, a); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < 4; i++ {
		got, err := cps[i].Next(ctx)
		if err != nil {
			t.Fatalf("host %d: %v (stats %v)", i, err, cps[i].Stats())
		}
		if got.Peer != idOf(hosts[0].ID()) || got.Model != "mnist-mlp" || got.Version != 12 || got.Base != 10 ||
			got.Digest != a.Digest || got.Key != "delta/12" || got.Source() != idOf(hosts[0].ID()) {
			t.Fatalf("host %d got %+v", i, got)
		}
	}
	// A sender does not get its own announcements.
	short, cancelShort := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancelShort()
	if got, err := cps[0].Next(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("sender got %v, %v", got, err)
	}
	// Invalid announcements fail locally with the decoder's error.
	bad := a
	bad.Base = 13
	if err := cps[0].Announce(ctx, bad); !errors.Is(err, wire.ErrMalformed) {
		t.Fatalf("base > version: %v", err)
	}
	bad = a
	bad.Loss = float32(math.NaN())
	if err := cps[0].Announce(ctx, bad); !errors.Is(err, wire.ErrNonFinite) {
		t.Fatalf("NaN loss: %v", err)
	}
	// After Close, calls fail with ErrClosed.
	cps[3].Close()
	if err := cps[3].Beat(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Beat after Close: %v", err)
	}
	if _, err := cps[3].Next(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Next after Close: %v", err)
	}
}

// attacker is a GossipSub router without our validators, publishing raw
// bytes on our topics.
type attacker struct {
	ps          *pubsub.PubSub
	hb, ann     *pubsub.Topic
	cancelRoute context.CancelFunc
}

func newAttacker(t *testing.T, h host.Host, hbName, annName string, policy pubsub.MessageSignaturePolicy) *attacker {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ps, err := pubsub.NewGossipSub(ctx, h, pubsub.WithMessageSignaturePolicy(policy), pubsub.WithFloodPublish(true))
	if err != nil {
		t.Fatal(err)
	}
	a := &attacker{ps: ps, cancelRoute: cancel}
	if a.hb, err = ps.Join(hbName); err != nil {
		t.Fatal(err)
	}
	if a.ann, err = ps.Join(annName); err != nil {
		t.Fatal(err)
	}
	// Subscribing makes the honest routers count us as topic peers.
	if _, err := a.hb.Subscribe(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.ann.Subscribe(); err != nil {
		t.Fatal(err)
	}
	return a
}

// waitPeers waits until both of a's topics list every one of hosts.
func (a *attacker) waitPeers(t *testing.T, hosts []host.Host) {
	t.Helper()
	knows := func(tp *pubsub.Topic) bool {
		peers := tp.ListPeers()
		return !slices.ContainsFunc(hosts, func(h host.Host) bool { return !slices.Contains(peers, h.ID()) })
	}
	if !waitUntil(20*time.Second, func() bool { return knows(a.hb) && knows(a.ann) }) {
		t.Fatalf("attacker sees %d and %d of %d honest peers in its topics", len(a.hb.ListPeers()), len(a.ann.ListPeers()), len(hosts))
	}
}

// TestBadMessagesDropped has an attacker publish every kind of bad control
// message to three honest peers: each is dropped and counted under its
// reason, and only the attacker's one valid heartbeat gets through.
func TestBadMessagesDropped(t *testing.T) {
	mn, hosts := mesh(t, 5)
	honest := hosts[:3]
	cfg := manualConfig()
	cps := startPlanes(t, honest, cfg, newFakeClock())
	hbName, annName := cps[0].Topics()
	evil := newAttacker(t, hosts[3], hbName, annName, pubsub.StrictSign)
	unsigned := newAttacker(t, hosts[4], hbName, annName, pubsub.StrictNoSign)
	connect(t, mn)
	waitTopicPeers(t, cps, 4)
	// The attackers must know the honest peers' subscriptions too: a
	// message published before that goes to nobody (rejected messages are
	// not forwarded, so each honest peer hears only the attacker itself).
	for _, a := range []*attacker{evil, unsigned} {
		a.waitPeers(t, honest)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	evilID := idOf(hosts[3].ID())
	hb := func(seq uint64, f func(*wire.Heartbeat)) []byte {
		h := &wire.Heartbeat{Peer: evilID, Seq: seq, Model: cfg.Model, Status: wire.Status{Version: 1, SamplesPerSec: 1}}
		if f != nil {
			f(h)
		}
		return wire.AppendHeartbeat(nil, h)
	}
	nanHB := hb(1, nil)
	// Patch samples/s (4 bytes before the address count, the last byte) to
	// a NaN: the encoder would refuse nothing, but we want raw bytes.
	copy(nanHB[len(nanHB)-5:], []byte{0x00, 0x00, 0xc0, 0x7f})
	nanAnn := wire.AppendAnnouncement(nil, &wire.Announcement{
		Peer: evilID, Seq: 2, Model: cfg.Model, Version: 2, Base: 1, Kind: wire.KindDelta,
		Loss: float32(math.Inf(1)),
	})
	publish := []struct {
		topic *pubsub.Topic
		data  []byte
	}{
		{evil.hb, []byte("garbage")},
		{evil.hb, nanHB},
		{evil.ann, nanAnn},
		{evil.hb, make([]byte, cfg.MaxMessageSize+1)},
		{evil.hb, hb(3, func(h *wire.Heartbeat) { h.Peer = idOf(honest[0].ID()) })}, // claims another origin
		{evil.hb, hb(4, func(h *wire.Heartbeat) { h.Model = "other-model" })},
		{evil.hb, append([]byte{1}, hb(5, nil)[1:]...)}, // format 1: a peer on an older release
		{evil.hb, hb(10, nil)}, // valid
		{evil.hb, hb(10, nil)}, // replayed sequence number (a new pubsub message)
		{unsigned.hb, []byte("unsigned")},
	}
	for _, p := range publish {
		if err := p.topic.Publish(ctx, p.data); err != nil {
			t.Fatal(err)
		}
	}
	want := map[DropReason]uint64{
		DropMalformed: 1, DropNonFinite: 2, DropOversized: 1, DropOrigin: 1,
		DropModel: 1, DropReplay: 1, DropUnsigned: 1, DropVersion: 1,
	}
	eventually(t, 20*time.Second, "every drop counted at every honest peer", func() bool {
		for _, cp := range cps {
			st := cp.Stats()
			for r, n := range want {
				if st.Drop(r) < n {
					return false
				}
			}
			if len(cp.Peers()) != 1 {
				return false
			}
		}
		return true
	})
	for i, cp := range cps {
		st := cp.Stats()
		t.Logf("honest peer %d: %v", i, st)
		for r, n := range want {
			if st.Drop(r) != n {
				t.Errorf("peer %d: %s drops = %d, want %d", i, r, st.Drop(r), n)
			}
		}
		if st.Heartbeats != 1 || st.Announcements != 0 {
			t.Errorf("peer %d delivered %d heartbeats, %d announcements; want 1, 0", i, st.Heartbeats, st.Announcements)
		}
		if p := cp.Peers(); len(p) != 1 || p[0].ID != evilID || p[0].Seq != 10 {
			t.Errorf("peer %d membership: %+v", i, p)
		}
	}
}

func TestHeartbeatLoop(t *testing.T) {
	mn, hosts := mesh(t, 3)
	cfg := manualConfig()
	cfg.HeartbeatInterval = 20 * time.Millisecond
	cfg.PeerTTL = time.Second
	cps := startPlanes(t, hosts, cfg, realClock{})
	connect(t, mn)
	eventually(t, 20*time.Second, "automatic heartbeats", func() bool {
		for _, cp := range cps {
			if len(cp.Peers()) != 2 {
				return false
			}
		}
		return true
	})
	// Close stops the loop and waits for it; a second Close is harmless.
	for _, cp := range cps {
		if err := cp.Close(); err != nil {
			t.Fatal(err)
		}
		if err := cp.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestHeartbeatBurst has every peer of a 16-peer swarm beat several times
// at once, as a swarm whose peers start together does: pubsub's validation
// queue (32 by default) must not drop any of them.
func TestHeartbeatBurst(t *testing.T) {
	const n, beats = 16, 8
	mn, hosts := mesh(t, n)
	cps := startPlanes(t, hosts, manualConfig(), newFakeClock())
	connect(t, mn)
	waitTopicPeers(t, cps, n-1)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for _, cp := range cps {
		wg.Go(func() {
			for range beats {
				if err := cp.Beat(ctx); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	arrived := func(cp *ControlPlane) bool { st := cp.Stats(); return st.Heartbeats+st.Dropped() >= (n-1)*beats }
	waitUntil(20*time.Second, func() bool { return !slices.ContainsFunc(cps, func(cp *ControlPlane) bool { return !arrived(cp) }) })
	for i, cp := range cps {
		if st := cp.Stats(); st.Heartbeats != (n-1)*beats || st.Dropped() != 0 {
			t.Errorf("host %d stats: %v, want %d heartbeats", i, st, (n-1)*beats)
		}
	}
}

// loopbackHost is a libp2p host with identity sk on 127.0.0.1 (TCP),
// closed when the test ends.
func loopbackHost(t *testing.T, sk crypto.PrivKey) host.Host {
	t.Helper()
	h, err := libp2p.New(libp2p.Identity(sk), libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// TestDisconnectedPeerForgotten: a peer whose connections close (a killed
// process) leaves the view within DisconnectGrace, long before PeerTTL;
// when it comes back, the view holds the status of its new heartbeats
// (WithStatus: the first ones), not the one its previous life sent.
func TestDisconnectedPeerForgotten(t *testing.T) {
	// Real hosts on loopback: a process that dies closes its connections,
	// and the same identity comes back on a new port. (Over mocknet, the
	// two GossipSub routers of a reconnection by the same identity ended
	// with their streams or subscriptions one-sided in about 1 run in 7
	// under -race, however long the old life had been gone.)
	var sks [2]crypto.PrivKey
	hosts := make([]host.Host, 2)
	for i := range hosts {
		sk, _, err := crypto.GenerateEd25519Key(nil)
		if err != nil {
			t.Fatal(err)
		}
		sks[i], hosts[i] = sk, loopbackHost(t, sk)
	}
	cfg := manualConfig()
	cfg.PeerTTL = time.Minute
	cps := startPlanes(t, hosts, cfg, realClock{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := hosts[1].Connect(ctx, peer.AddrInfo{ID: hosts[0].ID(), Addrs: hosts[0].Addrs()}); err != nil {
		t.Fatal(err)
	}
	waitTopicPeers(t, cps, 1)
	cps[1].SetStatus(wire.Status{Version: 7})
	if err := cps[1].Beat(ctx); err != nil {
		t.Fatal(err)
	}
	id1 := idOf(hosts[1].ID())
	eventually(t, 10*time.Second, "the first heartbeat", func() bool { _, ok := cps[0].Peer(id1); return ok })
	// The process is gone: its plane and host close, and so do its
	// connections.
	cps[1].Close()
	start := time.Now()
	if err := hosts[1].Close(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "forgetting the disconnected peer", func() bool { _, ok := cps[0].Peer(id1); return !ok })
	if took := time.Since(start); took < DisconnectGrace/2 {
		t.Errorf("forgotten after %v, within the grace of %v", took, DisconnectGrace)
	}
	// The same identity comes back, as a restarted process: a new host on
	// a new port with a new control plane.
	h1 := loopbackHost(t, sks[1])
	cp, err := New(h1, cfg, WithStatus(wire.Status{JoinAt: 99}))
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Close()
	if err := h1.Connect(ctx, peer.AddrInfo{ID: hosts[0].ID(), Addrs: hosts[0].Addrs()}); err != nil {
		t.Fatal(err)
	}
	waitTopicPeers(t, []*ControlPlane{cps[0], cp}, 1)
	if err := cp.Beat(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the new life's heartbeat", func() bool { _, ok := cps[0].Peer(id1); return ok })
	if pi, _ := cps[0].Peer(id1); pi.JoinAt != 99 || pi.Version != 0 {
		t.Fatalf("view holds %+v, want the new life's status (JoinAt 99)", pi.Status)
	}
}
