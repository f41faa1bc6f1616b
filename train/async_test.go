package train

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/starling-ml/starling/peerid"

	"github.com/starling-ml/starling/compression"
	"github.com/starling-ml/starling/data"
	"github.com/starling-ml/starling/gossip/wire"
)

const testArch = "mlp:784-32-10"

func testWorker(t testing.TB, shard *data.Set, dataSeed uint64) *Worker {
	t.Helper()
	cfg := DefaultWorkerConfig()
	cfg.Model = testArch
	cfg.DataSeed = dataSeed
	w, err := NewWorker(cfg, shard)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// shards splits the first n training samples IID between k peers.
func shards(t testing.TB, n, k int) []*data.Set {
	t.Helper()
	tr, _ := mnist(t)
	parts, err := data.IID(n, k, 7)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]*data.Set, k)
	for i, p := range parts {
		out[i] = tr.Subset(p)
	}
	return out
}

func TestSeqWindow(t *testing.T) {
	var w seqWindow
	for _, tc := range []struct {
		seq  uint64
		want bool
	}{{10, true}, {10, false}, {12, true}, {11, true}, {11, false}, {9, true}, {100, true}, {36, false}, {37, true}, {37, false}, {12, false}, {200, true}, {100, false}} {
		if got := w.admit(tc.seq); got != tc.want {
			t.Fatalf("admit(%d) = %v, want %v", tc.seq, got, tc.want)
		}
	}
}

func TestAsyncConfigValidate(t *testing.T) {
	if err := DefaultAsyncConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*AsyncConfig){
		"mode":     func(c *AsyncConfig) { c.Mode = "sync" },
		"model":    func(c *AsyncConfig) { c.Model = "" },
		"steps":    func(c *AsyncConfig) { c.LocalSteps = 0 },
		"alpha":    func(c *AsyncConfig) { c.Alpha = 1.5 },
		"alpha0":   func(c *AsyncConfig) { c.Alpha = 0 },
		"policy":   func(c *AsyncConfig) { c.Policy = "poly:-1" },
		"k":        func(c *AsyncConfig) { c.BufferK = 0 },
		"lr":       func(c *AsyncConfig) { c.ServerLR = math.Inf(1) },
		"codec":    func(c *AsyncConfig) { c.Codec = "gzip" },
		"timeout":  func(c *AsyncConfig) { c.FetchTimeout = 0 },
		"fetchers": func(c *AsyncConfig) { c.Fetchers = 0 },
		"inbox":    func(c *AsyncConfig) { c.Inbox = 0 },
	} {
		c := DefaultAsyncConfig()
		mut(&c)
		if err := c.Validate(); !errors.Is(err, ErrStrategy) {
			t.Errorf("%s: %v, want ErrStrategy", name, err)
		}
	}
}

// TestAsyncDropsBadInput feeds one bad contribution at a time through the
// whole receive path (screen, fetch, decode, merge) of a FedAsync and a
// FedBuff peer and checks that each is dropped, counted under its reason,
// and leaves the model (and FedBuff's buffer) bit for bit unchanged; a good
// one then does reach the model.
func TestAsyncDropsBadInput(t *testing.T) {
	sh := shards(t, 512, 1)
	for _, mode := range []string{ModeFedAsync, ModeFedBuff} {
		t.Run(mode, func(t *testing.T) {
			w := testWorker(t, sh[0], 1)
			cfg := DefaultAsyncConfig()
			cfg.Mode = mode
			cfg.Policy = "poly:0.5+ssp:4"
			bus := NewMemBus()
			net := bus.Join("me", cfg.Model, 16)
			p, err := newAsyncPeer(w, "me", cfg, nil, asyncOptions{})
			if err != nil {
				t.Fatal(err)
			}
			const local = 10
			p.vc.Set(local)
			p.local.Store(local)
			dim := len(w.Model.Params)
			kind := p.kind()
			fp32, _ := compression.Parse("fp32")
			vec := func(n int, poison float32) []float32 {
				v := make([]float32, n)
				for i := range v {
					v[i] = 0.01 * float32(i%7)
				}
				if poison != 0 {
					v[n/2] = poison
				}
				return v
			}
			seq := uint64(100)
			ann := func(base uint64, payload []byte) wire.Announcement {
				seq++
				return wire.Announcement{Peer: "evil", Seq: seq, Model: cfg.Model, Version: base + 1, Base: base,
					Kind: kind, Codec: fp32.ID(), Elems: uint32(dim), Size: uint64(len(payload)),
					Digest: wire.Digest(payload), Key: fmt.Sprint("k", seq)}
			}
			good := fp32.Encode(nil, vec(dim, 0))
			ctx := context.Background()
			process := func(a wire.Announcement, payload []byte) {
				t.Helper()
				bus.Inject(a, payload)
				got, err := net.Next(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if r, ok := p.screen(got); !ok {
					p.drop(r, got.Peer, 0)
					return
				}
				c, r, ok := p.pull(ctx, net, got)
				if !ok {
					p.drop(r, got.Peer, 0)
					return
				}
				p.merge(c)
			}
			cases := []struct {
				name   string
				reason DropReason
				make   func() (wire.Announcement, []byte)
				direct *contribution // merged directly, past the screen
			}{
				{"unknown model id", DropModel, func() (wire.Announcement, []byte) {
					a := ann(local, good)
					a.Model = "someone-else"
					return a, good
				}, nil},
				{"wrong payload kind", DropKind, func() (wire.Announcement, []byte) {
					a := ann(local, good)
					a.Kind = wire.KindGradient
					return a, good
				}, nil},
				{"announced shape", DropShape, func() (wire.Announcement, []byte) {
					b := fp32.Encode(nil, vec(dim+1, 0))
					a := ann(local, b)
					a.Elems = uint32(dim + 1)
					return a, b
				}, nil},
				{"decoded shape", DropShape, func() (wire.Announcement, []byte) {
					b := fp32.Encode(nil, vec(dim-3, 0))
					return ann(local, b), b
				}, nil},
				{"NaN", DropNonFinite, func() (wire.Announcement, []byte) {
					b := fp32.Encode(nil, vec(dim, float32(math.NaN())))
					return ann(local, b), b
				}, nil},
				{"+Inf", DropNonFinite, func() (wire.Announcement, []byte) {
					b := fp32.Encode(nil, vec(dim, float32(math.Inf(1))))
					return ann(local, b), b
				}, nil},
				{"-Inf", DropNonFinite, func() (wire.Announcement, []byte) {
					b := fp32.Encode(nil, vec(dim, float32(math.Inf(-1))))
					return ann(local, b), b
				}, nil},
				{"beyond SSP bound", DropStale, func() (wire.Announcement, []byte) {
					return ann(local-5, good), good
				}, nil},
				{"far future base", DropFuture, func() (wire.Announcement, []byte) {
					return ann(local+cfg.MaxAhead+1, good), good
				}, nil},
				{"replayed seq", DropReplay, func() (wire.Announcement, []byte) {
					a := ann(local, good)
					a.Seq = 60 // already seen
					return a, good
				}, nil},
				{"seq too old", DropReplay, func() (wire.Announcement, []byte) {
					a := ann(local, good)
					a.Seq = 20 // more than 64 below the newest
					return a, good
				}, nil},
				{"digest mismatch", DropFetch, func() (wire.Announcement, []byte) {
					a := ann(local, good)
					a.Digest[0] ^= 1
					return a, good
				}, nil},
				{"corrupt encoding", DropDecode, func() (wire.Announcement, []byte) {
					b := slices.Clone(good)
					b[0] = 0x7f // not fp32's id
					return ann(local, b), b
				}, nil},
				{"merge: beyond SSP bound", DropStale, nil,
					&contribution{from: "evil", base: local - 6, version: local, kind: kind, vec: vec(dim, 0)}},
				{"merge: far future", DropFuture, nil,
					&contribution{from: "evil", base: local + cfg.MaxAhead + 5, version: local + cfg.MaxAhead + 6, kind: kind, vec: vec(dim, 0)}},
				{"merge: NaN", DropNonFinite, nil,
					&contribution{from: "evil", base: local, version: local + 1, kind: kind, vec: vec(dim, float32(math.NaN()))}},
				{"merge: shape", DropShape, nil,
					&contribution{from: "evil", base: local, version: local + 1, kind: kind, vec: vec(dim-1, 0)}},
			}
			p.seen["evil"] = &seqWindow{}
			p.seen["evil"].admit(60)
			p.seen["evil"].admit(100)
			for _, tc := range cases {
				before := slices.Clone(p.model())
				drops := p.dropCounts()
				if tc.direct != nil {
					p.merge(tc.direct)
				} else {
					process(tc.make())
				}
				after := p.dropCounts()
				if after[tc.reason] != drops[tc.reason]+1 || after.Total() != drops.Total()+1 {
					t.Fatalf("%s: drops %v → %v, want one more %s", tc.name, drops, after, tc.reason)
				}
				if !slices.Equal(before, p.model()) {
					t.Fatalf("%s reached the model", tc.name)
				}
				if p.buffer != nil && p.buffer.Len() != 0 {
					t.Fatalf("%s reached the buffer", tc.name)
				}
			}
			if p.merged != 0 || p.vc.Local() != local {
				t.Fatalf("merged %d, version %d after bad input only", p.merged, p.vc.Local())
			}
			// A good contribution gets through, so the checks above are not
			// vacuous.
			before := slices.Clone(p.model())
			process(ann(local, good), good)
			if p.merged != 1 {
				t.Fatalf("good contribution not merged; drops %v", p.dropCounts())
			}
			if p.buffer != nil {
				if p.buffer.Len() != 1 {
					t.Fatalf("good delta not buffered")
				}
			} else if slices.Equal(before, p.model()) {
				t.Fatal("good model not mixed")
			}
		})
	}
}

// runAsyncPeers trains k peers with RunAsync over a MemBus until each has
// done at least steps local steps (the fast ones go on until the slowest
// is done), and returns the workers and summaries. adversary, if set, runs
// alongside until the honest peers finish.
func runAsyncPeers(t *testing.T, k, steps int, cfg AsyncConfig, slow map[int]float64, adversary func(ctx context.Context, bus *MemBus, started chan<- struct{})) ([]*Worker, []*AsyncSummary) {
	t.Helper()
	sh := shards(t, 6000, k)
	bus := NewMemBus()
	workers := make([]*Worker, k)
	sums := make([]*AsyncSummary, k)
	errs := make([]error, k)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	rec := &stepCounter{steps: map[string]int{}, live: k, target: steps, stop: cancel}
	cfg.SnapshotEvery = 0
	nets := make([]AsyncNet, k)
	for i := range k {
		wc := DefaultWorkerConfig()
		wc.Model, wc.DataSeed, wc.Slowdown = testArch, uint64(i+1), slow[i]
		w, err := NewWorker(wc, sh[i])
		if err != nil {
			t.Fatal(err)
		}
		workers[i] = w
		nets[i] = bus.Join(peerid.ID(fmt.Sprint("p", i)), cfg.Model, 1024)
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
		wg.Go(func() { sums[i], errs[i] = RunAsync(ctx, workers[i], nets[i], cfg, rec) })
	}
	wg.Wait()
	acancel()
	awg.Wait()
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Fatalf("peers did not reach %d steps each: %v", steps, ctx.Err())
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("peer %d: %v", i, err)
		}
	}
	return workers, sums
}

// maxDist returns the largest distance between two peers' models,
// relative to the first model's norm.
func maxDist(ws []*Worker) float64 {
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
	_, te := mnist(t)
	test := te.Head(2000)
	for _, name := range []string{ModeFedAsync, ModeFedBuff, ModeFedBuff + "/mean"} {
		mode, rule, _ := strings.Cut(name, "/")
		t.Run(name, func(t *testing.T) {
			cfg := DefaultAsyncConfig()
			cfg.Mode = mode
			cfg.LocalSteps = 5
			if mode == ModeFedBuff {
				cfg.Policy = "sqrt"
				cfg.BufferK = 3
				if rule != "" {
					cfg.BufferRule = rule
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
			if mode == ModeFedBuff && sums[0].Flushes == 0 {
				t.Error("FedBuff never flushed")
			}

		})
	}
}

// TestAsyncAdversary trains FedAsync peers while an adversary floods the
// bus with NaN models, foreign model ids, wrong shapes and replays: the
// honest peers count the drops and still learn, with finite models.
func TestAsyncAdversary(t *testing.T) {
	_, te := mnist(t)
	cfg := DefaultAsyncConfig()
	cfg.LocalSteps = 5
	probe := testWorker(t, te.Head(10), 1)
	dim := len(probe.Model.Params)
	fp32, _ := compression.Parse("fp32")
	nanModel := make([]float32, dim)
	nanModel[3] = float32(math.NaN())
	nanBytes := fp32.Encode(nil, nanModel)
	inject := func(bus *MemBus, seq uint64) {
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
	adversary := func(ctx context.Context, bus *MemBus, started chan<- struct{}) {
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
func absurdFlood(model string, dim int, kind wire.PayloadKind) func(context.Context, *MemBus, chan<- struct{}) {
	fp32, _ := compression.Parse("fp32")
	bad := make([]float32, dim)
	for i := range bad {
		bad[i] = 50
	}
	b := fp32.Encode(nil, bad)
	return func(ctx context.Context, bus *MemBus, started chan<- struct{}) {
		close(started)
		for seq := uint64(1); ctx.Err() == nil; seq++ {
			bus.Inject(wire.Announcement{Peer: "liar", Seq: seq, Model: model, Kind: kind, Codec: fp32.ID(), Base: seq,
				Elems: uint32(dim), Size: uint64(len(b)), Digest: wire.Digest(b), Key: fmt.Sprint(seq)}, b)
			sleepCtx(ctx, 2*time.Millisecond)
		}
	}
}

// TestAsyncByzantineModel trains FedAsync peers while a lying peer floods
// them with absurd models (absurdFlood): mixed in at most once per round
// and clipped towards each receiver's model (ClipFactor), it cannot drag
// the honest peers away, and they still learn.
func TestAsyncByzantineModel(t *testing.T) {
	_, te := mnist(t)
	cfg := DefaultAsyncConfig()
	cfg.LocalSteps = 5
	dim := len(testWorker(t, te.Head(10), 1).Model.Params)
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
	_, te := mnist(t)
	cfg := DefaultAsyncConfig()
	cfg.Mode, cfg.Policy, cfg.BufferK, cfg.LocalSteps = ModeFedBuff, "sqrt", 3, 5
	dim := len(testWorker(t, te.Head(10), 1).Model.Params)
	for _, rule := range []string{"median", "mean"} {
		cfg.BufferRule = rule
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
func sspConfig() AsyncConfig {
	cfg := DefaultAsyncConfig()
	cfg.LocalSteps = 2
	cfg.Policy = "poly:0.5+ssp:3"
	cfg.PeerTTL = 200 * time.Millisecond
	cfg.SnapshotEvery = time.Hour
	return cfg
}

// TestAsyncDeadPeerDoesNotHang runs two peers with an SSP bound; one stops
// after 20 steps and leaves. The other's gate must open once the dead peer's
// version expires (PeerTTL), and it finishes its steps.
func TestAsyncDeadPeerDoesNotHang(t *testing.T) {
	sh := shards(t, 2000, 2)
	bus := NewMemBus()
	cfg := sspConfig()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var sumA *AsyncSummary
	var errA error
	wA, wB := testWorker(t, sh[0], 1), testWorker(t, sh[1], 2)
	netA, netB := bus.Join("a", cfg.Model, 256), bus.Join("b", cfg.Model, 256)
	wg.Go(func() {
		c := cfg
		c.MaxSteps = 20
		RunAsync(ctx, wB, netB, c, nil)
		bus.Leave("b")
	})
	wg.Go(func() {
		c := cfg
		c.MaxSteps = 300
		sumA, errA = RunAsync(ctx, wA, netA, c, nil)
	})
	wg.Wait()
	if errA != nil || ctx.Err() != nil {
		t.Fatalf("peer a: %v (ctx %v)", errA, ctx.Err())
	}
	if sumA.Steps != 300 {
		t.Fatalf("peer a did %d steps", sumA.Steps)
	}
	// b's last version held a's gate until it expired.
	if sumA.GateWaitS < 0.1 {
		t.Fatalf("peer a waited %.3fs at the SSP gate, want about PeerTTL", sumA.GateWaitS)
	}
	t.Logf("%+v", *sumA)
}

// TestFedBuffQuorumAfterPeersLeave: four robust FedBuff peers, two of
// which stop after 20 steps and leave. Until their versions expire
// (PeerTTL) the survivors count them live and wait for a quorum of 3
// votes that only 2 peers can give; then the quorum drops to 2 and their
// buffers step again: they finish their steps, most of their server
// steps after the others left.
func TestFedBuffQuorumAfterPeersLeave(t *testing.T) {
	sh := shards(t, 4000, 4)
	bus := NewMemBus()
	cfg := DefaultAsyncConfig()
	cfg.Mode, cfg.LocalSteps, cfg.PeerTTL, cfg.SnapshotEvery = ModeFedBuff, 2, 100*time.Millisecond, time.Hour
	cfg.BufferRule, cfg.BufferK = "median", 8
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	sums, errs := make([]*AsyncSummary, 4), make([]error, 4)
	for i := range 4 {
		id := peerid.ID(fmt.Sprint("p", i))
		w, net := testWorker(t, sh[i], uint64(i+1)), bus.Join(id, cfg.Model, 256)
		wg.Go(func() {
			c := cfg
			c.MaxSteps = 1500
			if i >= 2 {
				c.MaxSteps = 20
			}
			sums[i], errs[i] = RunAsync(ctx, w, net, c, nil)
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
		if sums[i].Flushes < 50 {
			t.Errorf("peer %d: %d server steps; the quorum did not drop with the peers gone", i, sums[i].Flushes)
		}
		t.Logf("peer %d: %d merged, %d server steps, drops %v", i, sums[i].Merged, sums[i].Flushes, sums[i].Drops)
	}
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

func (*lastSnap) Event(Event) {}

// TestFedBuffEndsWithItsModel: FedBuff trains each round on a copy of the
// peer's model; when the run ends the worker must hold the model (the
// last snapshot's), not the last round's local copy, which peer run
// reported and checkpointed as the final model before.
func TestFedBuffEndsWithItsModel(t *testing.T) {
	sh := shards(t, 2000, 2)
	bus := NewMemBus()
	cfg := DefaultAsyncConfig()
	cfg.Mode, cfg.LocalSteps, cfg.MaxSteps, cfg.BufferK = ModeFedBuff, 3, 40, 2
	var wg sync.WaitGroup
	ws := []*Worker{testWorker(t, sh[0], 1), testWorker(t, sh[1], 2)}
	recs := []*lastSnap{{}, {}}
	errs := make([]error, 2)
	for i := range 2 {
		net := bus.Join(peerid.ID(fmt.Sprint("p", i)), cfg.Model, 64)
		wg.Go(func() { _, errs[i] = RunAsync(t.Context(), ws[i], net, cfg, recs[i]) })
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
}

// TestAsyncLyingPeerDoesNotHoldGate runs a peer with an SSP bound while
// another keeps announcing, every 20 ms, that it works from version 0.
// Heard from all the time, it never expires; the gate must still open once
// its version has not grown for 3×PeerTTL, and the peer finish its steps.
func TestAsyncLyingPeerDoesNotHoldGate(t *testing.T) {
	sh := shards(t, 1000, 1)
	bus := NewMemBus()
	cfg := sspConfig()
	cfg.MaxSteps = 100
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w := testWorker(t, sh[0], 1)
	fp32, _ := compression.Parse("fp32")
	b := fp32.Encode(nil, make([]float32, len(w.Model.Params)))
	lctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		for seq := uint64(1); lctx.Err() == nil; seq++ {
			bus.Inject(wire.Announcement{Peer: "liar", Seq: seq, Model: cfg.Model, Kind: wire.KindModel, Codec: fp32.ID(),
				Elems: uint32(len(w.Model.Params)), Size: uint64(len(b)), Digest: wire.Digest(b), Key: fmt.Sprint(seq)}, b)
			sleepCtx(lctx, 20*time.Millisecond)
		}
	})
	sum, err := RunAsync(ctx, w, bus.Join("a", cfg.Model, 256), cfg, nil)
	stop()
	wg.Wait()
	if err != nil || ctx.Err() != nil {
		t.Fatalf("%v (ctx %v)", err, ctx.Err())
	}
	if sum.Steps != 100 || sum.GateWaitS < 0.5 || sum.GateWaitS > 10 {
		t.Fatalf("%d steps after %.2fs at the SSP gate, want 100 after about 0.6s", sum.Steps, sum.GateWaitS)
	}
}

// TestAsyncRoundTime checks that RoundTime ends rounds early: with one step
// taking longer than RoundTime, every round is a single step.
func TestAsyncRoundTime(t *testing.T) {
	sh := shards(t, 1000, 1)
	wc := DefaultWorkerConfig()
	wc.Model, wc.Slowdown = testArch, 3
	w, err := NewWorker(wc, sh[0])
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultAsyncConfig()
	cfg.LocalSteps, cfg.RoundTime, cfg.MaxSteps = 100, time.Nanosecond, 12
	sum, err := RunAsync(context.Background(), w, NewMemBus().Join("solo", cfg.Model, 4), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Steps != 12 || sum.Rounds != 12 {
		t.Fatalf("%d steps in %d rounds, want 12 rounds of one step", sum.Steps, sum.Rounds)
	}
}

func TestPullQueue(t *testing.T) {
	ann := func(p string, seq uint64) *wire.Announcement {
		return &wire.Announcement{Peer: peerid.ID(p), Seq: seq}
	}
	ctx := context.Background()
	q := newPullQueue(true, 3)
	for _, a := range []*wire.Announcement{ann("a", 1), ann("b", 1)} {
		if old, _ := q.push(a); old != nil {
			t.Fatalf("push displaced %v", old)
		}
	}
	// A newer model from a replaces the queued one in place.
	if old, r := q.push(ann("a", 2)); old == nil || old.Seq != 1 || r != DropSuperseded {
		t.Fatalf("coalesce: %v %v", old, r)
	}
	q.push(ann("c", 1))
	// Over max: the oldest goes.
	if old, r := q.push(ann("d", 1)); old == nil || old.Peer != "a" || r != DropOverflow {
		t.Fatalf("overflow: %v %v", old, r)
	}
	var got []string
	for range 3 {
		a, ok := q.pop(ctx)
		if !ok {
			t.Fatal("pop failed")
		}
		got = append(got, fmt.Sprint(string(a.Peer), a.Seq))
	}
	if fmt.Sprint(got) != "[b1 c1 d1]" {
		t.Fatalf("popped %v", got)
	}
	// a's slot was freed by the overflow: a new a is queued, not merged.
	if old, _ := q.push(ann("a", 3)); old != nil {
		t.Fatalf("push after overflow displaced %v", old)
	}
	if a, _ := q.pop(ctx); a.Seq != 3 {
		t.Fatalf("popped %v", a)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	if _, ok := q.pop(cctx); ok {
		t.Fatal("pop on an empty queue returned")
	}
	// Without coalescing (FedBuff) every delta waits its turn.
	q = newPullQueue(false, 8)
	q.push(ann("a", 1))
	if old, _ := q.push(ann("a", 2)); old != nil {
		t.Fatalf("FedBuff queue coalesced")
	}
}

// TestFedBuffVotes walks a robust FedBuff buffer (K = 3, three other live
// peers: a quorum of 3 votes) through a flooding peer: its models fill the
// buffer but are one vote (a non-finite one is dropped); the buffer waits
// for the votes of the two others and then steps by no more than theirs.
func TestFedBuffVotes(t *testing.T) {
	_, te := mnist(t)
	w := testWorker(t, te.Head(100), 1)
	cfg := DefaultAsyncConfig()
	cfg.Mode, cfg.BufferK, cfg.BufferRule = ModeFedBuff, 3, "median"
	p, err := newAsyncPeer(w, "self", cfg, nil, asyncOptions{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for _, id := range []string{"a", "b", "liar"} {
		p.vc.Observe(id, 0, now)
	}
	if got := bufferQuorum(p.liveOthers()); got != 3 {
		t.Fatalf("quorum %d, want 3", got)
	}
	before := slices.Clone(p.server)
	delta := func(from peerid.ID, v float32) *contribution { // the model before + v
		x := slices.Clone(before)
		for i := range x {
			x[i] += v
		}
		return &contribution{from: from, kind: wire.KindModel, vec: x}
	}
	for _, v := range []float32{100, 200, float32(math.NaN()), 400} {
		p.merge(delta("liar", v))
	}
	if got := p.drops[DropNonFinite].Load(); got != 1 {
		t.Fatalf("%d non-finite drops, want 1", got)
	}
	p.merge(delta("a", 0.1))
	if p.buffer.Len() != 4 || p.buffer.Voters() != 2 || p.flushes != 0 {
		t.Fatalf("buffer holds %d deltas from %d voters, %d flushes", p.buffer.Len(), p.buffer.Voters(), p.flushes)
	}
	p.merge(delta("b", 0.1))
	if p.flushes != 1 || p.buffer.Len() != 0 {
		t.Fatalf("after the quorum: %d flushes, buffer %d", p.flushes, p.buffer.Len())
	}
	for i, v := range p.server {
		if d := v - before[i]; d <= 0 || d > 0.1*float32(cfg.ServerLR)+1e-6 {
			t.Fatalf("server[%d] moved by %v; the honest votes say 0.1·η", i, d)
		}
	}
}

// TestRobustFedBuffCodecs: a robust FedBuff sends models, so its codec
// must be dense and without error feedback; an entropy stage on top is
// fine. (A check on the spec's text, looking for ",ef", let "fp16:ef"
// through.)
func TestRobustFedBuffCodecs(t *testing.T) {
	for spec, ok := range map[string]bool{
		"fp32": true, "fp16": true, "bf16": true, "int8:block=256": true, "fp16:entropy=zstd": true,
		"fp16:ef": false, "int8:block=256,ef": false, "topk:0.01": false, "topk:0.01,ef": false, "sign": false, "powersgd:4": false,
	} {
		cfg := DefaultAsyncConfig()
		cfg.Mode, cfg.Codec = ModeFedBuff, spec
		if err := cfg.Validate(); (err == nil) != ok {
			t.Errorf("%s: %v, want ok %v", spec, err, ok)
		}
		cfg.BufferRule = "mean" // deltas: any codec
		if err := cfg.Validate(); err != nil {
			t.Errorf("%s with the mean: %v", spec, err)
		}
	}
}
