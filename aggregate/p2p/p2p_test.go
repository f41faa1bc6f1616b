package p2p_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"

	"github.com/starling-ml/starling/aggregate"
	"github.com/starling-ml/starling/aggregate/aggtest"
	"github.com/starling-ml/starling/aggregate/p2p"
	"github.com/starling-ml/starling/aggregate/rule"
	"github.com/starling-ml/starling/device"
	"github.com/starling-ml/starling/node"
	"github.com/starling-ml/starling/peerid"
)

// newMocknet attaches n nodes to a fully connected mocknet whose links have
// the given latency and bandwidth (bytes/s, 0 for unlimited).
func newMocknet(t testing.TB, n int, latency time.Duration, bw float64) []*node.Node {
	t.Helper()
	return newMocknetConfig(t, n, latency, bw, node.TestConfig())
}

// newMocknetConfig is newMocknet with the nodes' configuration.
func newMocknetConfig(t testing.TB, n int, latency time.Duration, bw float64, cfg node.Config) []*node.Node {
	t.Helper()
	mn := mocknet.New()
	t.Cleanup(func() { mn.Close() })
	mn.SetLinkDefaults(mocknet.LinkOptions{Latency: latency, Bandwidth: bw})
	nodes := make([]*node.Node, n)
	for i := range nodes {
		h, err := mn.GenPeer()
		if err != nil {
			t.Fatal(err)
		}
		nodes[i], err = node.Attach(h, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nodes[i].Close() })
	}
	if err := mn.LinkAll(); err != nil {
		t.Fatal(err)
	}
	if err := mn.ConnectAllButSelf(); err != nil {
		t.Fatal(err)
	}
	return nodes
}

type peerSet struct {
	nodes   []*node.Node
	ids     []peerid.ID
	faulty  []*aggtest.Faulty
	runners []*aggregate.Runner
}

// debugOpts logs every runner's decisions to stderr when AGGDEBUG is set.
func debugOpts() []aggregate.Option {
	if os.Getenv("AGGDEBUG") == "" {
		return nil
	}
	return []aggregate.Option{aggregate.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})))}
}

func newPeers(t testing.TB, nodes []*node.Node, cfg aggregate.Config, hook aggtest.Hook) *peerSet {
	t.Helper()
	ps := &peerSet{nodes: nodes}
	for _, n := range nodes {
		id := p2p.ID(n.ID())
		tr := p2p.New(n)
		t.Cleanup(func() { tr.Close() })
		f := aggtest.NewFaulty(tr, id, hook, func() { tr.Close(); n.Close() })
		r, err := aggregate.NewRunner(id, f, cfg, debugOpts()...)
		if err != nil {
			t.Fatal(err)
		}
		ps.ids = append(ps.ids, id)
		ps.faulty = append(ps.faulty, f)
		ps.runners = append(ps.runners, r)
	}
	return ps
}

func randVecs(seed uint64, n, d int) ([][]float32, []float64) {
	rng := rand.New(rand.NewPCG(seed, seed))
	srcs := make([][]float32, n)
	w := make([]float64, n)
	for i := range srcs {
		srcs[i] = make([]float32, d)
		for k := range srcs[i] {
			srcs[i][k] = float32(rng.NormFloat64())
		}
		w[i] = float64(1 + rng.IntN(50))
	}
	return srcs, w
}

func expected(t testing.TB, rl rule.Rule, g aggregate.Group, ids []peerid.ID, srcs [][]float32, w []float64) []float32 {
	t.Helper()
	var in [][]float32
	var iw []float64
	for _, p := range g.Members() {
		i := slices.Index(ids, p)
		in = append(in, srcs[i])
		iw = append(iw, w[i])
	}
	out := make([]float32, len(srcs[0]))
	if err := rule.Reduce(rl, out, in, iw); err != nil {
		t.Fatal(err)
	}
	return out
}

func checkSame(t testing.TB, outs []aggtest.Outcome, idx []int, want []float32) {
	t.Helper()
	for _, i := range idx {
		if outs[i].Err != nil {
			t.Fatalf("peer %d: %v", i, outs[i].Err)
		}
		for k, v := range outs[i].Out {
			if math.Float32bits(v) != math.Float32bits(outs[idx[0]].Out[k]) {
				t.Fatalf("peer %d differs from peer %d at %d", i, idx[0], k)
			}
			if math.Abs(float64(v-want[k])) > 1e-5*(1+math.Abs(float64(want[k]))) {
				t.Fatalf("peer %d coord %d: %v, want %v", i, k, v, want[k])
			}
		}
	}
}

func TestAllReduceOnMocknet(t *testing.T) {
	nodes := newMocknet(t, 5, time.Millisecond, 0)
	for _, tc := range []struct {
		algo aggregate.Algorithm
		rule rule.Rule
	}{
		{aggregate.Tree, rule.Mean{}},
		{aggregate.Butterfly, rule.Mean{}},
		{aggregate.Butterfly, rule.Median{}},
		{aggregate.Butterfly, rule.Krum{F: 1, M: 2}},
		{aggregate.Ring, rule.Mean{}},
		{aggregate.Ring, rule.Sum{}},
	} {
		t.Run(fmt.Sprintf("%v/%v", tc.algo, tc.rule), func(t *testing.T) {
			cfg := aggregate.DefaultConfig()
			cfg.Algorithm, cfg.Rule, cfg.StallTimeout = tc.algo, tc.rule, 5*time.Second
			ps := newPeers(t, nodes, cfg, nil)
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			for round := uint64(1); round <= 3; round++ {
				g, _ := aggregate.Form(round, ps.ids)
				srcs, w := randVecs(round, 5, 50_000)
				outs := aggtest.RunRound(ctx, ps.runners, g, srcs, w)
				checkSame(t, outs, []int{0, 1, 2, 3, 4}, expected(t, tc.rule, g, ps.ids, srcs, w))
				if outs[0].Result.Attempts != 1 {
					t.Fatalf("round %d: %+v", round, outs[0].Result)
				}
			}
		})
	}
}

// forwarding counts the ring's receives that were summed on arrival and
// its sends that reused the checksums made on arrival.
type forwarding struct {
	*p2p.Transport
	summed, reused atomic.Int64
}

func (f *forwarding) RecvAxpy(ctx context.Context, from peerid.ID, tag aggregate.Tag, dst []float32, alpha float32, x []float32) (aggregate.Received, error) {
	r, err := f.Transport.RecvAxpy(ctx, from, tag, dst, alpha, x)
	if r.Summed {
		f.summed.Add(1)
	}
	return r, err
}

func (f *forwarding) SendReceived(ctx context.Context, to peerid.ID, tag aggregate.Tag, data []float32, sums aggregate.Checksums) error {
	f.reused.Add(1)
	return f.Transport.SendReceived(ctx, to, tag, data, sums)
}

// TestRingForwardsChecksums: over node's checksummed frames (mocknet has
// no security), the ring sums partial sums on arrival and sends chunks on
// with the checksums node made as they arrived, striped, and the result is
// the same on every peer and right: a checksum of anything but the bytes
// sent would fail the round. With a mean, the completed sums are divided
// before they go on, and their checksums made anew.
func TestRingForwardsChecksums(t *testing.T) {
	ncfg := node.TestConfig()
	ncfg.MinStripeBytes = 32 << 10 // chunks of 96 KiB go as 3 stripes
	nodes := newMocknetConfig(t, 4, 0, 0, ncfg)
	for _, rl := range []rule.Rule{rule.Sum{}, rule.Mean{}} {
		t.Run(fmt.Sprint(rl), func(t *testing.T) {
			cfg := aggregate.DefaultConfig()
			cfg.Algorithm, cfg.Rule, cfg.StallTimeout, cfg.ChunkElems = aggregate.Ring, rl, 5*time.Second, 1<<16
			var ids []peerid.ID
			var runners []*aggregate.Runner
			var fwd []*forwarding
			for _, n := range nodes {
				f := &forwarding{Transport: p2p.New(n)}
				t.Cleanup(func() { f.Close() })
				r, err := aggregate.NewRunner(p2p.ID(n.ID()), f, cfg, debugOpts()...)
				if err != nil {
					t.Fatal(err)
				}
				ids, runners, fwd = append(ids, p2p.ID(n.ID())), append(runners, r), append(fwd, f)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			g, _ := aggregate.Form(1, ids)
			srcs, w := randVecs(7, 4, 4*3<<16)
			outs := aggtest.RunRound(ctx, runners, g, srcs, w)
			checkSame(t, outs, []int{0, 1, 2, 3}, expected(t, rl, g, ids, srcs, w))
			if outs[0].Result.Attempts != 1 {
				t.Fatalf("%+v", outs[0].Result)
			}
			const m = 8 // chunks per segment: 3<<16 values in 8 (chunkElems)
			for i, f := range fwd {
				// Each rank receives partial sums in 3 reduce-scatter
				// steps and sends on those of 2 (if summed on arrival),
				// then its completed segment (if summed, and not divided
				// for a mean), then the chunks of 2 of its 3 all-gather
				// steps.
				want := int64(2 * m)
				if device.AxpyToRuns(device.Default()) {
					if got := f.summed.Load(); got != 3*m {
						t.Fatalf("rank %d: %d chunks summed on arrival, want %d", i, got, 3*m)
					}
					want += 2 * m
					if _, sum := rl.(rule.Sum); sum {
						want += m
					}
				}
				if got := f.reused.Load(); got != want {
					t.Fatalf("rank %d: %d chunks sent on with their checksums, want %d", i, got, want)
				}
			}
		})
	}
}

// TestFailuresOnMocknet injects failures at the protocol points of
// aggregate's in-memory tests, over real node/ streams: the killed peer's
// node is closed (its connections reset), a stalled one stops sending.
func TestFailuresOnMocknet(t *testing.T) {
	t.Parallel()
	const stall = 2 * time.Second // real time, on a machine that may be busy
	cases := []struct {
		name   string
		algo   aggregate.Algorithm
		victim int // rank
		hook   func(peerid.ID) aggtest.Hook
		bad    func(srcs [][]float32, v int)
		want   error
	}{
		{name: "butterfly/kill/before-sending", algo: aggregate.Butterfly, victim: 2,
			hook: func(v peerid.ID) aggtest.Hook { return aggtest.KillAt(v, aggregate.StepScatter, 1) }, want: aggregate.ErrStall},
		{name: "butterfly/kill/while-reducing", algo: aggregate.Butterfly, victim: 3,
			hook: func(v peerid.ID) aggtest.Hook { return aggtest.KillAt(v, aggregate.StepGather, 1) }, want: aggregate.ErrStall},
		{name: "butterfly/stall/while-reducing", algo: aggregate.Butterfly, victim: 1,
			hook: func(v peerid.ID) aggtest.Hook { return aggtest.StallAt(v, aggregate.StepGather, 1) }, want: aggregate.ErrStall},
		{name: "tree/kill/inner-while-reducing", algo: aggregate.Tree, victim: 1,
			hook: func(v peerid.ID) aggtest.Hook { return aggtest.KillAt(v, aggregate.StepUp, 3) }, want: aggregate.ErrStall},
		{name: "tree/stall/root-before-broadcast", algo: aggregate.Tree, victim: 0,
			hook: func(v peerid.ID) aggtest.Hook { return aggtest.StallAt(v, aggregate.StepDown, 1) }, want: aggregate.ErrStall},
		{name: "butterfly/bad/NaN", algo: aggregate.Butterfly, victim: 4,
			hook: func(v peerid.ID) aggtest.Hook {
				return aggtest.Corrupt(v, aggregate.StepScatter, 1, func(x []float32) { x[0] = float32(math.NaN()) })
			}, want: aggregate.ErrBadValue},
		// Ring, 20,000 values in chunks of 4096: 4,000-value segments, one
		// chunk each; a peer sends 8 ring chunks, 0 its own segment, 1–3
		// partial sums, 4–7 final values.
		{name: "ring/kill/mid-reduce", algo: aggregate.Ring, victim: 1,
			hook: func(v peerid.ID) aggtest.Hook { return aggtest.KillAt(v, aggregate.StepRing, 3) }, want: aggregate.ErrStall},
		{name: "ring/stall/mid-gather", algo: aggregate.Ring, victim: 3,
			hook: func(v peerid.ID) aggtest.Hook { return aggtest.StallAt(v, aggregate.StepRing, 6) }, want: aggregate.ErrStall},
		{name: "ring/bad/Inf", algo: aggregate.Ring, victim: 0,
			hook: func(v peerid.ID) aggtest.Hook {
				return aggtest.Corrupt(v, aggregate.StepRing, 2, func(x []float32) { x[9] = float32(math.Inf(1)) })
			}, want: aggregate.ErrBadValue},
		// A final value is checked by node/ in the checksum's pass
		// (aggregate.FiniteReceiver), a partial sum by the ring's axpy.
		{name: "ring/bad/NaN-final", algo: aggregate.Ring, victim: 2,
			hook: func(v peerid.ID) aggtest.Hook {
				return aggtest.Corrupt(v, aggregate.StepRing, 5, func(x []float32) { x[100] = float32(math.NaN()) })
			}, want: aggregate.ErrBadValue},
		{name: "butterfly/bad/length", algo: aggregate.Butterfly, victim: 2,
			bad: func(srcs [][]float32, v int) { srcs[v] = srcs[v][:len(srcs[v])-1] }, want: aggregate.ErrBadLength},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // mostly waiting out timeouts
			nodes := newMocknet(t, 5, time.Millisecond, 0)
			ids := make([]peerid.ID, len(nodes))
			for i, n := range nodes {
				ids[i] = p2p.ID(n.ID())
			}
			g, _ := aggregate.Form(9, ids)
			vid := g.Member(tc.victim)
			v := slices.Index(ids, vid)
			var hook aggtest.Hook
			if tc.hook != nil {
				hook = tc.hook(vid)
			}
			cfg := aggregate.DefaultConfig()
			cfg.Algorithm, cfg.StallTimeout, cfg.ChunkElems = tc.algo, stall, 4096
			ps := newPeers(t, nodes, cfg, hook)
			srcs, w := randVecs(7, 5, 20_000)
			clean := make([][]float32, len(srcs))
			for i := range srcs {
				clean[i] = slices.Clone(srcs[i])
			}
			if tc.bad != nil {
				tc.bad(srcs, v)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 60*stall)
			defer cancel()
			var wg sync.WaitGroup
			outs := make([]aggtest.Outcome, 5)
			start := time.Now()
			for i, r := range ps.runners {
				outs[i].Out = make([]float32, len(srcs[i]))
				wg.Go(func() {
					outs[i].Result, outs[i].Err = r.AllReduce(ctx, g, outs[i].Out, srcs[i], w[i])
					outs[i].Elapsed = time.Since(start)
					if i == v {
						ps.faulty[i].Resume() // a frozen victim thaws once it has given up
					}
				})
			}
			wg.Wait()
			var surv []int
			var slowest time.Duration
			for i := range 5 {
				if i == v {
					continue
				}
				surv = append(surv, i)
				res := outs[i].Result
				if outs[i].Err != nil {
					t.Fatalf("survivor %d: %v", i, outs[i].Err)
				}
				if res.Group.Rank(vid) >= 0 || len(res.Excluded) != 1 || res.Excluded[0].Peer != vid || !errors.Is(res.Excluded[0], tc.want) {
					t.Fatalf("survivor %d: %+v, want %s excluded for %v", i, res, vid, tc.want)
				}
				slowest = max(slowest, outs[i].Elapsed)
			}
			checkSame(t, outs, surv, expected(t, rule.Mean{}, outs[surv[0]].Result.Group, ids, clean, w))
			if outs[v].Err == nil {
				t.Errorf("victim succeeded")
			}
			t.Logf("survivors done in %v (stall timeout %v); victim: %v", slowest, stall, outs[v].Err)
		})
	}
}

// BenchmarkMocknetAllReduce measures a butterfly all-reduce over node/
// streams on an unlimited mocknet in this process: the cost of framing,
// checksums and yamux-free in-memory pipes, not a network figure.
func BenchmarkMocknetAllReduce(b *testing.B) {
	for _, n := range []int{4} {
		for _, size := range []int{4 << 10, 4 << 20, 64 << 20} {
			for _, algo := range []aggregate.Algorithm{aggregate.Tree, aggregate.Butterfly} {
				b.Run(fmt.Sprintf("%v/n=%d/bytes=%d", algo, n, size), func(b *testing.B) {
					nodes := newMocknet(b, n, 0, 0)
					cfg := aggregate.DefaultConfig()
					cfg.Algorithm = algo
					ps := newPeers(b, nodes, cfg, nil)
					srcs, w := randVecs(1, n, size/4)
					b.SetBytes(int64(size))
					round := uint64(0)
					start := time.Now()
					var outs []aggtest.Outcome
					for b.Loop() {
						round++
						g, _ := aggregate.Form(round, ps.ids)
						outs = aggtest.RunRound(context.Background(), ps.runners, g, srcs, w)
					}
					el := time.Since(start) / time.Duration(round)
					for _, o := range outs {
						if o.Err != nil {
							b.Fatal(o.Err)
						}
					}
					algbw := float64(size) / el.Seconds()
					b.ReportMetric(el.Seconds()*1e6, "µs/allreduce")
					b.ReportMetric(algbw/1e6, "algbw_MB/s")
					b.ReportMetric(algbw*2*float64(n-1)/float64(n)/1e6, "busbw_MB/s")
				})
			}
		}
	}
}

// BenchmarkLoopbackAllReduce runs the all-reduce between real libp2p hosts
// (TCP on 127.0.0.1, TLS/Noise, yamux) in this process: the figure the
// issue's loopback targets compare with Gloo (4 ranks; 4 KB for latency,
// 64 MB for bus bandwidth). Ranks share this machine's cores.
func BenchmarkLoopbackAllReduce(b *testing.B) {
	const n = 4
	ctx := context.Background()
	nodes := make([]*node.Node, n)
	for i := range nodes {
		var err error
		if nodes[i], err = node.New(ctx, node.TestConfig()); err != nil {
			b.Fatal(err)
		}
		defer nodes[i].Close()
		for _, m := range nodes[:i] {
			if err := nodes[i].Connect(ctx, m.AddrInfo()); err != nil {
				b.Fatal(err)
			}
		}
	}
	for _, size := range []int{4 << 10, 64 << 20} {
		for _, algo := range []aggregate.Algorithm{aggregate.Tree, aggregate.Butterfly} {
			b.Run(fmt.Sprintf("%v/n=%d/bytes=%d", algo, n, size), func(b *testing.B) {
				cfg := aggregate.DefaultConfig()
				cfg.Algorithm = algo
				ps := newPeers(b, nodes, cfg, nil)
				srcs, w := randVecs(1, n, size/4)
				b.SetBytes(int64(size))
				round := uint64(0)
				var outs []aggtest.Outcome
				start := time.Now()
				for b.Loop() {
					round++
					g, _ := aggregate.Form(round, ps.ids)
					outs = aggtest.RunRound(ctx, ps.runners, g, srcs, w)
				}
				el := time.Since(start) / time.Duration(round)
				for _, o := range outs {
					if o.Err != nil {
						b.Fatal(o.Err)
					}
				}
				algbw := float64(size) / el.Seconds()
				b.ReportMetric(el.Seconds()*1e6, "µs/allreduce")
				b.ReportMetric(algbw/1e6, "algbw_MB/s")
				b.ReportMetric(algbw*2*float64(n-1)/float64(n)/1e6, "busbw_MB/s")
			})
		}
	}
}

// TestID: ID is the peer's base58 form, kept or not.
func TestID(t *testing.T) {
	for _, n := range newMocknet(t, 2, 0, 0) {
		want := peerid.ID(n.ID().String())
		if got, again := p2p.ID(n.ID()), p2p.ID(n.ID()); got != want || again != want {
			t.Fatalf("ID = %q, then %q; want %q", got, again, want)
		}
	}
}
