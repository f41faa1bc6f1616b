package aggregate_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/starling-ml/starling/aggregate"
	"github.com/starling-ml/starling/aggregate/aggtest"
	"github.com/starling-ml/starling/aggregate/rule"
	"github.com/starling-ml/starling/compression"
	"github.com/starling-ml/starling/peerid"
)

// swarm is n runners on one aggtest network.
type swarm struct {
	net     *aggtest.Network
	ids     []peerid.ID
	runners []*aggregate.Runner
}

func newSwarm(t testing.TB, n int, netCfg aggtest.Config, cfg aggregate.Config) *swarm {
	t.Helper()
	s := &swarm{net: aggtest.NewNetwork(netCfg)}
	for i := range n {
		id := peerid.ID(fmt.Sprintf("peer-%02d", i))
		r, err := aggregate.NewRunner(id, s.net.Join(id), cfg)
		if err != nil {
			t.Fatal(err)
		}
		s.ids = append(s.ids, id)
		s.runners = append(s.runners, r)
	}
	return s
}

func (s *swarm) group(t testing.TB, round uint64) aggregate.Group {
	t.Helper()
	g, err := aggregate.Form(round, s.ids)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func randVecs(rng *rand.Rand, n, d int) ([][]float32, []float64) {
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

// expected is the rule applied to the contributions of g's members, in
// rank order.
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

// checkSame fails unless every outcome in idx succeeded with the same bits,
// and those bits match want (exactly, or to a relative 1e-5).
func checkSame(t testing.TB, outs []aggtest.Outcome, idx []int, want []float32, exact bool) {
	t.Helper()
	first := outs[idx[0]]
	for _, i := range idx {
		o := outs[i]
		if o.Err != nil {
			t.Fatalf("peer %d: %v", i, o.Err)
		}
		if !slices.Equal(math32bits(o.Out), math32bits(first.Out)) {
			t.Fatalf("peer %d's result differs from peer %d's", i, idx[0])
		}
	}
	for k, v := range first.Out {
		if exact && v != want[k] || math.Abs(float64(v-want[k])) > 1e-5*(1+math.Abs(float64(want[k]))) {
			t.Fatalf("coord %d: got %v, want %v", k, v, want[k])
		}
	}
}

func math32bits(x []float32) []uint32 {
	b := make([]uint32, len(x))
	for i, v := range x {
		b[i] = math.Float32bits(v)
	}
	return b
}

func all(n int) []int {
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	return idx
}

func TestAllReduceMatchesReduce(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	rules := []rule.Rule{rule.Sum{}, rule.Mean{}, rule.Median{}, rule.Trimmed{Beta: 0.25},
		rule.Krum{F: 1, M: 2}, rule.CClip{Tau: 1, Iters: 2}}
	for _, algo := range []aggregate.Algorithm{aggregate.Tree, aggregate.Butterfly, aggregate.Ring} {
		for _, rl := range rules {
			if algo != aggregate.Butterfly && !rl.Linear() {
				continue
			}
			for _, n := range []int{1, 2, 3, 4, 5, 7, 8} {
				if n < rl.MinInputs() {
					continue
				}
				for _, d := range []int{0, 1, 5, 333} {
					name := fmt.Sprintf("%v/%v/n=%d/d=%d", algo, rl, n, d)
					cfg := aggregate.DefaultConfig()
					cfg.Rule, cfg.Algorithm, cfg.ChunkElems = rl, algo, 1+rng.IntN(40)
					s := newSwarm(t, n, aggtest.Config{}, cfg)
					g := s.group(t, uint64(rng.Uint32()))
					srcs, w := randVecs(rng, n, d)
					outs := aggtest.RunRound(t.Context(), s.runners, g, srcs, w)
					t.Run(name, func(t *testing.T) {
						for i, o := range outs {
							if o.Err != nil {
								t.Fatalf("peer %d: %v", i, o.Err)
							}
							if o.Result.Attempts != 1 || o.Result.Algorithm != algo || o.Result.Group.Digest() != g.Digest() || len(o.Result.Excluded) != 0 {
								t.Fatalf("peer %d: result %+v", i, o.Result)
							}
						}
						if d == 0 {
							return
						}
						// Local rules on the butterfly compute each chunk
						// exactly as Reduce does; trees sum in another order
						// and Krum/CClip sum statistics shard by shard.
						exact := algo == aggregate.Butterfly && (rl.Local())
						checkSame(t, outs, all(n), expected(t, rl, g, s.ids, srcs, w), exact)
						var tot float64
						for _, x := range w {
							tot += x
						}
						if got := outs[0].Result.Weight; math.Abs(got-tot) > 1e-9*tot {
							t.Fatalf("Result.Weight %v, want %v", got, tot)
						}
					})
				}
			}
		}
	}
}

// TestAllReduceTraffic checks the bytes each peer puts on its link: the
// butterfly and the ring send 2(n−1)/n of the vector plus headers and votes.
func TestAllReduceTraffic(t *testing.T) {
	const d = 10000
	for _, algo := range []aggregate.Algorithm{aggregate.Butterfly, aggregate.Ring} {
		for _, n := range []int{2, 3, 4, 7} {
			cfg := aggregate.DefaultConfig()
			cfg.Algorithm = algo
			cfg.ChunkElems = 512
			s := newSwarm(t, n, aggtest.Config{}, cfg)
			srcs, w := randVecs(rand.New(rand.NewPCG(1, uint64(n))), n, d)
			outs := aggtest.RunRound(t.Context(), s.runners, s.group(t, 1), srcs, w)
			for i, o := range outs {
				if o.Err != nil {
					t.Fatal(o.Err)
				}
				bytes, _ := s.net.Sent(s.ids[i])
				g := outs[i].Result.Group
				r := g.Rank(s.ids[i])
				seg := func(k int) int { return d*(k+1)/n - d*k/n } // size of segment k
				var data int
				switch algo {
				case aggregate.Butterfly:
					// All shards but our own, out and back.
					_, own := shardSize(d, n, s.runners[i], g, s.ids[i])
					data = 4 * ((d - own) + (n-1)*own)
				case aggregate.Ring:
					// Every segment twice, but for the one we finish (r+1)
					// and the one we receive last (r+2).
					data = 4 * (2*d - seg((r+1)%n) - seg((r+2)%n))
				}
				// Control: a header to every other peer, a vote per peer.
				ctl := 4 * (n - 1) * (8 + 8 + n)
				if int(bytes) != data+ctl {
					t.Errorf("%v n=%d peer %d sent %d bytes, want %d data + %d control", algo, n, i, bytes, data, ctl)
				}
				if ideal := 4 * 2 * float64(d) * float64(n-1) / float64(n); math.Abs(float64(data)-ideal) > 8*float64(n) {
					t.Errorf("%v n=%d: data bytes %d, 2(n−1)/n·4d = %v", algo, n, data, ideal)
				}
			}
		}
	}
}

// shardSize returns the size of the shard peer id owns.
func shardSize(d, n int, _ *aggregate.Runner, g aggregate.Group, id peerid.ID) (int, int) {
	j := g.Rank(id)
	off := d * j / n
	return off, d*(j+1)/n - off
}

func TestAutoPicksBySize(t *testing.T) {
	cfg := aggregate.DefaultConfig()
	cfg.TreeMaxBytes = 4 * 100
	for _, tc := range []struct {
		rule rule.Rule
		d    int
		want aggregate.Algorithm
	}{
		{rule.Mean{}, 100, aggregate.Tree},
		{rule.Mean{}, 101, aggregate.Ring},
		{rule.Sum{}, 3, aggregate.Tree},
		{rule.Median{}, 3, aggregate.Butterfly},
	} {
		cfg.Rule = tc.rule
		s := newSwarm(t, 3, aggtest.Config{}, cfg)
		srcs, w := randVecs(rand.New(rand.NewPCG(1, 2)), 3, tc.d)
		outs := aggtest.RunRound(t.Context(), s.runners, s.group(t, 5), srcs, w)
		if outs[0].Err != nil || outs[0].Result.Algorithm != tc.want {
			t.Errorf("%v d=%d: %v %v, want %v", tc.rule, tc.d, outs[0].Result.Algorithm, outs[0].Err, tc.want)
		}
	}
}

func TestConsecutiveRoundsAndInPlace(t *testing.T) {
	for _, algo := range []aggregate.Algorithm{aggregate.Tree, aggregate.Butterfly, aggregate.Ring} {
		cfg := aggregate.DefaultConfig()
		cfg.Algorithm, cfg.ChunkElems = algo, 16
		s := newSwarm(t, 5, aggtest.Config{}, cfg)
		rng := rand.New(rand.NewPCG(5, 5))
		for round := uint64(1); round <= 5; round++ {
			srcs, w := randVecs(rng, 5, 100)
			g := s.group(t, round)
			want := expected(t, rule.Mean{}, g, s.ids, srcs, w)
			// In place: dst is src.
			errs := make(chan error, 5)
			for i, r := range s.runners {
				go func() {
					_, err := r.AllReduce(t.Context(), g, srcs[i], srcs[i], w[i])
					errs <- err
				}()
			}
			for range 5 {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			outs := make([]aggtest.Outcome, 5)
			for i := range outs {
				outs[i].Out = srcs[i]
			}
			checkSame(t, outs, all(5), want, algo == aggregate.Butterfly)
		}
		for _, id := range s.ids {
			if p := s.net.Join(id).Pending(); p != 0 {
				t.Errorf("%v: %s holds %d undelivered chunks after the rounds", algo, id, p)
			}
		}
	}
}

func TestGroupWideFaults(t *testing.T) {
	for _, algo := range []aggregate.Algorithm{aggregate.Tree, aggregate.Butterfly, aggregate.Ring} {
		cfg := aggregate.DefaultConfig()
		cfg.Algorithm = algo
		// Zero total weight.
		s := newSwarm(t, 4, aggtest.Config{}, cfg)
		srcs, _ := randVecs(rand.New(rand.NewPCG(1, 2)), 4, 10)
		for i, o := range aggtest.RunRound(t.Context(), s.runners, s.group(t, 1), srcs, []float64{0, 0, 0, 0}) {
			if !errors.Is(o.Err, aggregate.ErrZeroWeight) {
				t.Errorf("%v zero weights: peer %d: %v", algo, i, o.Err)
			}
		}
		// Overflow of a sum of finite values.
		cfg.Rule = rule.Sum{}
		s = newSwarm(t, 4, aggtest.Config{}, cfg)
		for i := range srcs {
			srcs[i][3] = 3e38
		}
		for i, o := range aggtest.RunRound(t.Context(), s.runners, s.group(t, 1), srcs, nil) {
			if !errors.Is(o.Err, aggregate.ErrOverflow) {
				t.Errorf("%v overflow: peer %d: %v", algo, i, o.Err)
			}
		}
		if algo == aggregate.Butterfly {
			continue // it weighs by w/Σw: no product can overflow
		}
		// A weight so large that w·x overflows where the tree and the ring
		// weigh contributions: a group fault, not the heavy peer's. Only
		// the value 1e3 overflows (1e39), the others (|x| < 10) do not; it
		// is in the heavy peer's own ring segment (rank r's is values 250r
		// to 250r+249), which the ring scales before it sends it.
		cfg.Rule = rule.Mean{}
		s = newSwarm(t, 4, aggtest.Config{}, cfg)
		srcs, _ = randVecs(rand.New(rand.NewPCG(3, 4)), 4, 1000)
		g := s.group(t, 1)
		srcs[2][250*g.Rank(s.ids[2])+100] = 1e3
		for i, o := range aggtest.RunRound(t.Context(), s.runners, g, srcs, []float64{1, 1, 1e36, 1}) {
			if !errors.Is(o.Err, aggregate.ErrOverflow) {
				t.Errorf("%v overflowing weight: peer %d: %v", algo, i, o.Err)
			}
		}
		// Weights so small that float32 rounds them up (1e-45 to
		// 1.4e-45): the weighted sum 4·1.4e-45·3e38 is finite, its
		// division by the total weight 4e-45 is not.
		srcs, _ = randVecs(rand.New(rand.NewPCG(5, 6)), 4, 10)
		for i := range srcs {
			srcs[i][3] = 3e38
		}
		for i, o := range aggtest.RunRound(t.Context(), s.runners, s.group(t, 2), srcs, []float64{1e-45, 1e-45, 1e-45, 1e-45}) {
			if !errors.Is(o.Err, aggregate.ErrOverflow) {
				t.Errorf("%v overflowing division: peer %d: %v", algo, i, o.Err)
			}
		}
	}
}

func TestAllReduceArgs(t *testing.T) {
	s := newSwarm(t, 2, aggtest.Config{}, aggregate.DefaultConfig())
	g := s.group(t, 1)
	r := s.runners[0]
	ctx := t.Context()
	if _, err := r.AllReduce(ctx, g, make([]float32, 2), make([]float32, 3), 1); !errors.Is(err, aggregate.ErrBadInput) {
		t.Errorf("length mismatch: %v", err)
	}
	if _, err := r.AllReduce(ctx, g, make([]float32, 2), make([]float32, 2), -1); !errors.Is(err, aggregate.ErrBadInput) {
		t.Errorf("negative weight: %v", err)
	}
	other, _ := aggregate.Form(1, []peerid.ID{"x", "y"})
	_, err := r.AllReduce(ctx, other, make([]float32, 2), make([]float32, 2), 1)
	var pe *aggregate.PeerError
	if !errors.Is(err, aggregate.ErrNotMember) || !errors.As(err, &pe) || pe.Peer != s.ids[0] {
		t.Errorf("not a member: %v", err)
	}
	// Krum f=1 needs 5 peers: 4 run the Krum they allow (f=0, rule.Fit);
	// 2 are too few for any Krum.
	cfg := aggregate.DefaultConfig()
	cfg.Rule = rule.Krum{F: 1, M: 1}
	s = newSwarm(t, 4, aggtest.Config{}, cfg)
	srcs, w := randVecs(rand.New(rand.NewPCG(1, 2)), 4, 10)
	g4 := s.group(t, 1)
	outs := aggtest.RunRound(ctx, s.runners, g4, srcs, w)
	checkSame(t, outs, []int{0, 1, 2, 3}, expected(t, rule.Krum{F: 0, M: 1}, g4, s.ids, srcs, w), true)
	s = newSwarm(t, 2, aggtest.Config{}, cfg)
	srcs, w = randVecs(rand.New(rand.NewPCG(1, 2)), 2, 10)
	for _, o := range aggtest.RunRound(ctx, s.runners, s.group(t, 1), srcs, w) {
		if !errors.Is(o.Err, aggregate.ErrTooFewInputs) {
			t.Errorf("krum f=1 with 2 peers: %v", o.Err)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	if err := aggregate.DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	mods := map[string]func(*aggregate.Config){
		"nil rule":       func(c *aggregate.Config) { c.Rule = nil },
		"tree median":    func(c *aggregate.Config) { c.Algorithm, c.Rule = aggregate.Tree, rule.Median{} },
		"ring krum":      func(c *aggregate.Config) { c.Algorithm, c.Rule = aggregate.Ring, rule.Krum{F: 1, M: 1} },
		"ring fp16":      func(c *aggregate.Config) { c.Algorithm, c.Compress = aggregate.Ring, compression.MustSpec("fp16") },
		"algo":           func(c *aggregate.Config) { c.Algorithm = 9 },
		"chunk":          func(c *aggregate.Config) { c.ChunkElems = 0 },
		"stall":          func(c *aggregate.Config) { c.StallTimeout = 0 },
		"attempts":       func(c *aggregate.Config) { c.MaxAttempts = 0 },
		"quorum":         func(c *aggregate.Config) { c.Quorum = 1 },
		"tree bytes":     func(c *aggregate.Config) { c.TreeMaxBytes = -1 },
		"bad rule value": func(c *aggregate.Config) { c.Rule = rule.Trimmed{Beta: 0.7} },
	}
	for name, mod := range mods {
		c := aggregate.DefaultConfig()
		mod(&c)
		before := c
		if err := c.Validate(); !errors.Is(err, aggregate.ErrInvalidConfig) {
			t.Errorf("%s: %v", name, err)
		}
		if fmt.Sprint(before) != fmt.Sprint(c) {
			t.Errorf("%s: Validate changed the config", name)
		}
	}
	if _, err := aggregate.ParseAlgorithm("hypercube"); err == nil {
		t.Error("ParseAlgorithm(hypercube) succeeded")
	}
	for _, a := range []aggregate.Algorithm{aggregate.Auto, aggregate.Tree, aggregate.Butterfly, aggregate.Ring} {
		if got, err := aggregate.ParseAlgorithm(a.String()); err != nil || got != a {
			t.Errorf("ParseAlgorithm(%q) = %v, %v", a, got, err)
		}
	}
}

var largeThroughput = flag.Bool("aggregate.large", false, "also run TestPipelinedThroughput at 64 MB (slow under -race)")

// TestPipelinedThroughput runs all-reduces on 1 Gbit/s links (200 µs
// latency, 64 bytes of framing per chunk) in virtual time, so the figure is
// the algorithm's and the pipelining's, not this machine's CPU: a well
// pipelined butterfly reaches close to the link rate in bus bandwidth
// (nccl-tests convention: busbw = algbw · 2(n−1)/n). Small vectors pay the
// pipeline's fill and drain (a few chunks and latencies) on top.
func TestPipelinedThroughput(t *testing.T) {
	const linkRate = 125e6 // bytes/s
	type tcase struct {
		algo aggregate.Algorithm
		n    int
		mb   int
		min  float64 // busbw as a fraction of the link rate
	}
	cases := []tcase{
		{aggregate.Butterfly, 4, 2, 0.93},
		{aggregate.Butterfly, 8, 2, 0.85},
		{aggregate.Ring, 4, 2, 0.93},
		{aggregate.Ring, 8, 2, 0.93},
		// A tree's inner node receives two vectors and sends three: algbw
		// cannot pass link/2, busbw link·(n−1)/n.
		{aggregate.Tree, 4, 1, 0.5},
	}
	if *largeThroughput {
		cases = append(cases, tcase{aggregate.Butterfly, 4, 64, 0.96}, tcase{aggregate.Butterfly, 5, 64, 0.96},
			tcase{aggregate.Butterfly, 8, 64, 0.94}, tcase{aggregate.Ring, 4, 64, 0.98}, tcase{aggregate.Ring, 5, 64, 0.98},
			tcase{aggregate.Ring, 8, 64, 0.98}, tcase{aggregate.Tree, 4, 64, 0.6})
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%v/n=%d/%dMB", tc.algo, tc.n, tc.mb), func(t *testing.T) {
			synctestRun(t, func(t *testing.T) {
				cfg := aggregate.DefaultConfig()
				cfg.Algorithm = tc.algo
				s := newSwarm(t, tc.n, aggtest.Config{Latency: 200 * time.Microsecond, Bandwidth: linkRate, Overhead: 64}, cfg)
				d := tc.mb << 20 / 4
				srcs, w := randVecs(rand.New(rand.NewPCG(1, 1)), tc.n, d)
				start := time.Now()
				outs := aggtest.RunRound(t.Context(), s.runners, s.group(t, 1), srcs, w)
				el := time.Since(start)
				for _, o := range outs {
					if o.Err != nil {
						t.Fatal(o.Err)
					}
				}
				algbw := float64(4*d) / el.Seconds()
				busbw := algbw * 2 * float64(tc.n-1) / float64(tc.n)
				t.Logf("%v n=%d %d MB: %v virtual, algbw %.1f MB/s, busbw %.1f MB/s (%.3f of link)",
					tc.algo, tc.n, tc.mb, el, algbw/1e6, busbw/1e6, busbw/linkRate)
				if busbw < tc.min*linkRate {
					t.Errorf("busbw %.1f MB/s < %.2f × link rate", busbw/1e6, tc.min)
				}
			})
		})
	}
}

// BenchmarkAllReduce measures the in-process all-reduce over the ideal
// aggtest network (no latency, no bandwidth limit): the cost of the driver
// itself, copies included. Not a network figure.
func BenchmarkAllReduce(b *testing.B) {
	for _, c := range []struct {
		algo aggregate.Algorithm
		rule rule.Rule
	}{{aggregate.Tree, rule.Mean{}}, {aggregate.Butterfly, rule.Mean{}}, {aggregate.Butterfly, rule.Median{}}} {
		algo, rl, name := c.algo, c.rule, c.algo.String()
		if _, ok := rl.(rule.Mean); !ok {
			name += "/" + rl.String()
		}
		for _, n := range []int{4, 8} {
			for _, size := range []int{4 << 10, 1 << 20, 16 << 20} {
				if algo == aggregate.Tree && size > 1<<20 && n > 4 {
					continue
				}
				b.Run(fmt.Sprintf("%s/n=%d/bytes=%d", name, n, size), func(b *testing.B) {
					cfg := aggregate.DefaultConfig()
					cfg.Algorithm, cfg.Rule = algo, rl
					s := newSwarm(b, n, aggtest.Config{}, cfg)
					d := size / 4
					srcs, w := randVecs(rand.New(rand.NewPCG(1, 1)), n, d)
					want := expected(b, rl, s.group(b, 0), s.ids, srcs, w)
					b.SetBytes(int64(size))
					b.ReportAllocs()
					var outs []aggtest.Outcome
					round := uint64(0)
					start := time.Now()
					for b.Loop() {
						outs = aggtest.RunRound(context.Background(), s.runners, s.group(b, round), srcs, w)
						round++
					}
					el := time.Since(start) / time.Duration(round)
					algbw := float64(size) / el.Seconds()
					b.ReportMetric(algbw/1e6, "algbw_MB/s")
					b.ReportMetric(algbw*2*float64(n-1)/float64(n)/1e6, "busbw_MB/s")
					// Check the last round's result (its group differs from
					// round 0's only in order, which Mean does not see up to
					// rounding).
					checkSame(b, outs, all(n), want, false)
				})
			}
		}
	}
}

// TestAlone: a group of one returns its own vector, bit for bit, under
// every rule that accepts one contribution and on both algorithms.
func TestAlone(t *testing.T) {
	for _, algo := range []aggregate.Algorithm{aggregate.Tree, aggregate.Butterfly} {
		for _, rule := range []rule.Rule{rule.Sum{}, rule.Mean{}, rule.Median{}, rule.Trimmed{Beta: 0.3}, rule.CClip{Tau: 0.1, Iters: 2}} {
			if algo == aggregate.Tree && !rule.Linear() {
				continue
			}
			cfg := aggregate.DefaultConfig()
			cfg.Rule, cfg.Algorithm, cfg.ChunkElems = rule, algo, 7
			s := newSwarm(t, 1, aggtest.Config{}, cfg)
			srcs, _ := randVecs(rand.New(rand.NewPCG(4, 4)), 1, 100)
			outs := aggtest.RunRound(t.Context(), s.runners, s.group(t, 1), srcs, []float64{3})
			if outs[0].Err != nil || !slices.Equal(math32bits(outs[0].Out), math32bits(srcs[0])) || outs[0].Result.Weight != 3 {
				t.Errorf("%v %v: %v, result %+v", algo, rule, outs[0].Err, outs[0].Result)
			}
		}
	}
}

// TestSmallVectorLatency counts one-way latencies in virtual time (4 KB, 4
// peers, 1 ms links, 1 Gbit/s): the tree costs its 2·height hops plus the
// vote, the butterfly two hops plus the vote. Per-message costs, which the
// tree has fewer of (3 data messages per peer against the butterfly's
// 2(n−1)), are not modelled here; they decide between the two on real
// links (Config.TreeMaxBytes).
func TestSmallVectorLatency(t *testing.T) {
	const lat = time.Millisecond
	for _, tc := range []struct {
		algo aggregate.Algorithm
		n    int
		hops int
	}{
		{aggregate.Tree, 4, 2*2 + 1},
		{aggregate.Tree, 8, 2*3 + 1},
		{aggregate.Butterfly, 4, 2 + 1},
		{aggregate.Butterfly, 8, 2 + 1},
	} {
		synctestRun(t, func(t *testing.T) {
			cfg := aggregate.DefaultConfig()
			cfg.Algorithm = tc.algo
			s := newSwarm(t, tc.n, aggtest.Config{Latency: lat, Bandwidth: 125e6}, cfg)
			srcs, w := randVecs(rand.New(rand.NewPCG(1, 1)), tc.n, 1024)
			start := time.Now()
			outs := aggtest.RunRound(t.Context(), s.runners, s.group(t, 1), srcs, w)
			el := time.Since(start)
			for _, o := range outs {
				if o.Err != nil {
					t.Fatal(o.Err)
				}
			}
			t.Logf("%v n=%d 4 KB: %v virtual (%d hops of %v)", tc.algo, tc.n, el, tc.hops, lat)
			if el < time.Duration(tc.hops)*lat || el > time.Duration(tc.hops)*lat+lat/2 {
				t.Errorf("%v n=%d: %v, want %d hops of %v plus transmission", tc.algo, tc.n, el, tc.hops, lat)
			}
		})
	}
}

// TestAutoSwitchesOnRerun: Auto's choice depends on the group's size, so
// a re-run without a dead peer may run another algorithm than the first
// attempt (80 KiB among 5 peers is a tree, among 4 a ring); the
// survivors switch together and Result says which ran.
func TestAutoSwitchesOnRerun(t *testing.T) {
	synctestRun(t, func(t *testing.T) {
		cfg := aggregate.DefaultConfig()
		cfg.StallTimeout = stall
		const n, d = 5, 20 << 10
		s := newSwarm(t, n, aggtest.Config{Latency: time.Millisecond, Bandwidth: 1e9}, cfg)
		g := s.group(t, 1)
		dead := g.Member(2)
		s.net.Kill(dead)
		srcs, w := randVecs(rand.New(rand.NewPCG(3, 3)), n, d)
		outs := make([]aggtest.Outcome, n)
		var wg sync.WaitGroup
		for i, r := range s.runners {
			if s.ids[i] == dead {
				continue
			}
			wg.Go(func() {
				outs[i].Out = make([]float32, d)
				outs[i].Result, outs[i].Err = r.AllReduce(t.Context(), g, outs[i].Out, srcs[i], w[i])
			})
		}
		wg.Wait()
		var live []int
		for i, o := range outs {
			if s.ids[i] == dead {
				continue
			}
			live = append(live, i)
			if o.Err != nil {
				t.Fatalf("%s: %v", s.ids[i], o.Err)
			}
			if o.Result.Algorithm != aggregate.Ring || o.Result.Attempts != 2 || len(o.Result.Excluded) != 1 || o.Result.Excluded[0].Peer != dead {
				t.Fatalf("%s: %v after %d attempts, excluded %v; want the ring on the second, without %s", s.ids[i], o.Result.Algorithm, o.Result.Attempts, o.Result.Excluded, dead)
			}
		}
		checkSame(t, outs, live, expected(t, cfg.Rule, outs[live[0]].Result.Group, s.ids, srcs, w), false)
	})
}
