package swarm

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"

	"github.com/starling-ml/starling/compression"
	"github.com/starling-ml/starling/data"
	"github.com/starling-ml/starling/node"
	"github.com/starling-ml/starling/peerid"
	"github.com/starling-ml/starling/train"
)

func testConfig() Config {
	c := DefaultConfig()
	c.Node = node.TestConfig()
	c.Gossip.Namespace = "test"
	c.Aggregate.StallTimeout = 3 * time.Second
	return c
}

// newSwarm attaches n peers to a fully connected mocknet.
func newSwarm(t testing.TB, n int) []*Peer {
	ps, _ := newSwarmNet(t, n)
	return ps
}

// newSwarmNet is newSwarm, with the mocknet.
func newSwarmNet(t testing.TB, n int, link ...mocknet.LinkOptions) ([]*Peer, mocknet.Mocknet) {
	t.Helper()
	mn := mocknet.New()
	t.Cleanup(func() { mn.Close() })
	for _, l := range link {
		mn.SetLinkDefaults(l)
	}
	ps := attachPeers(t, mn, n)
	if err := mn.LinkAll(); err != nil {
		t.Fatal(err)
	}
	if err := mn.ConnectAllButSelf(); err != nil {
		t.Fatal(err)
	}
	return ps, mn
}

// cutOff unlinks and disconnects p from every other peer of ps: to them it
// is as if p had crashed, with no word of goodbye.
func cutOff(t testing.TB, mn mocknet.Mocknet, ps []*Peer, p *Peer) {
	t.Helper()
	for _, q := range ps {
		if q == p {
			continue
		}
		if err := mn.UnlinkPeers(p.Node.ID(), q.Node.ID()); err != nil {
			t.Error(err)
		}
		if err := mn.DisconnectPeers(p.Node.ID(), q.Node.ID()); err != nil {
			t.Error(err)
		}
	}
}

// attachPeers attaches n new peers to mn (not yet linked).
func attachPeers(t testing.TB, mn mocknet.Mocknet, n int) []*Peer {
	t.Helper()
	ps := make([]*Peer, n)
	for i := range ps {
		h, err := mn.GenPeer()
		if err != nil {
			t.Fatal(err)
		}
		if ps[i], err = Attach(h, testConfig()); err != nil {
			t.Fatal(err)
		}
		p := ps[i]
		t.Cleanup(func() { p.Close() })
	}
	return ps
}

func vec(n int, seed float32) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = seed + float32(i)*0.5
	}
	return v
}

func TestFetchStripedAndVerified(t *testing.T) {
	ps := newSwarm(t, 5)
	state := vec(100003, 1)
	for _, p := range ps[1:4] {
		p.state.publish(7, state)
	}
	ps[4].state.publish(7, vec(100003, 2)) // a liar: same version, other bytes
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dst := make([]float32, len(state))
	var ids []peerid.ID
	for _, p := range ps[1:] {
		ids = append(ids, p.ID())
	}
	ps[0].cfg.FetchFrom = 4
	v, err := ps[0].Fetch(ctx, ids, 5, dst)
	if err != nil {
		t.Fatal(err)
	}
	if v != 7 || !slices.Equal(dst, state) {
		t.Fatalf("version %d, state equal %v", v, slices.Equal(dst, state))
	}
}

func TestFetchWaitsForVersion(t *testing.T) {
	ps := newSwarm(t, 2)
	ps[1].state.publish(1, vec(10, 0))
	if !ps[1].StateIdle(time.Hour) {
		t.Fatal("a peer that served nothing is not idle")
	}
	go func() {
		time.Sleep(300 * time.Millisecond)
		if ps[1].StateIdle(0) {
			t.Error("idle while a fetch waits on it")
		}
		ps[1].state.publish(2, vec(10, 3))
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dst := make([]float32, 10)
	v, err := ps[0].Fetch(ctx, []peerid.ID{ps[1].ID()}, 2, dst)
	if err != nil || v != 2 || dst[0] != 3 {
		t.Fatalf("v=%d dst[0]=%v err=%v", v, dst[0], err)
	}
	if ps[1].StateIdle(time.Minute) {
		t.Fatal("idle for a minute just after serving")
	}
	// A version nobody reaches ends with the deadline, not a hang.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel2()
	start := time.Now()
	if _, err := ps[0].Fetch(ctx2, []peerid.ID{ps[1].ID()}, 9, dst); !errors.Is(err, ErrNoState) {
		t.Fatalf("err = %v", err)
	}
	if time.Since(start) > 4*time.Second {
		t.Fatalf("fetch overran its deadline: %v", time.Since(start))
	}
	// Wrong length is refused.
	if _, err := ps[0].Fetch(ctx, []peerid.ID{ps[1].ID()}, 1, make([]float32, 11)); err == nil {
		t.Fatal("wrong length accepted")
	}
}

var (
	mnistOnce        sync.Once
	mnistTr, mnistTe *data.Set
	mnistErr         error
)

// testMNIST loads MNIST once for the package's tests.
func testMNIST(t testing.TB) (train, test *data.Set) {
	t.Helper()
	mnistOnce.Do(func() { mnistTr, mnistTe, mnistErr = data.LoadMNIST("") })
	if mnistErr != nil {
		t.Fatal(mnistErr)
	}
	return mnistTr, mnistTe
}

// fedSwarm returns n connected swarm peers that see each other, a worker
// for each on its IID share of the first samples MNIST training images,
// and a context for the test (60 s).
func fedSwarm(t *testing.T, n, samples int) ([]*Peer, []*train.Worker, context.Context) {
	ps, workers, ctx, _ := fedSwarmNet(t, n, samples)
	return ps, workers, ctx
}

// fedSwarmNet is fedSwarm, with the mocknet.
func fedSwarmNet(t *testing.T, n, samples int, link ...mocknet.LinkOptions) ([]*Peer, []*train.Worker, context.Context, mocknet.Mocknet) {
	tr, _ := testMNIST(t)
	small := tr.Head(samples)
	shards, _ := data.IID(small.Len(), n, 1)
	ps, mn := newSwarmNet(t, n, link...)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	workers := make([]*train.Worker, n)
	for i, p := range ps {
		if err := p.WaitPeers(ctx, n); err != nil {
			t.Fatal(err)
		}
		wc := train.DefaultWorkerConfig()
		wc.Model, wc.Optimizer, wc.DataSeed = "logreg", "sgd", uint64(i+1)
		var err error
		if workers[i], err = train.NewWorker(wc, small.Subset(shards[i])); err != nil {
			t.Fatal(err)
		}
	}
	return ps, workers, ctx, mn
}

func TestFederatedOverMocknet(t *testing.T) {
	ps, workers, ctx := fedSwarm(t, 4, 2000)
	cfg := train.DefaultFedConfig()
	cfg.Rounds, cfg.Fraction, cfg.RoundTimeout = 4, 0.5, 30*time.Second
	var mu sync.Mutex
	finals := map[uint64]map[peerid.ID][]float32{}
	var wg sync.WaitGroup
	rec := &train.MemRecorder{}
	defer func() {
		for _, e := range rec.Events() {
			if e.Kind == "round-failed" {
				t.Logf("%s at %v: %s", e.Peer, e.At, e.Detail)
			}
		}
	}()
	errs := make([]error, len(ps))
	for i, p := range ps {
		wg.Add(1)
		go func(i int, p *Peer) {
			defer wg.Done()
			errs[i] = train.Federated(ctx, workers[i], p.Net(1), cfg, rec, func(ri train.RoundInfo) bool {
				if ri.Failed {
					t.Errorf("%s: round %d failed", p.ID(), ri.Round)
				}
				if ri.Synced {
					return false
				}
				mu.Lock()
				if finals[ri.Round] == nil {
					finals[ri.Round] = map[peerid.ID][]float32{}
				}
				finals[ri.Round][p.ID()] = slices.Clone(ri.Global)
				mu.Unlock()
				return false
			})
		}(i, p)
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("peer %d: %v", i, err)
		}
	}
	for r := uint64(1); r <= 4; r++ {
		var ref []float32
		if len(finals[r]) != 2 {
			t.Fatalf("round %d: %d participants finished, want 2", r, len(finals[r]))
		}
		for id, g := range finals[r] {
			if ref == nil {
				ref = g
			} else if !slices.Equal(ref, g) {
				t.Fatalf("round %d: %s holds another global model", r, id)
			}
		}
	}
}

// TestFederatedPeerStopsOverMocknet: a peer whose Federated returns early
// while its node stays up says so (a Done status); its partner leaves it out
// of Members and trains on alone instead of waiting for it in every
// round (1.5 s of alignment, then a failed all-reduce: a pair's quorum
// needs both).
func TestFederatedPeerStopsOverMocknet(t *testing.T) {
	ps, workers, ctx := fedSwarm(t, 2, 1000)
	cfg := train.DefaultFedConfig()
	cfg.Rounds, cfg.Fraction, cfg.RoundTimeout = 12, 1, 30*time.Second
	last := make([]uint64, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	start := time.Now()
	for i, p := range ps {
		wg.Go(func() {
			errs[i] = train.Federated(ctx, workers[i], p.Net(1), cfg, nil, func(ri train.RoundInfo) bool {
				last[i] = ri.Round
				t.Logf("peer %d round %d synced %v failed %v", i, ri.Round, ri.Synced, ri.Failed)
				return i == 1 && ri.Round == 3
			})
		})
	}
	wg.Wait()
	if errs[0] != nil || errs[1] != nil || last[0] != 12 || last[1] != 3 {
		t.Fatalf("peers ended at rounds %v with %v, want 12 and 3", last, errs)
	}
	// Peer 1 announced its stop: peer 0, alone of the last round's two,
	// is no minority waiting for it (train's quorate).
	if took := time.Since(start); took >= cfg.RoundTimeout {
		t.Errorf("took %v: peer 0 waited for the peer that had stopped", took)
	}
	if m := ps[0].Members(); len(m) != 1 || len(ps[0].Control.Peers()) != 1 {
		t.Fatalf("peer 0's members %v with %d live peers; want itself alone, the stopped peer still live", m, len(ps[0].Control.Peers()))
	}
}

// TestFederatedSampledPeerCrashesOverMocknet: with --fraction < 1, a peer
// that vanishes (no goodbye) right after a round it was sampled for is one
// of the 5 members the survivors saw in that round, not one of its 2
// participants: the 4 survivors are a majority and go on at once, without
// waiting for it as a minority would (train's quorate takes the last
// round's members, not its sample, as the reference).
func TestFederatedSampledPeerCrashesOverMocknet(t *testing.T) {
	const n = 5
	ps, workers, ctx, mn := fedSwarmNet(t, n, 2500)
	cfg := train.DefaultFedConfig()
	// Waiting for the crashed peer takes a whole RoundTimeout, so the run
	// would last longer than it; a loaded machine slows the 12 rounds to
	// half a minute at most.
	cfg.Rounds, cfg.Fraction, cfg.RoundTimeout = 12, 0.4, 60*time.Second
	rec := &train.MemRecorder{}
	var victim atomic.Int32
	victim.Store(-1)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i, p := range ps {
		wg.Go(func() {
			errs[i] = train.Federated(ctx, workers[i], p.Net(1), cfg, rec, func(ri train.RoundInfo) bool {
				if ri.Round >= 2 && !ri.Failed && !ri.Synced && len(ri.Sampled) < n &&
					slices.Contains(ri.Participants, p.ID()) && victim.CompareAndSwap(-1, int32(i)) {
					cutOff(t, mn, ps, p) // before Federated's goodbye, which goes nowhere
					return true
				}
				return false
			})
		})
	}
	wg.Wait()
	v := int(victim.Load())
	if v < 0 {
		t.Fatal("no peer took part in a sampled round")
	}
	for i := range ps {
		if i == v {
			continue
		}
		if errs[i] != nil {
			t.Fatalf("peer %d: %v", i, errs[i])
		}
	}
	for _, e := range rec.Events() {
		if e.Kind == "minority" && e.Peer != string(ps[v].ID()) {
			t.Errorf("%s at %v: %s", e.Peer, e.At, e.Detail)
		}
	}
	if took := time.Since(start); took >= cfg.RoundTimeout {
		t.Errorf("took %v: the survivors waited for the crashed peer", took)
	}
}

// TestStrangersShareLittle: a swarm peer parks a live member's
// unclaimed tensor, but a stranger's (a bare node on the same network that
// sends no heartbeats) only within node.Config.MaxStrangerParked: a larger
// one waits for its Recv with nothing parked for it.
func TestStrangersShareLittle(t *testing.T) {
	mn := mocknet.New()
	t.Cleanup(func() { mn.Close() })
	ps := attachPeers(t, mn, 2)
	h, err := mn.GenPeer()
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := node.Attach(h, node.TestConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stranger.Close() })
	if err := mn.LinkAll(); err != nil {
		t.Fatal(err)
	}
	if err := mn.ConnectAllButSelf(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	member, b := ps[0], ps[1]
	if err := b.WaitPeers(ctx, 2); err != nil {
		t.Fatal(err)
	}
	tensor := func(tag node.Tag, n int) node.Tensor {
		return node.Tensor{Tag: tag, Codec: compression.IDFP32, DType: node.Float32, Shape: []int{n / 4}, Payload: make([]byte, n)}
	}
	size := 2 * int(testConfig().Node.MaxStrangerParked)
	go stranger.Send(ctx, b.Node.ID(), tensor(2, size))
	if err := member.Node.Send(ctx, b.Node.ID(), tensor(1, size)); err != nil {
		t.Fatal(err)
	}
	for b.Node.ParkedBytes() < int64(size) {
		if ctx.Err() != nil {
			t.Fatalf("the member's tensor never parked (%d bytes parked)", b.Node.ParkedBytes())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := b.Node.ParkedBytes(); got != int64(size) {
		t.Fatalf("%d bytes parked, want the member's %d alone", got, size)
	}
	if _, err := b.Node.Recv(ctx, member.Node.ID(), 1, nil); err != nil {
		t.Fatal(err)
	}
	// The stranger's tensor waited: a Recv for it by name gets it.
	if _, err := b.Node.Recv(ctx, stranger.ID(), 2, make([]byte, size)); err != nil {
		t.Fatal(err)
	}
}
