package train_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	aggrule "github.com/starling-ml/starling/aggregate/rule"
	"github.com/starling-ml/starling/compression"
	"github.com/starling-ml/starling/data"
	"github.com/starling-ml/starling/gossip/wire"
	"github.com/starling-ml/starling/internal/ctxtime"
	"github.com/starling-ml/starling/peerid"
	"github.com/starling-ml/starling/staleness"
	"github.com/starling-ml/starling/train"
	"github.com/starling-ml/starling/train/traintest"
)

// testStep is how long a local step of the in-memory integration tests
// takes. They run in synctest bubbles, where computing takes no time and
// virtual time passes only while every goroutine waits: the peers' pace is
// this step time (times a worker's Slowdown), whatever the machine's load,
// and no timeout fires because a CPU is busy.
const testStep = time.Millisecond

// runAsyncPeers trains k peers with RunAsync over a MemBus, in a synctest
// bubble, until each has done at least steps local steps (the fast ones go
// on until the slowest is done), and returns the workers and summaries.
// adversary, if set, runs alongside until the honest peers finish.
func runAsyncPeers(t *testing.T, k, steps int, cfg train.AsyncConfig, slow map[int]float64, adversary func(ctx context.Context, bus *traintest.MemBus, started chan<- struct{})) ([]*train.Worker, []*train.AsyncSummary) {
	t.Helper()
	return runAsyncPeersOn(t, k, steps, cfg, slow, adversary, nil)
}

// runAsyncPeersOn is runAsyncPeers with each peer's net passed through
// wrap (if set); peer i is "p<i>".
func runAsyncPeersOn(t *testing.T, k, steps int, cfg train.AsyncConfig, slow map[int]float64, adversary func(ctx context.Context, bus *traintest.MemBus, started chan<- struct{}), wrap func(train.AsyncNet) train.AsyncNet) ([]*train.Worker, []*train.AsyncSummary) {
	t.Helper()
	sh := train.Shards(t, 6000, k)
	workers := make([]*train.Worker, k)
	for i := range k {
		wc := train.DefaultWorkerConfig()
		wc.Model, wc.DataSeed, wc.Slowdown = train.TestArch, uint64(i+1), slow[i]
		w, err := train.NewWorker(wc, sh[i])
		if err != nil {
			t.Fatal(err)
		}
		train.SetStepTime(w, testStep)
		workers[i] = w
	}
	sums := make([]*train.AsyncSummary, k)
	synctest.Test(t, func(t *testing.T) {
		bus := traintest.NewMemBus()
		errs := make([]error, k)
		ctx, cancel := context.WithTimeout(t.Context(), 120*time.Second)
		defer cancel()
		rec := &stepCounter{steps: map[string]int{}, live: k, target: steps, stop: cancel}
		cfg.SnapshotEvery = 0
		nets := make([]train.AsyncNet, k)
		for i := range k {
			nets[i] = bus.Join(peerid.ID(fmt.Sprint("p", i)), cfg.Model, 1024)
			if wrap != nil {
				nets[i] = wrap(nets[i])
			}
		}
		actx, acancel := context.WithCancel(ctx)
		var awg sync.WaitGroup
		if adversary != nil {
			started := make(chan struct{})
			awg.Go(func() { adversary(actx, bus, started) })
			<-started
		}
		var wg sync.WaitGroup
		for i := range k {
			wg.Go(func() { sums[i], errs[i] = train.RunAsync(ctx, workers[i], nets[i], cfg, rec) })
		}
		wg.Wait()
		acancel()
		awg.Wait()
		checkStopped(t, ctx, steps, errs)
	})
	return workers, sums
}

// maxDist returns the largest distance between two peers' models,
// relative to the first model's norm.
func maxDist(ws []*train.Worker) float64 {
	norm := 0.0
	for _, v := range ws[0].Model.Params {
		norm += float64(v) * float64(v)
	}
	worst := 0.0
	for _, a := range ws {
		for _, b := range ws {
			s := 0.0
			for i := range a.Model.Params {
				d := float64(a.Model.Params[i] - b.Model.Params[i])
				s += d * d
			}
			worst = max(worst, math.Sqrt(s))
		}
	}
	return worst / math.Sqrt(norm)
}

// TestAsyncLearns runs three FedAsync and three FedBuff peers (one of them
// 3× slower; FedBuff with its default median of model votes and with the
// published mean of deltas) on a MemBus: each reaches a useful accuracy
// and contributions are merged.
func TestAsyncLearns(t *testing.T) {
	_, te := train.MNIST(t)
	test := te.Head(2000)
	for _, name := range []string{train.ModeFedAsync, train.ModeFedBuff, train.ModeFedBuff + "/mean"} {
		mode, rule, _ := strings.Cut(name, "/")
		t.Run(name, func(t *testing.T) {
			cfg := train.DefaultAsyncConfig()
			cfg.Mode = mode
			cfg.LocalSteps = 5
			if mode == train.ModeFedBuff {
				cfg.Policy = staleness.InvSqrt()
				cfg.BufferK = 3
				if rule == "mean" {
					cfg.BufferRule = aggrule.Mean{}
				}
			}
			ws, sums := runAsyncPeers(t, 3, 150, cfg, map[int]float64{2: 3}, nil)
			for i, w := range ws {
				_, acc := w.Evaluate(test)
				t.Logf("peer %d: acc %.3f %+v", i, acc, *sums[i])
				if acc < 0.82 {
					t.Errorf("peer %d accuracy %.3f after 150 steps, want ≥ 0.82", i, acc)
				}
				if sums[i].Merged == 0 {
					t.Errorf("peer %d merged nothing", i)
				}
				if sums[i].Steps < 150 {
					t.Errorf("peer %d did %d steps", i, sums[i].Steps)
				}
			}
			if mode == train.ModeFedBuff && sums[0].Flushes == 0 {
				t.Error("FedBuff never flushed")
			}

		})
	}
}

// TestFedAsyncPullsFromLinks: 8 FedAsync peers on a ring of connections
// (each connected to its two neighbours). With FarSources 0 a peer pulls
// from its neighbours only and opens no connection; with 1, at most one
// more each. Before the bound every peer pulled every announced model and
// connected to all 7 others: n² connections at scale. Every peer still
// merges and learns.
func TestFedAsyncPullsFromLinks(t *testing.T) {
	_, te := train.MNIST(t)
	test := te.Head(2000)
	const k = 8
	id := func(i int) peerid.ID { return peerid.ID(fmt.Sprint("p", (i+k)%k)) }
	for _, far := range []int{0, 1} {
		t.Run(fmt.Sprint("far", far), func(t *testing.T) {
			var ring [][2]peerid.ID
			for i := range k {
				ring = append(ring, [2]peerid.ID{id(i), id(i + 1)})
			}
			links := traintest.NewLinks(ring...)
			cfg := train.DefaultAsyncConfig()
			cfg.LocalSteps, cfg.FarSources = 5, far
			ws, sums := runAsyncPeersOn(t, k, 100, cfg, nil, nil, links.Wrap)
			var farDrops uint64
			if got, max := links.Pairs(), k+k*far; got > max {
				t.Errorf("%d connected pairs after training, want ≤ %d (ring %d + %d far each)", got, max, k, far)
			}
			for i, w := range ws {
				src := links.Sources(id(i))
				others := 0
				for s := range src {
					if s != id(i-1) && s != id(i+1) {
						others++
					}
				}
				_, acc := w.Evaluate(test)
				t.Logf("peer %d: acc %.3f, pulled from %v, merged %d, drops %v", i, acc, src, sums[i].Merged, sums[i].Drops)
				// A peer another one dialed is connected to it: far
				// sources of the others count for both.
				if far == 0 && others > 0 {
					t.Errorf("peer %d pulled from %d peers beyond its neighbours: %v", i, others, src)
				}
				// With a slot, a peer that others dialed may end up
				// connected to all and drop nothing.
				if sums[i].Merged == 0 || far == 0 && sums[i].Drops["far"] == 0 {
					t.Errorf("peer %d merged %d and dropped %d far models", i, sums[i].Merged, sums[i].Drops["far"])
				}
				farDrops += sums[i].Drops["far"]
				if acc < 0.8 {
					t.Errorf("peer %d accuracy %.3f", i, acc)
				}
			}
			if farDrops == 0 {
				t.Error("no far model dropped")
			}
		})
	}
}

// TestAsyncAdversary trains FedAsync peers while an adversary floods the
// bus with NaN models, foreign model ids, wrong shapes and replays: the
// honest peers count the drops and still learn, with finite models.
func TestAsyncAdversary(t *testing.T) {
	_, te := train.MNIST(t)
	cfg := train.DefaultAsyncConfig()
	cfg.LocalSteps = 5
	probe := train.NewTestWorker(t, te.Head(10), 1)
	dim := len(probe.Model.Params)
	fp32, _ := compression.Parse("fp32")
	nanModel := make([]float32, dim)
	nanModel[3] = float32(math.NaN())
	nanBytes := fp32.Encode(nil, nanModel)
	inject := func(bus *traintest.MemBus, seq uint64) {
		a := wire.Announcement{Peer: "evil", Seq: seq, Model: cfg.Model, Kind: wire.KindModel, Codec: fp32.ID(),
			Elems: uint32(dim), Size: uint64(len(nanBytes)), Digest: wire.Digest(nanBytes), Key: fmt.Sprint(seq)}
		switch seq % 4 {
		case 1:
			a.Model = "other"
		case 2:
			a.Elems++
		case 3:
			a.Seq = 1 // replay
		}
		bus.Inject(a, nanBytes)
	}
	// A burst before the honest peers start (they find it queued), then a
	// steady stream while they train.
	adversary := func(ctx context.Context, bus *traintest.MemBus, started chan<- struct{}) {
		seq := uint64(1)
		for ; seq <= 40; seq++ {
			inject(bus, seq)
		}
		close(started)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for ; ctx.Err() == nil; seq++ {
			inject(bus, seq)
			select {
			case <-tick.C:
			case <-ctx.Done():
			}
		}
	}
	ws, sums := runAsyncPeers(t, 3, 150, cfg, nil, adversary)
	for i, w := range ws {
		for j, v := range w.Model.Params {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				t.Fatalf("peer %d parameter %d is %v", i, j, v)
			}
		}
		_, acc := w.Evaluate(te.Head(2000))
		t.Logf("peer %d: acc %.3f drops %v", i, acc, sums[i].Drops)
		if acc < 0.82 {
			t.Errorf("peer %d accuracy %.3f under attack", i, acc)
		}
		for _, r := range []string{"model", "shape", "replay", "nonfinite"} {
			if sums[i].Drops[r] == 0 {
				t.Errorf("peer %d dropped no %s contribution: %v", i, r, sums[i].Drops)
			}
		}
	}
}

// absurdFlood returns an adversary for runAsyncPeers: a lying peer that
// floods the bus every 2 ms with a finite but absurd vector of kind (every
// value 50) for a model of dim values, claiming ever newer bases so that
// it is taken as fresh.
func absurdFlood(model string, dim int, kind wire.PayloadKind) func(context.Context, *traintest.MemBus, chan<- struct{}) {
	fp32, _ := compression.Parse("fp32")
	bad := make([]float32, dim)
	for i := range bad {
		bad[i] = 50
	}
	b := fp32.Encode(nil, bad)
	return func(ctx context.Context, bus *traintest.MemBus, started chan<- struct{}) {
		close(started)
		for seq := uint64(1); ctx.Err() == nil; seq++ {
			bus.Inject(wire.Announcement{Peer: "liar", Seq: seq, Model: model, Kind: kind, Codec: fp32.ID(), Base: seq,
				Elems: uint32(dim), Size: uint64(len(b)), Digest: wire.Digest(b), Key: fmt.Sprint(seq)}, b)
			ctxtime.Sleep(ctx, 2*time.Millisecond)
		}
	}
}

// TestAsyncByzantineModel trains FedAsync peers while a lying peer floods
// them with absurd models (absurdFlood): mixed in at most once per round
// and clipped towards each receiver's model (ClipFactor), it cannot drag
// the honest peers away, and they still learn.
func TestAsyncByzantineModel(t *testing.T) {
	_, te := train.MNIST(t)
	cfg := train.DefaultAsyncConfig()
	cfg.LocalSteps = 5
	dim := len(train.NewTestWorker(t, te.Head(10), 1).Model.Params)
	ws, sums := runAsyncPeers(t, 3, 150, cfg, nil, absurdFlood(cfg.Model, dim, wire.KindModel))
	for i, w := range ws {
		_, acc := w.Evaluate(te.Head(2000))
		t.Logf("peer %d: acc %.3f, merged %d, clipped %d, drops %v", i, acc, sums[i].Merged, sums[i].Clipped, sums[i].Drops)
		if acc < 0.7 || sums[i].Clipped == 0 || sums[i].Drops["repeat"] == 0 {
			t.Errorf("peer %d: accuracy %.3f with %d contributions clipped and %d repeats dropped", i, acc, sums[i].Clipped, sums[i].Drops["repeat"])
		}
	}
}

// TestFedBuffByzantine: as TestAsyncByzantineModel, for FedBuff with the
// median rule and a liar flooding absurd deltas. The honest peers must
// still learn; with the mean (the default) they end at 0.09–0.12.
func TestFedBuffByzantine(t *testing.T) {
	_, te := train.MNIST(t)
	cfg := train.DefaultAsyncConfig()
	cfg.Mode, cfg.Policy, cfg.BufferK, cfg.LocalSteps = train.ModeFedBuff, staleness.InvSqrt(), 3, 5
	dim := len(train.NewTestWorker(t, te.Head(10), 1).Model.Params)
	for _, rule := range []string{"median", "mean"} {
		cfg.BufferRule, _ = aggrule.Parse(rule)
		kind := wire.KindModel // the robust rules' votes are models
		if rule == "mean" {
			kind = wire.KindDelta
		}
		ws, sums := runAsyncPeers(t, 3, 150, cfg, nil, absurdFlood(cfg.Model, dim, kind))
		worst := 1.0
		for i, w := range ws {
			_, acc := w.Evaluate(te.Head(2000))
			t.Logf("%s: peer %d: acc %.3f, merged %d, flushes %d, drops %v", rule, i, acc, sums[i].Merged, sums[i].Flushes, sums[i].Drops)
			worst = min(worst, acc)
			if rule == "median" && (acc < 0.7 || sums[i].Flushes == 0) {
				t.Errorf("peer %d: accuracy %.3f with %d flushes", i, acc, sums[i].Flushes)
			}
		}
		if rule == "mean" && worst > 0.5 {
			t.Errorf("the mean kept every peer at %.3f or more: the test's liar is too weak", worst)
		}
	}
}

// sspConfig is FedAsync with an SSP bound of 3, short rounds and a short
// PeerTTL, for the tests of the gate.
func sspConfig() train.AsyncConfig {
	cfg := train.DefaultAsyncConfig()
	cfg.LocalSteps = 2
	cfg.Policy, _ = staleness.Parse("poly:0.5+ssp:3")
	cfg.PeerTTL = 200 * time.Millisecond
	cfg.SnapshotEvery = time.Hour
	return cfg
}

// pacedWorker is NewTestWorker with steps of testStep.
func pacedWorker(t *testing.T, shard *data.Set, seed uint64) *train.Worker {
	w := train.NewTestWorker(t, shard, seed)
	train.SetStepTime(w, testStep)
	return w
}

// TestAsyncDeadPeerDoesNotHang runs two peers with an SSP bound; one stops
// after 20 steps and leaves. The other's gate must open once the dead peer's
// version expires (PeerTTL), and it finishes its steps.
func TestAsyncDeadPeerDoesNotHang(t *testing.T) {
	sh := train.Shards(t, 2000, 2)
	wA, wB := pacedWorker(t, sh[0], 1), pacedWorker(t, sh[1], 2)
	synctest.Test(t, func(t *testing.T) {
		bus := traintest.NewMemBus()
		cfg := sspConfig()
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		var sumA *train.AsyncSummary
		var errA error
		netA, netB := bus.Join("a", cfg.Model, 256), bus.Join("b", cfg.Model, 256)
		wg.Go(func() {
			c := cfg
			c.MaxSteps = 20
			train.RunAsync(ctx, wB, netB, c, nil)
			bus.Leave("b")
		})
		wg.Go(func() {
			c := cfg
			c.MaxSteps = 300
			sumA, errA = train.RunAsync(ctx, wA, netA, c, nil)
		})
		wg.Wait()
		if errA != nil || ctx.Err() != nil {
			t.Fatalf("peer a: %v (ctx %v)", errA, ctx.Err())
		}
		if sumA.Steps != 300 {
			t.Fatalf("peer a did %d steps", sumA.Steps)
		}
		// b's last version held a's gate until it expired: PeerTTL, give
		// or take a look at the versions (20 ms).
		if ttl := cfg.PeerTTL.Seconds(); sumA.GateWaitS < ttl-0.02 || sumA.GateWaitS > ttl+0.02 {
			t.Fatalf("peer a waited %.3fs at the SSP gate, want PeerTTL (%v)", sumA.GateWaitS, cfg.PeerTTL)
		}
		t.Logf("%+v", *sumA)
	})
}

// TestFedBuffQuorumAfterPeersLeave: four robust FedBuff peers, two of
// which stop after 20 steps and leave. Until their versions expire
// (PeerTTL) the survivors count them live and wait for a quorum of 3
// votes that only 2 peers can give; then the quorum drops to 2 and their
// buffers step again: they finish their steps, most of their server
// steps after the others left.
func TestFedBuffQuorumAfterPeersLeave(t *testing.T) {
	sh := train.Shards(t, 4000, 4)
	ws := make([]*train.Worker, 4)
	for i := range ws {
		ws[i] = pacedWorker(t, sh[i], uint64(i+1))
	}
	synctest.Test(t, func(t *testing.T) {
		bus := traintest.NewMemBus()
		cfg := train.DefaultAsyncConfig()
		cfg.Mode, cfg.LocalSteps, cfg.PeerTTL, cfg.SnapshotEvery = train.ModeFedBuff, 2, 100*time.Millisecond, time.Hour
		cfg.BufferRule, cfg.BufferK = aggrule.Median{}, 8
		ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		sums, errs := make([]*train.AsyncSummary, 4), make([]error, 4)
		for i, w := range ws {
			id := peerid.ID(fmt.Sprint("p", i))
			net := bus.Join(id, cfg.Model, 256)
			wg.Go(func() {
				c := cfg
				c.MaxSteps = 1500
				if i >= 2 {
					c.MaxSteps = 20
				}
				sums[i], errs[i] = train.RunAsync(ctx, w, net, c, nil)
				if i >= 2 {
					bus.Leave(id)
				}
			})
		}
		wg.Wait()
		if ctx.Err() != nil {
			t.Fatalf("hung: %v", ctx.Err())
		}
		for i := range 2 {
			if errs[i] != nil || sums[i].Steps != 1500 {
				t.Fatalf("peer %d: %v after %d steps", i, errs[i], sums[i].Steps)
			}
			// 750 rounds of 2 steps from two peers: 1,500 deltas, K = 8, or
			// about 180 server steps. While the quorum was stuck at 3 they
			// took 5 or 6 in 300 steps.
			if sums[i].Flushes < 150 {
				t.Errorf("peer %d: %d server steps; the quorum did not drop with the peers gone", i, sums[i].Flushes)
			}
			t.Logf("peer %d: %d merged, %d server steps, drops %v", i, sums[i].Merged, sums[i].Flushes, sums[i].Drops)
		}
	})
}

// lastSnap keeps the parameters of the last snapshot it was given.
type lastSnap struct {
	mu     sync.Mutex
	params []float32
}

func (l *lastSnap) Snapshot(_ string, _ time.Duration, _ int, params []float32) {
	l.mu.Lock()
	l.params = append(l.params[:0], params...)
	l.mu.Unlock()
}

func (*lastSnap) Event(train.Event) {}

// TestFedBuffEndsWithItsModel: FedBuff trains each round on a copy of the
// peer's model; when the run ends the worker must hold the model (the
// last snapshot's), not the last round's local copy, which peer run
// reported and checkpointed as the final model before.
func TestFedBuffEndsWithItsModel(t *testing.T) {
	sh := train.Shards(t, 2000, 2)
	ws := []*train.Worker{pacedWorker(t, sh[0], 1), pacedWorker(t, sh[1], 2)}
	synctest.Test(t, func(t *testing.T) {
		bus := traintest.NewMemBus()
		cfg := train.DefaultAsyncConfig()
		cfg.Mode, cfg.LocalSteps, cfg.MaxSteps, cfg.BufferK = train.ModeFedBuff, 3, 40, 2
		var wg sync.WaitGroup
		recs := []*lastSnap{{}, {}}
		errs := make([]error, 2)
		for i := range 2 {
			net := bus.Join(peerid.ID(fmt.Sprint("p", i)), cfg.Model, 64)
			wg.Go(func() { _, errs[i] = train.RunAsync(t.Context(), ws[i], net, cfg, recs[i]) })
		}
		wg.Wait()
		for i := range 2 {
			if errs[i] != nil {
				t.Fatal(errs[i])
			}
			if !slices.Equal(ws[i].Model.Params, recs[i].params) {
				t.Errorf("peer %d: the worker's parameters are not the model of the last snapshot", i)
			}
		}
	})
}

// TestAsyncLyingPeerDoesNotHoldGate runs a peer with an SSP bound while
// another keeps announcing, every 20 ms, that it works from version 0.
// Heard from all the time, it never expires; the gate must still open once
// its version has not grown for 3×PeerTTL, and the peer finish its steps.
func TestAsyncLyingPeerDoesNotHoldGate(t *testing.T) {
	sh := train.Shards(t, 1000, 1)
	w := pacedWorker(t, sh[0], 1)
	synctest.Test(t, func(t *testing.T) {
		bus := traintest.NewMemBus()
		cfg := sspConfig()
		cfg.MaxSteps = 100
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		fp32, _ := compression.Parse("fp32")
		b := fp32.Encode(nil, make([]float32, len(w.Model.Params)))
		lctx, stop := context.WithCancel(ctx)
		var wg sync.WaitGroup
		net := bus.Join("a", cfg.Model, 256)
		wg.Go(func() {
			for seq := uint64(1); lctx.Err() == nil; seq++ {
				bus.Inject(wire.Announcement{Peer: "liar", Seq: seq, Model: cfg.Model, Kind: wire.KindModel, Codec: fp32.ID(),
					Elems: uint32(len(w.Model.Params)), Size: uint64(len(b)), Digest: wire.Digest(b), Key: fmt.Sprint(seq)}, b)
				ctxtime.Sleep(lctx, 20*time.Millisecond)
			}
		})
		sum, err := train.RunAsync(ctx, w, net, cfg, nil)
		stop()
		wg.Wait()
		if err != nil || ctx.Err() != nil {
			t.Fatalf("%v (ctx %v)", err, ctx.Err())
		}
		// The liar's version holds the gate until it has not grown for
		// 3×PeerTTL, give or take a look at the versions (20 ms).
		if stall := 3 * cfg.PeerTTL.Seconds(); sum.Steps != 100 || sum.GateWaitS < stall-0.02 || sum.GateWaitS > stall+0.02 {
			t.Fatalf("%d steps after %.3fs at the SSP gate, want 100 after %.1fs", sum.Steps, sum.GateWaitS, stall)
		}
	})
}

// TestAsyncRoundTime checks that RoundTime ends rounds early: with one step
// taking longer than RoundTime, every round is a single step; with steps
// of 1 ms and a RoundTime of 2.5 ms, rounds of 3 steps.
func TestAsyncRoundTime(t *testing.T) {
	sh := train.Shards(t, 1000, 1)
	for _, c := range []struct {
		slowdown  float64
		roundTime time.Duration
		rounds    int
	}{
		{3, time.Nanosecond, 12},
		{1, 2500 * time.Microsecond, 4},
		{1, 0, 2}, // LocalSteps
	} {
		wc := train.DefaultWorkerConfig()
		wc.Model, wc.Slowdown = train.TestArch, c.slowdown
		w, err := train.NewWorker(wc, sh[0])
		if err != nil {
			t.Fatal(err)
		}
		train.SetStepTime(w, testStep)
		synctest.Test(t, func(t *testing.T) {
			cfg := train.DefaultAsyncConfig()
			cfg.LocalSteps, cfg.RoundTime, cfg.MaxSteps = 10, c.roundTime, 12
			if c.roundTime > 0 {
				cfg.LocalSteps = 100
			}
			sum, err := train.RunAsync(t.Context(), w, traintest.NewMemBus().Join("solo", cfg.Model, 4), cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			if sum.Steps != 12 || sum.Rounds != c.rounds {
				t.Fatalf("round time %v, slowdown %v: %d steps in %d rounds, want %d rounds", c.roundTime, c.slowdown, sum.Steps, sum.Rounds, c.rounds)
			}
		})
	}
}
