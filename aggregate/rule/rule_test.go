package rule

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// Naive references: whole vectors, float64, the textbook definitions.

func naiveSum(srcs [][]float32, _ []float64) []float64 {
	out := make([]float64, len(srcs[0]))
	for _, s := range srcs {
		for k, v := range s {
			out[k] += float64(v)
		}
	}
	return out
}

func naiveMean(srcs [][]float32, w []float64) []float64 {
	out := make([]float64, len(srcs[0]))
	var tot float64
	for i, s := range srcs {
		tot += w[i]
		for k, v := range s {
			out[k] += w[i] * float64(v)
		}
	}
	for k := range out {
		out[k] /= tot
	}
	return out
}

func column(srcs [][]float32, k int) []float64 {
	col := make([]float64, len(srcs))
	for i, s := range srcs {
		col[i] = float64(s[k])
	}
	slices.Sort(col)
	return col
}

func naiveMedian(srcs [][]float32, _ []float64) []float64 {
	out := make([]float64, len(srcs[0]))
	for k := range out {
		col := column(srcs, k)
		n := len(col)
		if n%2 == 1 {
			out[k] = col[n/2]
		} else {
			out[k] = float64(float32((col[n/2-1] + col[n/2]) / 2))
		}
	}
	return out
}

func naiveTrimmed(beta float64) func([][]float32, []float64) []float64 {
	return func(srcs [][]float32, _ []float64) []float64 {
		out := make([]float64, len(srcs[0]))
		n := len(srcs)
		t := int(math.Floor(beta*float64(n) + 1e-9))
		for k := range out {
			col := column(srcs, k)
			var s float64
			for _, v := range col[t : n-t] {
				s += v
			}
			out[k] = s / float64(n-2*t)
		}
		return out
	}
}

func naiveKrum(f, m int) func([][]float32, []float64) []float64 {
	return func(srcs [][]float32, _ []float64) []float64 {
		n := len(srcs)
		scores := make([]float64, n)
		for i := range n {
			var ds []float64
			for j := range n {
				if j == i {
					continue
				}
				var s float64
				for k := range srcs[i] {
					d := float64(srcs[i][k]) - float64(srcs[j][k])
					s += d * d
				}
				ds = append(ds, s)
			}
			slices.Sort(ds)
			for _, d := range ds[:n-f-2] {
				scores[i] += d
			}
		}
		idx := make([]int, n)
		for i := range idx {
			idx[i] = i
		}
		slices.SortStableFunc(idx, func(a, b int) int {
			if scores[a] < scores[b] {
				return -1
			}
			if scores[a] > scores[b] {
				return 1
			}
			return 0
		})
		sel := idx[:min(m, n-f)]
		out := make([]float64, len(srcs[0]))
		for k := range out {
			for _, i := range sel {
				out[k] += float64(srcs[i][k])
			}
			out[k] /= float64(len(sel))
		}
		return out
	}
}

func naiveCClip(tau float64, iters int, zero bool) func([][]float32, []float64) []float64 {
	return func(srcs [][]float32, w []float64) []float64 {
		n, d := len(srcs), len(srcs[0])
		v := make([]float64, d)
		if !zero {
			copy(v, naiveMedian(srcs, w))
		}
		for range iters {
			next := slices.Clone(v)
			for _, s := range srcs {
				var nrm float64
				for k := range s {
					diff := float64(s[k]) - v[k]
					nrm += diff * diff
				}
				nrm = math.Sqrt(nrm)
				c := 1.0
				if nrm > tau {
					c = tau / nrm
				}
				for k := range s {
					next[k] += c * (float64(s[k]) - v[k]) / float64(n)
				}
			}
			v = next
		}
		return v
	}
}

type ruleCase struct {
	rule  Rule
	naive func([][]float32, []float64) []float64
	exact bool // bit-exact against the naive result rounded to float32
}

func ruleCases() []ruleCase {
	return []ruleCase{
		{Sum{}, naiveSum, false},
		{Mean{}, naiveMean, false},
		{Median{}, naiveMedian, true},
		{Trimmed{Beta: 0.2}, naiveTrimmed(0.2), false},
		{Trimmed{Beta: 0}, naiveTrimmed(0), false},
		{Trimmed{Beta: 0.49}, naiveTrimmed(0.49), false},
		{Krum{F: 1, M: 1}, naiveKrum(1, 1), true},
		{Krum{F: 1, M: 3}, naiveKrum(1, 3), false},
		{Krum{F: 2, M: 100}, naiveKrum(2, 100), false},
		{CClip{Tau: 0.5, Iters: 3}, naiveCClip(0.5, 3, false), false},
		{CClip{Tau: 2, Iters: 1, From: StartZero}, naiveCClip(2, 1, true), false},
	}
}

func randInputs(rng *rand.Rand, n, d int) ([][]float32, []float64) {
	srcs := make([][]float32, n)
	w := make([]float64, n)
	for i := range srcs {
		srcs[i] = make([]float32, d)
		scale := math.Exp(rng.NormFloat64())
		for k := range srcs[i] {
			srcs[i][k] = float32(rng.NormFloat64() * scale)
		}
		w[i] = float64(1 + rng.IntN(100))
	}
	// Some duplicated values, so that sorting ties are exercised.
	if n > 2 && d > 0 {
		srcs[1][0] = srcs[0][0]
	}
	return srcs, w
}

// reduceSharded runs r over a random split of the coordinates into shards,
// summing the statistics across shards as the butterfly does.
func reduceSharded(rng *rand.Rand, r Rule, dst []float32, srcs [][]float32, w []float64) error {
	d := len(dst)
	cuts := []int{0, d}
	for range rng.IntN(4) {
		cuts = append(cuts, rng.IntN(d+1))
	}
	slices.Sort(cuts)
	var passes []Pass
	var spans [][2]int
	for i := 0; i+1 < len(cuts); i++ {
		lo, hi := cuts[i], cuts[i+1]
		part := make([][]float32, len(srcs))
		for j, s := range srcs {
			part[j] = s[lo:hi]
		}
		p, err := r.Start(part, w)
		if err != nil {
			return err
		}
		passes = append(passes, p)
		spans = append(spans, [2]int{lo, hi})
	}
	for {
		var global []float64
		for _, p := range passes {
			st := p.Stats()
			if st == nil {
				global = nil
				break
			}
			if global == nil {
				global = make([]float64, len(st))
			}
			for i, v := range st {
				global[i] += v
			}
		}
		if global == nil {
			break
		}
		for _, p := range passes {
			if err := p.Absorb(global); err != nil {
				return err
			}
		}
	}
	for i, p := range passes {
		if err := p.Finish(dst[spans[i][0]:spans[i][1]]); err != nil {
			return err
		}
	}
	return nil
}

func closeTo(got float32, want float64, srcs [][]float32, k int) bool {
	var mag float64
	for _, s := range srcs {
		mag += math.Abs(float64(s[k]))
	}
	return math.Abs(float64(got)-want) <= 1e-5*(1+mag)
}

func TestRulesMatchNaive(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for _, tc := range ruleCases() {
		t.Run(tc.rule.String(), func(t *testing.T) {
			for trial := range 150 {
				n := 1 + rng.IntN(12)
				if trial%10 == 5 {
					n = 13 + rng.IntN(30) // both sides of netMax
				}
				d := rng.IntN(70)
				if trial%25 == 0 {
					d = 1000 + rng.IntN(100)
				}
				if n < tc.rule.MinInputs() {
					n = tc.rule.MinInputs() + rng.IntN(3)
				}
				if d == 0 {
					d = 1
				}
				srcs, w := randInputs(rng, n, d)
				want := tc.naive(srcs, w)
				for _, sharded := range []bool{false, true} {
					got := make([]float32, d)
					var err error
					if sharded {
						err = reduceSharded(rng, tc.rule, got, srcs, w)
					} else {
						err = Reduce(tc.rule, got, srcs, w)
					}
					if err != nil {
						t.Fatalf("n=%d d=%d sharded=%v: %v", n, d, sharded, err)
					}
					for k := range got {
						if tc.exact && !sharded && got[k] != float32(want[k]) || !closeTo(got[k], want[k], srcs, k) {
							t.Fatalf("n=%d d=%d sharded=%v coord %d: got %v, naive %v", n, d, sharded, k, got[k], want[k])
						}
					}
				}
			}
		})
	}
}

func TestReduceRejectsBadInput(t *testing.T) {
	x := []float32{1, 2}
	cases := []struct {
		name string
		rule Rule
		srcs [][]float32
		w    []float64
		want error
	}{
		{"none", Mean{}, nil, nil, ErrTooFewInputs},
		{"short", Mean{}, [][]float32{x, {1}}, []float64{1, 1}, ErrBadInput},
		{"weights", Mean{}, [][]float32{x}, []float64{1, 1}, ErrBadInput},
		{"negative weight", Mean{}, [][]float32{x}, []float64{-1}, ErrBadInput},
		{"NaN weight", Mean{}, [][]float32{x}, []float64{math.NaN()}, ErrBadInput},
		{"NaN", Median{}, [][]float32{{1, float32(math.NaN())}}, []float64{1}, ErrBadInput},
		{"Inf", Sum{}, [][]float32{{float32(math.Inf(-1)), 1}}, []float64{1}, ErrBadInput},
		{"zero weight", Mean{}, [][]float32{x, x}, []float64{0, 0}, ErrZeroWeight},
		{"krum few", Krum{F: 1, M: 1}, [][]float32{x, x, x, x}, []float64{1, 1, 1, 1}, ErrTooFewInputs},
		{"trimmed beta", Trimmed{Beta: 0.5}, [][]float32{x}, []float64{1}, ErrBadSpec},
		{"cclip tau", CClip{Tau: 0, Iters: 1}, [][]float32{x}, []float64{1}, ErrBadSpec},
	}
	for _, tc := range cases {
		err := Reduce(tc.rule, make([]float32, 2), tc.srcs, tc.w)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
		}
	}
}

// TestRobustRulesResistByzantine: f of n contributions are huge or
// adversarial; the robust rules stay near the honest mean, the mean does not.
func TestRobustRulesResistByzantine(t *testing.T) {
	const n, f, d = 11, 3, 200
	rng := rand.New(rand.NewPCG(3, 4))
	center := make([]float64, d)
	for k := range center {
		center[k] = rng.NormFloat64()
	}
	const sigma = 0.1
	attacks := map[string]func(i, k int) float32{
		"huge":      func(i, k int) float32 { return 1e30 },
		"mixed":     func(i, k int) float32 { return float32(math.Pow(-1, float64(i+k)) * 3e37) },
		"sign flip": func(_, k int) float32 { return float32(-20 * center[k]) },
		"one coord": func(_, k int) float32 {
			if k == 0 {
				return 1e20
			}
			return float32(center[k])
		},
	}
	rules := []Rule{
		Median{},
		Trimmed{Beta: 0.3},
		Krum{F: f, M: 1},
		Krum{F: f, M: n - 2*f},
		CClip{Tau: 1, Iters: 3},
	}
	for name, attack := range attacks {
		srcs := make([][]float32, n)
		w := make([]float64, n)
		for i := range srcs {
			srcs[i] = make([]float32, d)
			w[i] = 1
			for k := range srcs[i] {
				if i < f {
					srcs[i][k] = attack(i, k)
				} else {
					srcs[i][k] = float32(center[k] + sigma*rng.NormFloat64())
				}
			}
		}
		mean := make([]float32, d)
		if err := Reduce(Mean{}, mean, srcs, w); err == nil && dist(mean, center) < 1 {
			t.Errorf("%s: the plain mean resisted (distance %v): the attack is too weak to test anything", name, dist(mean, center))
		}
		for _, r := range rules {
			out := make([]float32, d)
			if err := Reduce(r, out, srcs, w); err != nil {
				t.Fatalf("%s %s: %v", name, r, err)
			}
			// Honest vectors lie ~σ√d = 1.4 from the centre; a robust rule
			// must stay within a small multiple of that.
			if got := dist(out, center); got > 3*sigma*math.Sqrt(d) {
				t.Errorf("%s %s: distance to honest centre %.3g", name, r, got)
			}
		}
	}
}

func dist(x []float32, c []float64) float64 {
	var s float64
	for k, v := range x {
		d := float64(v) - c[k]
		s += d * d
	}
	return math.Sqrt(s)
}

func TestParse(t *testing.T) {
	good := map[string]Rule{
		"sum":                            Sum{},
		"mean":                           Mean{},
		" Median ":                       Median{},
		"trimmed:0.2":                    Trimmed{Beta: 0.2},
		"trimmed:beta=0.1":               Trimmed{Beta: 0.1},
		"krum:f=2":                       Krum{F: 2, M: 1},
		"krum:f=2,m=3":                   Krum{F: 2, M: 3},
		"krum:m=3,f=0":                   Krum{F: 0, M: 3},
		"cclip:tau=10,iters=3":           CClip{Tau: 10, Iters: 3},
		"cclip:iters=1,tau=0.5":          CClip{Tau: 0.5, Iters: 1},
		"cclip:tau=1,iters=2,start=zero": CClip{Tau: 1, Iters: 2, From: StartZero},
	}
	for spec, want := range good {
		got, err := Parse(spec)
		if err != nil {
			t.Errorf("%q: %v", spec, err)
			continue
		}
		if got != want {
			t.Errorf("%q: got %#v, want %#v", spec, got, want)
		}
		again, err := Parse(got.String())
		if err != nil || again != got {
			t.Errorf("%q: String %q does not round-trip: %v, %v", spec, got.String(), again, err)
		}
	}
	bad := []string{"", "avg", "sum:1", "mean:", "trimmed", "trimmed:", "trimmed:0.5", "trimmed:-0.1",
		"trimmed:x", "trimmed:0.1,0.2", "trimmed:0.1,beta=0.2", "krum", "krum:2", "krum:f=-1", "krum:f=1,m=0",
		"krum:f=1,f=2", "krum:f=1,g=2", "krum:f=1.5", "cclip:tau=1", "cclip:iters=2", "cclip:tau=0,iters=1",
		"cclip:tau=NaN,iters=1", "cclip:tau=1,iters=0", "cclip:tau=1,iters=1000", "cclip:tau=1,iters=1,start=mean",
		"median:beta=1", "krum:f=", "krum:=2"}
	for _, spec := range bad {
		if r, err := Parse(spec); !errors.Is(err, ErrBadSpec) {
			t.Errorf("%q: got %v, %v; want ErrBadSpec", spec, r, err)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"sum", "trimmed:0.2", "krum:f=2,m=3", "cclip:tau=10,iters=3,start=zero", "x:=,"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		r, err := Parse(spec)
		if err != nil {
			if !errors.Is(err, ErrBadSpec) {
				t.Fatalf("%q: error %v does not wrap ErrBadSpec", spec, err)
			}
			return
		}
		again, err := Parse(r.String())
		if err != nil || again != r {
			t.Fatalf("%q → %q does not round-trip: %v %v", spec, r.String(), again, err)
		}
	})
}

func BenchmarkReduce(b *testing.B) {
	const d = 1 << 16
	for _, n := range []int{5, 16} {
		rng := rand.New(rand.NewPCG(1, 1))
		srcs, w := randInputs(rng, n, d)
		for _, r := range []Rule{Sum{}, Mean{}, Median{}, Trimmed{Beta: 0.2}, Krum{F: 1, M: 2}, CClip{Tau: 1, Iters: 3}} {
			b.Run(fmt.Sprintf("%s/n=%d", r, n), func(b *testing.B) {
				dst := make([]float32, d)
				b.SetBytes(int64(4 * d * n))
				b.ReportAllocs()
				for b.Loop() {
					if err := Reduce(r, dst, srcs, w); err != nil {
						b.Fatal(err)
					}
				}
				want := make([]float32, d)
				_ = Reduce(r, want, srcs, w)
				if !slices.Equal(dst, want) {
					b.Fatal("result changed between runs")
				}
			})
		}
	}
}

func TestFit(t *testing.T) {
	for _, c := range []struct {
		r    Rule
		n    int
		want Rule
	}{
		{Krum{F: 1, M: 1}, 5, Krum{F: 1, M: 1}},
		{Krum{F: 1, M: 2}, 4, Krum{F: 0, M: 2}},
		{Krum{F: 2, M: 1}, 6, Krum{F: 1, M: 1}},
		{Krum{F: 2, M: 1}, 3, Krum{F: 0, M: 1}},
		{Krum{F: 1, M: 1}, 2, Krum{F: 1, M: 1}}, // below any Krum: left to fail
		{Median{}, 2, Median{}},
		{Trimmed{Beta: 0.2}, 4, Trimmed{Beta: 0.2}},
	} {
		got := Fit(c.r, c.n)
		if got != c.want {
			t.Errorf("Fit(%v, %d) = %v, want %v", c.r, c.n, got, c.want)
		}
		if c.n >= 3 && c.n < got.MinInputs() {
			t.Errorf("Fit(%v, %d) = %v, which needs %d", c.r, c.n, got, got.MinInputs())
		}
	}
}
