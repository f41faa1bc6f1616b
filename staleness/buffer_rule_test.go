package staleness

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/starling-ml/starling/aggregate"
)

// TestBufferRuleMatchesNaive checks the robust FedBuff step against the
// formula x ← x + η·(n/K)·median(clip(s(τ_i)·Δ_i)), clip cutting a delta
// to the lower median of the n norms, on full buffers and on a partial
// Flush.
func TestBufferRuleMatchesNaive(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	const dim, k, lr = 23, 5, 0.7
	vc := NewVersionClock(20, 0)
	b, err := NewBuffer(dim, BufferConfig{K: k, ServerLR: lr, Policy: InvSqrt(), Rule: aggregate.Median{}}, vc)
	if err != nil {
		t.Fatal(err)
	}
	x, ref := randVecRef(r, dim)
	var pend [][]float64
	step := func() {
		n := len(pend)
		norms := make([]float64, n)
		for j, p := range pend {
			for _, v := range p {
				norms[j] += v * v
			}
			norms[j] = math.Sqrt(norms[j])
		}
		sorted := slices.Clone(norms)
		slices.Sort(sorted)
		r := sorted[(n-1)/2]
		for j, p := range pend {
			if norms[j] > r {
				for i := range p {
					p[i] *= r / norms[j]
				}
			}
		}
		for i := range ref {
			col := make([]float64, n)
			for j := range pend {
				col[j] = pend[j][i]
			}
			slices.Sort(col)
			m := col[n/2]
			if n%2 == 0 {
				m = (col[n/2-1] + col[n/2]) / 2
			}
			ref[i] += lr * float64(n) / k * m
		}
		pend = pend[:0]
	}
	for range 103 { // 20 full buffers and 3 left over
		base := vc.Local() - Version(r.IntN(4))
		tau := uint64(vc.Local() - base)
		d := randVec(r, dim)
		_, flushed, err := b.Add(x, d, base)
		if err != nil {
			t.Fatal(err)
		}
		w := 1 / math.Sqrt(1+float64(tau))
		p := make([]float64, dim)
		for i, v := range d {
			p[i] = float64(float32(w * float64(v)))
		}
		pend = append(pend, p)
		if len(pend) == k {
			step()
			if !flushed {
				t.Fatal("a full buffer did not flush")
			}
		}
	}
	if ok, err := b.Flush(x); !ok || err != nil {
		t.Fatalf("Flush: %v, %v", ok, err)
	}
	step()
	for i := range ref {
		if math.Abs(float64(x[i])-ref[i]) > 1e-4 {
			t.Fatalf("x[%d] = %v, naive %v", i, x[i], ref[i])
		}
	}
}

// TestBufferRuleBoundsLiar: with the median, one absurd delta in a buffer
// of five moves the model by no more than the honest deltas do; with the
// plain mean it drags it away.
func TestBufferRuleBoundsLiar(t *testing.T) {
	const dim, k = 10, 5
	run := func(rule aggregate.Rule) float64 {
		b, err := NewBuffer(dim, BufferConfig{K: k, ServerLR: 1, Policy: Constant(), Rule: rule}, NewVersionClock(20, 0))
		if err != nil {
			t.Fatal(err)
		}
		x := make([]float32, dim)
		liar := make([]float32, dim)
		for i := range liar {
			liar[i] = 1e6
		}
		r := rand.New(rand.NewPCG(1, 2))
		for j := range k {
			d := liar
			if j != 2 {
				d = randVec(r, dim) // |values| of a few units at most
			}
			if _, _, err := b.Add(x, d, 0); err != nil {
				t.Fatal(err)
			}
		}
		return float64(slices.Max(x))
	}
	if m := run(aggregate.Median{}); m > 5 {
		t.Errorf("median: the liar moved a value to %v", m)
	}
	if m := run(nil); m < 1e5 {
		t.Errorf("mean: largest value %v; the test's liar is too weak", m)
	}
}

func TestBufferRuleValidate(t *testing.T) {
	for _, r := range []aggregate.Rule{aggregate.Trimmed{Beta: 0.7}, aggregate.Krum{F: 1, M: 1}} {
		c := BufferConfig{K: 4, ServerLR: 1, Policy: Constant(), Rule: r}
		if err := c.Validate(); !errors.Is(err, ErrBadConfig) {
			t.Errorf("rule %v: %v, want ErrBadConfig", r, err)
		}
	}
	c := BufferConfig{K: 4, ServerLR: 1, Policy: Constant(), Rule: aggregate.Trimmed{Beta: 0.25}}
	if err := c.Validate(); err != nil {
		t.Errorf("trimmed 0.25: %v", err)
	}
}

func TestVersionClockLive(t *testing.T) {
	t0 := time.Unix(1000, 0)
	c := NewVersionClock(0, 10*time.Second)
	c.Observe("a", 1, t0)
	c.Observe("b", 1, t0.Add(5*time.Second))
	for _, tc := range []struct {
		at   time.Duration
		want int
	}{{0, 2}, {9 * time.Second, 2}, {10 * time.Second, 1}, {15 * time.Second, 0}} {
		if got := c.Live(t0.Add(tc.at)); got != tc.want {
			t.Errorf("Live at +%v = %d, want %d", tc.at, got, tc.want)
		}
	}
	if got := NewVersionClock(0, 0).Live(t0); got != 0 {
		t.Errorf("empty clock: Live = %d", got)
	}
}
