package staleness

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/starling-ml/starling/aggregate/rule"
)

// TestBufferRuleMatchesNaive checks the robust FedBuff step against the
// formula x ← x + η·(min(n, K)/K)·median(clip(v_p)), v_p the mean of voter
// p's weighted deltas s(τ_i)·Δ_i and clip cutting a vote to the lower
// median of the votes' norms, a full buffer stepping once it holds votes
// from the quorum: on anonymous deltas (Add: each its own voter), on
// deltas from a few voters with a quorum (AddFrom), and on a partial
// Flush.
func TestBufferRuleMatchesNaive(t *testing.T) {
	for _, tc := range []struct {
		name   string
		voters int // 0: Add
		quorum int
		models bool
	}{{"anonymous", 0, 0, false}, {"voters", 5, 3, false}, {"voters/quorum-all", 4, 4, false}, {"models/anonymous", 0, 0, true}} {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(5, uint64(tc.voters)))
			const dim, k, lr = 23, 5, 0.7
			vc := NewVersionClock(20, 0)
			b, err := NewBuffer(dim, BufferConfig{K: k, ServerLR: lr, Policy: InvSqrt(), Rule: rule.Median{}, Models: tc.models}, vc)
			if err != nil {
				t.Fatal(err)
			}
			b.SetQuorum(tc.quorum)
			x, ref := randVecRef(r, dim)
			var (
				order []string
				pend  = map[string][][]float64{}
				wsum  = map[string]float64{}
				n     int
				steps int
			)
			step := func() {
				var rows [][]float64
				for _, from := range order {
					m := make([]float64, dim)
					for _, p := range pend[from] {
						for i, v := range p {
							m[i] += v
						}
					}
					for i := range m {
						if tc.models { // s̄·(Σ wᵢmᵢ/Σ wᵢ − x), s̄ = Σ wᵢ/n
							m[i] = wsum[from] / float64(len(pend[from])) * (float64(float32(m[i]))/wsum[from] - ref[i])
						} else {
							m[i] = float64(float32(m[i]) / float32(len(pend[from])))
						}
					}
					rows = append(rows, m)
				}
				naiveStep(ref, rows, lr*float64(min(n, k))/k)
				order, n = order[:0], 0
				clear(pend)
				clear(wsum)
				steps++
			}
			for j := range 103 {
				base := vc.Local() - Version(r.IntN(4))
				tau := uint64(vc.Local() - base)
				d := randVec(r, dim)
				var (
					flushed bool
					err     error
					from    = fmt.Sprint("anon", j)
				)
				if tc.voters == 0 {
					_, flushed, err = b.Add(x, d, base)
				} else {
					// Voter 0 floods: half of all deltas.
					from = fmt.Sprint("v", max(0, r.IntN(2*tc.voters)-tc.voters))
					_, flushed, err = b.AddFrom(x, d, base, from)
				}
				if err != nil {
					t.Fatal(err)
				}
				w := 1 / math.Sqrt(1+float64(tau))
				p := make([]float64, dim)
				for i, v := range d {
					p[i] = float64(float32(w * float64(v)))
				}
				if pend[from] == nil {
					order = append(order, from)
				}
				pend[from] = append(pend[from], p)
				wsum[from] += w
				n++
				if want := n >= k && len(order) >= tc.quorum; flushed != want {
					t.Fatalf("delta %d: flushed %v with %d deltas from %d voters", j, flushed, n, len(order))
				}
				if flushed {
					step()
				}
			}
			if ok, err := b.Flush(x); !ok || err != nil {
				t.Fatalf("Flush: %v, %v", ok, err)
			}
			step()
			t.Logf("%d steps", steps)
			for i := range ref {
				if math.Abs(float64(x[i])-ref[i]) > 1e-4 {
					t.Fatalf("x[%d] = %v, naive %v", i, x[i], ref[i])
				}
			}
		})
	}
}

// TestBufferRuleBoundsLiar: with the median, one absurd delta in a buffer
// of five moves the model by no more than the honest deltas do; with the
// plain mean it drags it away.
func TestBufferRuleBoundsLiar(t *testing.T) {
	const dim, k = 10, 5
	run := func(rl rule.Rule) float64 {
		b, err := NewBuffer(dim, BufferConfig{K: k, ServerLR: 1, Policy: Constant(), Rule: rl}, NewVersionClock(20, 0))
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
	if m := run(rule.Median{}); m > 5 {
		t.Errorf("median: the liar moved a value to %v", m)
	}
	if m := run(nil); m < 1e5 {
		t.Errorf("mean: largest value %v; the test's liar is too weak", m)
	}
}

// naiveStep is the robust buffer's step written plainly: it cuts every
// row longer than the lower median of the rows' norms to that length
// (in place), takes the coordinate-wise median and adds scale times it
// to ref.
func naiveStep(ref []float64, rows [][]float64, scale float64) {
	nv := len(rows)
	norms := make([]float64, nv)
	for j, p := range rows {
		for _, v := range p {
			norms[j] += v * v
		}
		norms[j] = math.Sqrt(norms[j])
	}
	sorted := slices.Clone(norms)
	slices.Sort(sorted)
	cut := sorted[(nv-1)/2]
	for j, p := range rows {
		if norms[j] > cut {
			for i := range p {
				p[i] *= cut / norms[j]
			}
		}
	}
	for i := range ref {
		col := make([]float64, nv)
		for j := range rows {
			col[j] = rows[j][i]
		}
		slices.Sort(col)
		m := col[nv/2]
		if nv%2 == 0 {
			m = (col[nv/2-1] + col[nv/2]) / 2
		}
		ref[i] += scale * m
	}
}

// TestBufferModelsMatchNaive checks a buffer of models (AddFrom) against
// the formula: each voter's latest model m_p, from base b_p, is a
// standing vote s(τ_p)·(m_p − x), τ_p taken at the step; the votes are cut
// to the lower median of their norms and x ← x + η·(min(n, K)/K)·median;
// a step needs K models since the last one from the quorum of voters; a
// vote not renewed for standingSteps steps is gone.
func TestBufferModelsMatchNaive(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	const dim, k, lr, quorum = 23, 5, 0.7, 3
	vc := NewVersionClock(20, 0)
	b, err := NewBuffer(dim, BufferConfig{K: k, ServerLR: lr, Policy: InvSqrt(), Rule: rule.Median{}, Models: true}, vc)
	if err != nil {
		t.Fatal(err)
	}
	b.SetQuorum(quorum)
	x, ref := randVecRef(r, dim)
	type standing struct {
		m    []float64
		base Version
		idle int
	}
	var (
		order []string
		votes = map[string]*standing{}
		fresh = map[string]bool{}
		n     int
		steps int
	)
	step := func(local Version) {
		var rows [][]float64
		kept := order[:0]
		for _, from := range order {
			v := votes[from]
			w := 1 / math.Sqrt(1+float64(local-v.base))
			row := make([]float64, dim)
			for i := range row {
				row[i] = float64(float32(w * (v.m[i] - float64(float32(ref[i])))))
			}
			rows = append(rows, row)
			if v.idle < standingSteps {
				v.idle++
				kept = append(kept, from)
			} else {
				delete(votes, from)
			}
		}
		order = kept
		naiveStep(ref, rows, lr*float64(min(n, k))/k)
		n = 0
		clear(fresh)
		steps++
	}
	for j := range 300 {
		local := vc.Local()
		base := local - Version(r.IntN(4))
		// Voter 0 sends half of all models; voter 4 stops after 100.
		from := fmt.Sprint("v", max(0, r.IntN(8)-4))
		if j >= 100 && from == "v4" {
			from = "v0"
		}
		m := randVec(r, dim)
		_, flushed, err := b.AddFrom(x, m, base, from)
		if err != nil {
			t.Fatal(err)
		}
		v := votes[from]
		if v == nil {
			v = &standing{}
			votes[from] = v
			order = append(order, from)
		}
		v.m, v.base, v.idle = make([]float64, dim), base, 0
		for i, x := range m {
			v.m[i] = float64(x)
		}
		fresh[from] = true
		n++
		if want := n >= k && len(fresh) >= quorum; flushed != want {
			t.Fatalf("model %d: flushed %v with %d models from %d fresh voters", j, flushed, n, len(fresh))
		}
		if flushed {
			step(local)
		}
		for i := range ref {
			if math.Abs(float64(x[i])-ref[i]) > 1e-4 {
				t.Fatalf("after model %d: x[%d] = %v, naive %v", j, i, x[i], ref[i])
			}
		}
	}
	if _, ok := votes["v4"]; ok || b.Voters() != len(votes) {
		t.Errorf("the stopped voter's vote stands (%d votes, naive %d)", b.Voters(), len(votes))
	}
	t.Logf("%d steps, %d votes at the end", steps, b.Voters())
}

// TestBufferRuleFlood: a voter that floods absurd deltas is one vote. The
// buffer, full of its deltas, waits for the quorum of 3 voters, and the
// step it then takes is bounded by the two honest votes.
func TestBufferRuleFlood(t *testing.T) {
	const dim, k = 10, 4
	b, err := NewBuffer(dim, BufferConfig{K: k, ServerLR: 1, Policy: Constant(), Rule: rule.Median{}}, NewVersionClock(20, 0))
	if err != nil {
		t.Fatal(err)
	}
	b.SetQuorum(3)
	x := make([]float32, dim)
	liar := make([]float32, dim)
	for i := range liar {
		liar[i] = 1e6
	}
	r := rand.New(rand.NewPCG(3, 4))
	add := func(from string, d []float32) bool {
		_, flushed, err := b.AddFrom(x, d, 0, from)
		if err != nil {
			t.Fatal(err)
		}
		return flushed
	}
	for j := range 20 {
		if add("liar", liar) {
			t.Fatalf("flushed on the liar's delta %d alone", j)
		}
	}
	if add("a", randVec(r, dim)) {
		t.Fatal("flushed with 2 voters of a quorum of 3")
	}
	if b.Voters() != 2 || b.Len() != 21 {
		t.Fatalf("%d voters, %d deltas", b.Voters(), b.Len())
	}
	if !add("b", randVec(r, dim)) {
		t.Fatal("no step with the quorum in")
	}
	if m := slices.Max(x); m > 5 {
		t.Errorf("the liar moved a value to %v", m)
	}
	if b.Len() != 0 || b.Voters() != 0 {
		t.Errorf("after the step: %d deltas from %d voters", b.Len(), b.Voters())
	}
}

func TestBufferRuleValidate(t *testing.T) {
	for _, r := range []rule.Rule{rule.Trimmed{Beta: 0.7}, rule.Krum{F: 1, M: 1}} {
		c := BufferConfig{K: 4, ServerLR: 1, Policy: Constant(), Rule: r}
		if err := c.Validate(); !errors.Is(err, ErrBadConfig) {
			t.Errorf("rule %v: %v, want ErrBadConfig", r, err)
		}
	}
	c := BufferConfig{K: 4, ServerLR: 1, Policy: Constant(), Rule: rule.Trimmed{Beta: 0.25}}
	if err := c.Validate(); err != nil {
		t.Errorf("trimmed 0.25: %v", err)
	}
	c = BufferConfig{K: 4, ServerLR: 1, Policy: Constant(), Models: true}
	if err := c.Validate(); !errors.Is(err, ErrBadConfig) {
		t.Errorf("models without a rule: %v, want ErrBadConfig", err)
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
