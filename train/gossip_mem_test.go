package train_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/starling-ml/starling/gossip/average"
	"github.com/starling-ml/starling/internal/ctxtime"
	"github.com/starling-ml/starling/peerid"
	"github.com/starling-ml/starling/train"
	"github.com/starling-ml/starling/train/traintest"
)

// stepCounter is a Recorder that stops the run once every live peer has
// done at least target steps (so peers stop together, whatever the
// machine's speed).
type stepCounter struct {
	mu     sync.Mutex
	steps  map[string]int
	live   int
	target int
	stop   context.CancelFunc
}

func (c *stepCounter) Snapshot(peer string, _ time.Duration, updates int, _ []float32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.steps[peer] = updates
	if len(c.steps) < c.live {
		return
	}
	for _, n := range c.steps {
		if n < c.target {
			return
		}
	}
	c.stop()
}

func (c *stepCounter) Event(train.Event) {}

// checkStopped fails t unless a stepCounter ended the run (ctx was
// cancelled, not timed out: every peer did steps) and no peer failed.
func checkStopped(t *testing.T, ctx context.Context, steps int, errs []error) {
	t.Helper()
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Fatalf("peers did not reach %d steps each: %v", steps, ctx.Err())
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("peer %d: %v", i, err)
		}
	}
}

// runGossipPeers trains k peers with RunGossip over an average.MemNetwork,
// in a synctest bubble, until each has done at least steps steps. dead
// peers never start and are reported dead to the others.
func runGossipPeers(t *testing.T, k, steps int, cfg train.GossipConfig, dead map[int]bool) ([]*train.Worker, []*train.GossipSummary, []*handlerNet) {
	t.Helper()
	sh := train.Shards(t, 6000, k)
	ids := make([]peerid.ID, k)
	for i := range ids {
		ids[i] = peerid.ID(fmt.Sprint("p", i))
	}
	isDead := func(p peerid.ID) bool {
		for i, id := range ids {
			if id == p {
				return dead[i]
			}
		}
		return false
	}
	ws := make([]*train.Worker, k)
	for i := range k {
		ws[i] = pacedWorker(t, sh[i], uint64(i+1))
	}
	sums := make([]*train.GossipSummary, k)
	nets := make([]*handlerNet, k)
	synctest.Test(t, func(t *testing.T) {
		mem := average.NewMemNetwork()
		errs := make([]error, k)
		ctx, cancel := context.WithTimeout(t.Context(), 120*time.Second)
		defer cancel()
		rec := &stepCounter{steps: map[string]int{}, live: k - len(dead), target: steps, stop: cancel}
		cfg.SnapshotEvery = 0
		var wg sync.WaitGroup
		for i := range k {
			if dead[i] {
				continue
			}
			net := &handlerNet{GossipNet: &traintest.MemGossipNet{Net: mem, ID: ids[i], Dead: isDead}}
			nets[i] = net
			wg.Go(func() { sums[i], errs[i] = train.RunGossip(ctx, ws[i], net, ids, cfg, rec) })
		}
		wg.Wait()
		checkStopped(t, ctx, steps, errs)
	})
	return ws, sums, nets
}

// localOnly trains k peers like runGossipPeers but with no exchanges, as a
// control for how far apart the models drift without averaging.
func localOnly(t *testing.T, k, steps int) []*train.Worker {
	t.Helper()
	sh := train.Shards(t, 6000, k)
	ws := make([]*train.Worker, k)
	for i := range ws {
		ws[i] = train.NewTestWorker(t, sh[i], uint64(i+1))
		if _, _, err := ws[i].LocalSteps(context.Background(), steps); err != nil {
			t.Fatal(err)
		}
	}
	return ws
}

// handlerNet remembers the handler RunGossip binds and counts the
// exchanges it starts, by partner.
type handlerNet struct {
	train.GossipNet
	h  average.Handler
	mu sync.Mutex
	to map[peerid.ID]int
}

func (n *handlerNet) Bind(h average.Handler, dim int) average.Exchanger {
	n.h = h
	n.to = make(map[peerid.ID]int)
	return &countingExchanger{Exchanger: n.GossipNet.Bind(h, dim), n: n}
}

func (n *handlerNet) count(p peerid.ID) {
	n.mu.Lock()
	n.to[p]++
	n.mu.Unlock()
}

type countingExchanger struct {
	average.Exchanger
	n *handlerNet
}

func (e *countingExchanger) Push(ctx context.Context, to peerid.ID, s average.Share) error {
	e.n.count(to)
	return e.Exchanger.Push(ctx, to, s)
}

func (e *countingExchanger) Swap(ctx context.Context, with peerid.ID, mine, theirs []float32) error {
	e.n.count(with)
	return e.Exchanger.Swap(ctx, with, mine, theirs)
}

// TestGossipLearns trains four peers with AD-PSGD and with SGP: each
// learns, the models end close to each other, and SGP's push-sum weights
// still sum to the number of peers.
func TestGossipLearns(t *testing.T) {
	_, te := train.MNIST(t)
	test := te.Head(2000)
	for _, algo := range []string{train.GossipPairwise, train.GossipPushSum} {
		t.Run(algo, func(t *testing.T) {
			cfg := train.DefaultGossipConfig()
			cfg.Algorithm = algo
			cfg.Every = 5
			ws, sums, nets := runGossipPeers(t, 4, 150, cfg, nil)
			wsum := 0.0
			for i, w := range ws {
				_, acc := w.Evaluate(test)
				t.Logf("peer %d: acc %.3f %+v", i, acc, *sums[i])
				if acc < 0.82 {
					t.Errorf("peer %d accuracy %.3f after %d steps, want ≥ 0.82", i, acc, sums[i].Steps)
				}
				// Every peer has joined before time passes: only the
				// exchange cut by the end of the run may fail.
				if sums[i].Failed > 1 {
					t.Errorf("peer %d: %d failed exchanges on a perfect network", i, sums[i].Failed)
				}
				if ps, ok := nets[i].h.(*average.PushSumPeer); ok {
					wsum += ps.Weight() // after every peer stopped: nothing in flight
				}
			}
			if algo == train.GossipPushSum {
				if math.Abs(wsum-4) > 1e-9 {
					t.Errorf("push-sum weights sum to %v, want 4", wsum)
				}
			} else if sums[0].Exchanges == 0 || sums[1].Role != "passive" {
				t.Errorf("AD-PSGD: %+v %+v", *sums[0], *sums[1])
			}
			d, d0 := maxDist(ws), maxDist(localOnly(t, 4, 150))
			t.Logf("models at most %.3f apart (relative), %.3f without averaging", d, d0)
			if d > d0/2 {
				t.Errorf("models %.3f apart, %.3f without averaging: want at most half", d, d0)
			}
		})
	}
}

// TestGossipSkipsDeadPeers runs with one peer dead from the start: the
// others never start an exchange with it, and finish.
func TestGossipSkipsDeadPeers(t *testing.T) {
	for _, algo := range []string{train.GossipPairwise, train.GossipPushSum} {
		cfg := train.DefaultGossipConfig()
		cfg.Algorithm = algo
		cfg.Period = 2 * time.Millisecond
		_, sums, nets := runGossipPeers(t, 4, 40, cfg, map[int]bool{1: true})
		for i, s := range sums {
			if s == nil {
				continue
			}
			if s.Steps < 40 || nets[i].to["p1"] != 0 {
				t.Errorf("%s peer %d: %d exchanges with the dead peer; %+v", algo, i, nets[i].to["p1"], *s)
			}
		}
	}
}

// TestPassiveServesActivesToTheEnd runs AD-PSGD with a fixed number of
// steps, the active peer 10× slower than the passive one, each leaving the
// network when RunGossip returns (as peer run closes its transport). The
// passive peer, done first, must stay in the exchange until the active
// one is done too: none of the active's exchanges may fail.
func TestPassiveServesActivesToTheEnd(t *testing.T) {
	const steps = 80
	sh := train.Shards(t, 2000, 2)
	ids := []peerid.ID{"p0", "p1"} // p0 active, p1 passive
	ws := []*train.Worker{pacedWorker(t, sh[0], 1), pacedWorker(t, sh[1], 2)}
	train.SetSlowdown(ws[0], 10)
	cfg := train.DefaultGossipConfig()
	cfg.MaxSteps, cfg.SnapshotEvery = steps, 0
	sums := make([]*train.GossipSummary, 2)
	synctest.Test(t, func(t *testing.T) {
		mem, board := average.NewMemNetwork(), &traintest.StepBoard{}
		ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
		defer cancel()
		errs := make([]error, 2)
		// Both peers join before either trains: an exchange with a peer
		// that has not joined yet fails, and a passive done before the
		// active has joined has no one to wait for; the test is about the
		// end.
		var joined sync.WaitGroup
		joined.Add(len(ids))
		var wg sync.WaitGroup
		for i := range ids {
			net := &bindHook{MemGossipNet: &traintest.MemGossipNet{Net: mem, ID: ids[i], Board: board}, bound: func() {
				joined.Done()
				joined.Wait()
			}}
			wg.Go(func() {
				sums[i], errs[i] = train.RunGossip(ctx, ws[i], net, ids, cfg, nil)
				mem.Leave(ids[i])
			})
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("peer %d: %v", i, err)
			}
		}
	})
	for i, s := range sums {
		if s.Steps != steps {
			t.Errorf("peer %d: %d steps, want %d", i, s.Steps, steps)
		}
	}
	a, p := sums[0], sums[1]
	t.Logf("active: %d exchanges, %d failed, %.2fs; passive served %.2fs after its last step", a.Exchanges, a.Failed, a.WallS, p.ServedS)
	if a.Role != "active" || p.Role != "passive" {
		t.Fatalf("roles %q, %q", a.Role, p.Role)
	}
	if a.Failed != 0 || a.Exchanges != steps {
		t.Errorf("active: %d exchanges and %d failed, want %d and none", a.Exchanges, a.Failed, steps)
	}
	// The passive peer stays until the active one is done, and leaves at
	// its next look at the step counts (every 100 ms).
	if p.ServedS <= 0 || p.WallS < a.WallS || p.WallS > a.WallS+0.1 {
		t.Errorf("passive served %.2fs and left at %.2fs, the active at %.2fs", p.ServedS, p.WallS, a.WallS)
	}
}

// bindHook is a MemGossipNet that calls bound once its handler has
// joined, before Bind returns.
type bindHook struct {
	*traintest.MemGossipNet
	bound func()
}

func (n *bindHook) Bind(h average.Handler, d int) average.Exchanger {
	ex := n.MemGossipNet.Bind(h, d)
	n.bound()
	return ex
}

// liarHandler is a passive AD-PSGD peer that answers every swap with a
// finite but absurd model (every parameter 50).
type liarHandler struct{}

func (liarHandler) HandleShare(average.Share) error { return errors.New("no") }

func (liarHandler) HandleSwap(_ peerid.ID, _, mine []float32) error {
	for i := range mine {
		mine[i] = 50
	}
	return nil
}

// TestGossipByzantinePassive runs AD-PSGD among seven honest peers and a
// lying passive one (p7, one passive peer in four) that answers with a
// finite but absurd model: clipped towards their own models
// (GossipConfig.ClipFactor), its answers cannot drag the others away, and
// every honest peer still learns.
func TestGossipByzantinePassive(t *testing.T) {
	_, te := train.MNIST(t)
	cfg := train.DefaultGossipConfig()
	cfg.MaxSteps, cfg.SnapshotEvery = 150, 0
	ws, sums := runGossipWithLiar(t, 7, cfg, func(context.Context, average.Exchanger, []peerid.ID) {})
	for i, w := range ws {
		_, acc := w.Evaluate(te.Head(2000))
		t.Logf("peer %d (%s): acc %.3f, %d exchanges, %d clipped", i, sums[i].Role, acc, sums[i].Exchanges, sums[i].Clipped)
		if acc < 0.7 {
			t.Errorf("peer %d: accuracy %.3f", i, acc)
		}
		if sums[i].Role == "active" && sums[i].Clipped == 0 {
			t.Errorf("active peer %d clipped no answer of the liar", i)
		}
	}
}

// runGossipWithLiar runs RunGossip with cfg among honest peers p0… on a
// MemNetwork, in a synctest bubble, and a liar (the last id) that answers
// swaps as liarHandler and runs act with its Exchanger while the others
// train.
func runGossipWithLiar(t *testing.T, honest int, cfg train.GossipConfig, act func(ctx context.Context, liar average.Exchanger, ids []peerid.ID)) ([]*train.Worker, []*train.GossipSummary) {
	t.Helper()
	sh := train.Shards(t, 1000*honest, honest)
	ids := make([]peerid.ID, honest+1)
	for i := range ids {
		ids[i] = peerid.ID(fmt.Sprint("p", i))
	}
	ws := make([]*train.Worker, honest)
	for i := range ws {
		ws[i] = pacedWorker(t, sh[i], uint64(i+1))
	}
	sums := make([]*train.GossipSummary, honest)
	synctest.Test(t, func(t *testing.T) {
		mem := average.NewMemNetwork()
		liar := mem.Join(ids[honest], liarHandler{})
		ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
		defer cancel()
		lctx, lcancel := context.WithCancel(ctx)
		var lwg sync.WaitGroup
		lwg.Go(func() { act(lctx, liar, ids[:honest]) })
		errs := make([]error, honest)
		var wg sync.WaitGroup
		for i := range ws {
			net := &traintest.MemGossipNet{Net: mem, ID: ids[i]}
			wg.Go(func() { sums[i], errs[i] = train.RunGossip(ctx, ws[i], net, ids, cfg, nil) })
		}
		wg.Wait()
		lcancel()
		lwg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("peer %d: %v", i, err)
			}
		}
	})
	return ws, sums
}

// TestGossipByzantineSGP runs SGP among six honest peers and a lying one
// (p6) that pushes a share of a finite but absurd model (every parameter
// 50, with a plausible weight) to an honest peer every 2 ms, far more
// often than anyone: clipped towards each receiver's own estimate
// (GossipConfig.ClipFactor), its shares cannot drag the others away (with
// ClipFactor 0 they end at 0.13).
func TestGossipByzantineSGP(t *testing.T) {
	_, te := train.MNIST(t)
	cfg := train.DefaultGossipConfig()
	cfg.Algorithm = train.GossipPushSum
	cfg.MaxSteps, cfg.SnapshotEvery = 150, 0
	dim := len(train.NewTestWorker(t, te.Head(10), 1).Model.Params)
	bad := make([]float32, dim)
	for i := range bad {
		bad[i] = 50 * 0.5 // X of a share of weight 0.5 whose X/W is 50
	}
	ws, sums := runGossipWithLiar(t, 6, cfg, func(ctx context.Context, liar average.Exchanger, honest []peerid.ID) {
		for k := 0; ctx.Err() == nil; k++ {
			liar.Push(ctx, honest[k%len(honest)], average.Share{Step: uint64(k), X: bad, W: 0.5})
			ctxtime.Sleep(ctx, 2*time.Millisecond)
		}
	})
	for i, w := range ws {
		_, acc := w.Evaluate(te.Head(2000))
		t.Logf("peer %d: acc %.3f, %d exchanges, %d clipped, weight %.3f", i, acc, sums[i].Exchanges, sums[i].Clipped, sums[i].Weight)
		if acc < 0.7 {
			t.Errorf("peer %d: accuracy %.3f", i, acc)
		}
		if sums[i].Clipped == 0 {
			t.Errorf("peer %d clipped no share of the liar", i)
		}
	}
}
