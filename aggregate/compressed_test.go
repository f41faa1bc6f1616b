package aggregate_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/starling-ml/starling/aggregate"
	"github.com/starling-ml/starling/aggregate/aggtest"
	"github.com/starling-ml/starling/aggregate/rule"
	"github.com/starling-ml/starling/compression"
	"github.com/starling-ml/starling/peerid"
)

// compressedSpecs are the codecs the compressed all-reduce is tested with.
var compressedSpecs = []string{"fp32", "fp16", "bf16", "int8:64", "topk:0.05", "topk:0.3", "randk:0.1", "sign:32", "powersgd:2"}

func compressedSwarm(t testing.TB, n int, algo aggregate.Algorithm, rl rule.Rule, spec string, netCfg aggtest.Config) *swarm {
	cfg := aggregate.DefaultConfig()
	cfg.Rule, cfg.Algorithm, cfg.ChunkElems, cfg.Compress = rl, algo, 64, compression.MustSpec(spec)
	return newSwarm(t, n, netCfg, cfg)
}

// leafSum is what a compressed round must return before the reducing hops'
// own rounding: the exact sum, in float64, of every member's decoded
// contribution w_i·x_i encoded as the algorithm encodes it (per shard in a
// butterfly, whole in a tree), and the sum of their magnitudes.
func leafSum(t testing.TB, spec string, algo aggregate.Algorithm, rl rule.Rule, g aggregate.Group, ids []peerid.ID, srcs [][]float32, w []float64) (sum, mag []float64) {
	t.Helper()
	d, n := len(srcs[0]), g.Size()
	sum, mag = make([]float64, d), make([]float64, d)
	parts := [][2]int{{0, d}}
	if algo == aggregate.Butterfly {
		parts = parts[:0]
		for j := range n {
			parts = append(parts, [2]int{d * j / n, d * (j + 1) / n})
		}
	}
	for _, p := range g.Members() {
		i := slices.Index(ids, p)
		c, err := compression.Parse(spec)
		if err != nil {
			t.Fatal(err)
		}
		v := slices.Clone(srcs[i])
		if _, mean := rl.(rule.Mean); mean {
			for k := range v {
				v[k] *= float32(w[i])
			}
		}
		for j, pr := range parts {
			if rk, ok := c.(*compression.RandK); ok {
				rk.SetStep(g.Round()<<16 ^ uint64(j))
			}
			dec := make([]float32, pr[1]-pr[0])
			if err := c.Decode(dec, c.Encode(nil, v[pr[0]:pr[1]])); err != nil {
				t.Fatal(err)
			}
			for k, x := range dec {
				sum[pr[0]+k] += float64(x)
				mag[pr[0]+k] += math.Abs(float64(x))
			}
		}
	}
	return sum, mag
}

// hopTolerance is how far a compressed round may land from leafSum at
// coordinate k: each reducing hop re-encodes a partial sum with the hop
// codec (levels hops on a path), which adds its rounding.
func hopTolerance(spec string, levels int, sum, mag []float64, k int) float64 {
	name, _, _ := strings.Cut(spec, ":")
	f32 := 1e-6 * (mag[k] + 1e-6)
	switch name {
	case "fp16":
		return f32 + float64(levels)*(math.Exp2(-11)*mag[k]+math.Exp2(-24))
	case "bf16":
		return f32 + float64(levels)*math.Exp2(-8)*mag[k]
	case "int8", "sign":
		// ≤ absmax(block of the partial sum)/254 per hop; bound the block's
		// absmax by the largest magnitude sum anywhere.
		return f32 + float64(levels)*slices.Max(mag)/254
	}
	return f32 // fp32 and the sparse codecs sum exactly
}

func levels(algo aggregate.Algorithm, n int) int {
	if algo == aggregate.Butterfly {
		return 1
	}
	return treeHeight(n) + 1
}

// TestCompressedMatchesLeafSum: a compressed round returns, on every member
// and with the same bits, the rule over the members' decoded contributions
// to within the hop codec's rounding; PowerSGD returns PowerSGD of the
// summed vector.
func TestCompressedMatchesLeafSum(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, algo := range []aggregate.Algorithm{aggregate.Tree, aggregate.Butterfly} {
		for _, spec := range compressedSpecs {
			for _, n := range []int{1, 2, 4, 5} {
				for _, rl := range []rule.Rule{rule.Mean{}, rule.Sum{}} {
					d := 300 + rng.IntN(900)
					name := fmt.Sprintf("%v/%s/n=%d/%v/d=%d", algo, spec, n, rl, d)
					t.Run(name, func(t *testing.T) {
						s := compressedSwarm(t, n, algo, rl, spec, aggtest.Config{})
						g := s.group(t, uint64(1+rng.IntN(1000)))
						srcs, w := randVecs(rng, n, d)
						outs := aggtest.RunRound(t.Context(), s.runners, g, srcs, w)
						checkSame(t, outs, all(n), outs[0].Out, true)
						var tot float64
						for _, x := range w {
							tot += x
						}
						div := 1.0
						if _, mean := rl.(rule.Mean); mean {
							div = tot
						}
						if got := outs[0].Result.Weight; math.Abs(got-tot) > 1e-9*tot {
							t.Fatalf("Result.Weight %v, want %v", got, tot)
						}
						got := outs[0].Out
						if strings.HasPrefix(spec, "powersgd") {
							checkPowerSGD(t, spec, rl, g, s.ids, srcs, w, got, div)
							return
						}
						sum, mag := leafSum(t, spec, algo, rl, g, s.ids, srcs, w)
						for k := range got {
							want := sum[k] / div
							if tol := hopTolerance(spec, levels(algo, n), sum, mag, k) / div; math.Abs(float64(got[k])-want) > tol {
								t.Fatalf("coord %d: got %v, want %v ± %v", k, got[k], want, tol)
							}
						}
					})
				}
			}
		}
	}
}

// checkPowerSGD compares got with one PowerSGD step on Σ w_i·x_i.
func checkPowerSGD(t *testing.T, spec string, rl rule.Rule, g aggregate.Group, ids []peerid.ID, srcs [][]float32, w []float64, got []float32, div float64) {
	t.Helper()
	d := len(srcs[0])
	m := make([]float32, d)
	for _, p := range g.Members() {
		i := slices.Index(ids, p)
		coef := float32(1)
		if _, mean := rl.(rule.Mean); mean {
			coef = float32(w[i])
		}
		for k, x := range srcs[i] {
			m[k] += coef * x
		}
	}
	c, _ := compression.Parse(spec)
	want := make([]float32, d)
	if err := c.Decode(want, c.Encode(nil, m)); err != nil {
		t.Fatal(err)
	}
	var num, den float64
	for k := range want {
		e := float64(got[k]) - float64(want[k])/div
		num += e * e
		den += float64(want[k]) * float64(want[k]) / div / div
	}
	if math.Sqrt(num) > 1e-4*math.Sqrt(den) {
		t.Fatalf("PowerSGD: ‖got − want‖ = %g, ‖want‖ = %g", math.Sqrt(num), math.Sqrt(den))
	}
}

// TestCompressedBytes measures what each peer puts on its link for one
// butterfly round of 4 peers against plain float32 chunks, and checks the
// ratios the codecs promise (top-k's gather carries the union of the four
// peers' indices, so it saves less than 1/frac).
func TestCompressedBytes(t *testing.T) {
	const n, d = 4, 1 << 16
	srcs, w := randVecs(rand.New(rand.NewPCG(3, 4)), n, d)
	sent := func(spec string) float64 {
		cfg := aggregate.DefaultConfig()
		cfg.Algorithm, cfg.Compress = aggregate.Butterfly, compression.MustSpec(spec)
		s := newSwarm(t, n, aggtest.Config{}, cfg)
		outs := aggtest.RunRound(t.Context(), s.runners, s.group(t, 1), srcs, w)
		var tot int64
		for i, o := range outs {
			if o.Err != nil {
				t.Fatalf("%s: peer %d: %v", spec, i, o.Err)
			}
			b, _ := s.net.Sent(s.ids[i])
			tot += b
		}
		return float64(tot) / n
	}
	plain := sent("")
	for _, tc := range []struct {
		spec   string
		lo, hi float64 // plain/compressed
	}{
		{"fp32", 0.99, 1.0},
		{"fp16", 1.95, 2.0},
		{"bf16", 1.95, 2.0},
		{"int8", 3.8, 4.0},
		{"sign", 6.5, 7.5}, // 1 bit out, but the gather carries int8 sums of signs
		{"topk:0.01", 25, 60},
		{"randk:0.01", 60, 100}, // same indices on every peer: the sums stay k-sparse
		{"powersgd:4", 20, 200},
	} {
		got := sent(tc.spec)
		ratio := plain / got
		t.Logf("%-10s %8.0f bytes/peer  %6.2f× fewer than fp32 chunks (%.0f)", tc.spec, got, ratio, plain)
		if ratio < tc.lo || ratio > tc.hi {
			t.Errorf("%s: %.2f× fewer bytes, want [%v, %v]", tc.spec, ratio, tc.lo, tc.hi)
		}
	}
}

// TestCompressedErrorFeedback: over many rounds, the running sum of the
// all-reduced vectors (times the total weight) equals the running sum of the
// members' weighted inputs minus their final residuals — error feedback
// telescopes through the all-reduce — and a failed round leaves the
// residual as it was.
func TestCompressedErrorFeedback(t *testing.T) {
	for _, spec := range []string{"topk:0.02,ef", "sign:ef", "int8:ef", "randk:0.05,ef", "powersgd:2,ef"} {
		for _, algo := range []aggregate.Algorithm{aggregate.Tree, aggregate.Butterfly} {
			t.Run(fmt.Sprintf("%s/%v", spec, algo), func(t *testing.T) {
				const n, d, rounds = 4, 400, 30
				rng := rand.New(rand.NewPCG(7, 8))
				s := compressedSwarm(t, n, algo, rule.Mean{}, spec, aggtest.Config{})
				in := make([]float64, d)
				out := make([]float64, d)
				var tot float64
				for r := uint64(1); r <= rounds; r++ {
					srcs, w := randVecs(rng, n, d)
					outs := aggtest.RunRound(t.Context(), s.runners, s.group(t, r), srcs, w)
					checkSame(t, outs, all(n), outs[0].Out, true)
					W := outs[0].Result.Weight
					tot = W
					for i := range n {
						for k, x := range srcs[i] {
							in[k] += float64(float32(w[i]) * x)
						}
					}
					for k, x := range outs[0].Out {
						out[k] += float64(x) * W
					}
				}
				var num, den float64
				for k := range in {
					e := in[k] - out[k]
					for i := range n {
						e -= float64(s.runners[i].Compression().Residual()[k])
					}
					num += e * e
					den += in[k] * in[k]
				}
				tol := 1e-5
				if strings.HasPrefix(spec, "sign") || strings.HasPrefix(spec, "int8") {
					// The owner's int8 re-encoding of each sum is not fed back.
					tol = 0.05
				}
				if math.Sqrt(num) > tol*math.Sqrt(den) {
					t.Fatalf("‖Σin − Σout·W − Σe‖ = %g, ‖Σin‖ = %g (last W %v)", math.Sqrt(num), math.Sqrt(den), tot)
				}
			})
		}
	}
}

// TestCompressedState: AppendState/LoadState carry the residual and
// PowerSGD's warm start, so a resumed runner continues bit-exactly.
func TestCompressedState(t *testing.T) {
	for _, spec := range []string{"topk:0.05,ef", "powersgd:2,ef", "fp16"} {
		t.Run(spec, func(t *testing.T) {
			const n, d = 3, 500
			rng := rand.New(rand.NewPCG(1, 2))
			a := compressedSwarm(t, n, aggregate.Butterfly, rule.Mean{}, spec, aggtest.Config{})
			var states [][]byte
			var last [][]float32
			var lw []float64
			for r := uint64(1); r <= 4; r++ {
				srcs, w := randVecs(rng, n, d)
				if r == 4 {
					states = nil
					for _, x := range a.runners {
						states = append(states, x.Compression().AppendState(nil))
					}
					last, lw = srcs, w
				}
				outs := aggtest.RunRound(t.Context(), a.runners, a.group(t, r), srcs, w)
				checkSame(t, outs, all(n), outs[0].Out, true)
				if r == 4 {
					// Resume a fresh swarm from the saved states: same result.
					b := compressedSwarm(t, n, aggregate.Butterfly, rule.Mean{}, spec, aggtest.Config{})
					for i, x := range b.runners {
						if err := x.Compression().LoadState(states[i]); err != nil {
							t.Fatal(err)
						}
					}
					outs2 := aggtest.RunRound(t.Context(), b.runners, b.group(t, r), last, lw)
					if !slices.Equal(math32bits(outs2[0].Out), math32bits(outs[0].Out)) {
						t.Fatal("resumed round differs")
					}
					for i := range n {
						if !slices.Equal(math32bits(a.runners[i].Compression().Residual()), math32bits(b.runners[i].Compression().Residual())) {
							t.Fatalf("peer %d: residuals differ after the resumed round", i)
						}
					}
				}
			}
			// A state of another spec is refused.
			other := compressedSwarm(t, 1, aggregate.Butterfly, rule.Mean{}, "bf16", aggtest.Config{})
			if err := other.runners[0].Compression().LoadState(states[0]); !errors.Is(err, compression.ErrState) {
				t.Fatalf("LoadState of a %s state into bf16: %v", spec, err)
			}
		})
	}
}

// TestCompressedFailures: the failure handling of the plain protocol carries
// over. A peer that dies or stalls mid-round, or sends bytes that do not
// decode, is excluded; the survivors complete with the same bits, and their
// error-feedback residuals are those of the successful attempt.
func TestCompressedFailures(t *testing.T) {
	B, T := aggregate.Butterfly, aggregate.Tree
	K, S := aggtest.Kill, aggtest.Stall
	garble := func(x []float32) {
		for i := range x {
			x[i] = math.Float32frombits(0xdeadbeef)
		}
	}
	cases := []struct {
		name   string
		algo   aggregate.Algorithm
		spec   string
		n      int
		victim int
		hook   func(v peerid.ID) aggtest.Hook
		want   error
	}{
		{"butterfly/topk/kill-before-sending", B, "topk:0.05,ef", 4, 1, func(v peerid.ID) aggtest.Hook { return aggtest.At(v, aggregate.StepScatter, 1, K) }, aggregate.ErrStall},
		{"butterfly/topk/kill-while-reducing", B, "topk:0.05,ef", 4, 2, func(v peerid.ID) aggtest.Hook { return aggtest.At(v, aggregate.StepGather, 1, K) }, aggregate.ErrStall},
		{"butterfly/int8/stall-mid-gather", B, "int8:ef", 4, 3, func(v peerid.ID) aggtest.Hook { return aggtest.At(v, aggregate.StepGather, 3, S) }, aggregate.ErrStall},
		{"butterfly/fp16/garbled-bytes", B, "fp16", 4, 0, func(v peerid.ID) aggtest.Hook {
			return aggtest.Corrupt(v, aggregate.StepScatter, 1, garble)
		}, aggregate.ErrBadValue},
		{"butterfly/powersgd/kill-in-pass-2", B, "powersgd:2,ef", 4, 1, func(v peerid.ID) aggtest.Hook { return aggtest.At(v, aggregate.StepScatter, 6, K) }, aggregate.ErrStall},
		{"tree/topk/kill-inner", T, "topk:0.05,ef", 7, 1, func(v peerid.ID) aggtest.Hook { return aggtest.At(v, aggregate.StepUp, 1, K) }, aggregate.ErrStall},
		{"tree/sign/stall-root-broadcast", T, "sign:ef", 7, 0, func(v peerid.ID) aggtest.Hook { return aggtest.At(v, aggregate.StepDown, 1, S) }, aggregate.ErrStall},
		{"tree/bf16/garbled-down", T, "bf16", 7, 2, func(v peerid.ID) aggtest.Hook {
			return aggtest.Corrupt(v, aggregate.StepDown, 1, garble)
		}, aggregate.ErrBadValue},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctestRun(t, func(t *testing.T) {
				cfg := aggregate.DefaultConfig()
				cfg.Algorithm, cfg.ChunkElems, cfg.StallTimeout, cfg.Compress = tc.algo, 64, stall, compression.MustSpec(tc.spec)
				s := newSwarm(t, tc.n, aggtest.Config{Latency: time.Millisecond, Bandwidth: 1e9}, cfg)
				g := s.group(t, 42)
				v := slices.Index(s.ids, g.Member(tc.victim))
				srcs, w := randVecs(rand.New(rand.NewPCG(uint64(tc.n), 9)), tc.n, 1000)
				s.net.SetHook(tc.hook(s.ids[v]))
				outs := aggtest.RunRound(t.Context(), s.runners, g, srcs, w)
				var surv []int
				for i := range tc.n {
					if i != v {
						surv = append(surv, i)
					}
				}
				checkSame(t, outs, surv, outs[surv[0]].Out, true)
				res := outs[surv[0]].Result
				if res.Group.Size() != tc.n-1 || res.Group.Rank(s.ids[v]) >= 0 || len(res.Excluded) != 1 || !errors.Is(res.Excluded[0], tc.want) {
					t.Fatalf("survivors: %+v, want %s excluded with %v", res, s.ids[v], tc.want)
				}
				if outs[v].Err == nil {
					t.Fatalf("victim succeeded")
				}
				mult := 2
				if tc.algo == T {
					mult = 2 + treeHeight(tc.n)
				}
				for _, i := range surv {
					if el := outs[i].Elapsed; el > time.Duration(2*mult+3)*stall {
						t.Errorf("survivor %d took %v", i, el)
					}
				}
				// The committed result is the survivors' compressed round: a
				// rerun among them from the residuals before the round gives
				// the same bits.
				if strings.Contains(tc.spec, "ef") {
					ref := compressedSwarm(t, tc.n, tc.algo, rule.Mean{}, tc.spec, aggtest.Config{})
					var rr []*aggregate.Runner
					var rs [][]float32
					var rw []float64
					for _, i := range surv {
						rr, rs, rw = append(rr, ref.runners[i]), append(rs, srcs[i]), append(rw, w[i])
					}
					ro := aggtest.RunRound(t.Context(), rr, res.Group, rs, rw)
					checkSame(t, ro, all(len(rr)), outs[surv[0]].Out, true)
					for k, i := range surv {
						if !slices.Equal(math32bits(rr[k].Compression().Residual()), math32bits(s.runners[i].Compression().Residual())) {
							t.Fatalf("survivor %d: residual is not that of the committed attempt", i)
						}
					}
				}
			})
		})
	}
}

// TestCompressedConfigMismatch: a peer with another codec is excluded with
// ErrConfigMismatch; so is a plain peer among compressed ones.
func TestCompressedConfigMismatch(t *testing.T) {
	for _, odd := range []string{"fp16", ""} {
		t.Run("odd="+odd, func(t *testing.T) {
			synctestRun(t, func(t *testing.T) {
				cfg := aggregate.DefaultConfig()
				cfg.Algorithm, cfg.StallTimeout, cfg.Compress = aggregate.Butterfly, stall, compression.MustSpec("int8")
				s := newSwarm(t, 5, aggtest.Config{Latency: time.Millisecond}, cfg)
				cfg.Compress = compression.MustSpec(odd)
				var err error
				if s.runners[2], err = aggregate.NewRunner(s.ids[2], s.net.Join(s.ids[2]), cfg); err != nil {
					t.Fatal(err)
				}
				srcs, w := randVecs(rand.New(rand.NewPCG(1, 1)), 5, 300)
				outs := aggtest.RunRound(t.Context(), s.runners, s.group(t, 9), srcs, w)
				checkSame(t, outs, []int{0, 1, 3, 4}, outs[0].Out, true)
				if !errors.Is(outs[2].Err, aggregate.ErrExcluded) || !errors.Is(outs[2].Err, aggregate.ErrConfigMismatch) {
					t.Fatalf("odd peer: %v", outs[2].Err)
				}
			})
		})
	}
}

func TestCompressedConfigValidate(t *testing.T) {
	cfg := aggregate.DefaultConfig()
	if err := cfg.Compress.UnmarshalText([]byte("zip")); !errors.Is(err, compression.ErrBadSpec) {
		t.Fatalf("bad codec: %v", err)
	}
	cfg.Compress, cfg.Rule = compression.MustSpec("fp16"), rule.Median{}
	if err := cfg.Validate(); !errors.Is(err, aggregate.ErrUnsupported) {
		t.Fatalf("median with fp16: %v", err)
	}
	cfg.Compress = compression.MustSpec("powersgd:4,ef")
	cfg.Rule = rule.Sum{}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s := newSwarm(t, 1, aggtest.Config{}, cfg)
	if err := s.runners[0].Compression().SetLayout([]compression.Shape{{Rows: 10, Cols: 10}}); err != nil {
		t.Fatal(err)
	}
	_, err := s.runners[0].AllReduce(t.Context(), s.group(t, 1), make([]float32, 99), make([]float32, 99), 1)
	if !errors.Is(err, aggregate.ErrBadInput) {
		t.Fatalf("vector that does not fit the layout: %v", err)
	}
}

// BenchmarkCompressedAllReduce runs butterfly rounds of 4 peers on 1 M
// values with each codec, on an unlimited in-memory network (the CPU cost
// of encoding, combining and decoding) and on 1 Gbit/s links (where the
// bytes saved pay). Compare codecs within one run, as ratios to "plain".
func BenchmarkCompressedAllReduce(b *testing.B) {
	const n, d = 4, 1 << 20
	srcs, w := randVecs(rand.New(rand.NewPCG(1, 1)), n, d)
	for _, link := range []struct {
		name string
		bw   float64
	}{{"unlimited", 0}, {"1Gbit", 125e6}} {
		for _, spec := range []string{"", "fp16", "int8", "sign", "topk:0.01,ef", "randk:0.01,ef", "powersgd:4,ef"} {
			name := spec
			if name == "" {
				name = "plain"
			}
			b.Run(link.name+"/"+name, func(b *testing.B) {
				cfg := aggregate.DefaultConfig()
				cfg.Algorithm, cfg.Compress = aggregate.Butterfly, compression.MustSpec(spec)
				s := newSwarm(b, n, aggtest.Config{Bandwidth: link.bw}, cfg)
				b.SetBytes(4 * d)
				b.ReportAllocs()
				round := uint64(0)
				for b.Loop() {
					round++
					outs := aggtest.RunRound(b.Context(), s.runners, s.group(b, round), srcs, w)
					if outs[0].Err != nil {
						b.Fatal(outs[0].Err)
					}
				}
				sent, _ := s.net.Sent(s.ids[0])
				b.ReportMetric(float64(sent)/float64(round), "sent_B/peer")
			})
		}
	}
}

// TestCompressedMeanOverflow: weights so small that float32 rounds them
// up (1e-45 to 1.4e-45) make a finite weighted sum whose division by the
// total weight overflows: a group fault on every peer, not infinities
// handed back. (The butterfly weighs by w/Σw: its products cannot
// overflow.)
func TestCompressedMeanOverflow(t *testing.T) {
	for _, algo := range []aggregate.Algorithm{aggregate.Tree} {
		for _, spec := range []string{"fp32", "fp16", "powersgd:2"} {
			s := compressedSwarm(t, 4, algo, rule.Mean{}, spec, aggtest.Config{})
			srcs, _ := randVecs(rand.New(rand.NewPCG(5, 6)), 4, 10)
			for i := range srcs {
				srcs[i][3] = 3e38
			}
			for i, o := range aggtest.RunRound(t.Context(), s.runners, s.group(t, 1), srcs, []float64{1e-45, 1e-45, 1e-45, 1e-45}) {
				if !errors.Is(o.Err, aggregate.ErrOverflow) {
					t.Errorf("%v %s: peer %d: %v", algo, spec, i, o.Err)
				}
			}
		}
	}
}
