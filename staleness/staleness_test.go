package staleness

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/starling-ml/starling/internal/spec"
)

func TestPolicyWeights(t *testing.T) {
	// Values computed by hand from the papers' formulas.
	tests := []struct {
		p    Policy
		tau  uint64
		want float64
	}{
		{Constant(), 0, 1},
		{Constant(), 1 << 40, 1},
		{Policy{}, 7, 1}, // zero value is constant
		{Polynomial(0.5), 0, 1},
		{Polynomial(0.5), 3, 0.5},
		{Polynomial(0.5), 8, 1.0 / 3},
		{Polynomial(1), 4, 0.2},
		{Polynomial(0), 100, 1},
		{Hinge(10, 4), 0, 1},
		{Hinge(10, 4), 4, 1},
		{Hinge(10, 4), 5, 1.0 / 11},
		{Hinge(10, 4), 24, 1.0 / 201},
		{Hinge(0, 4), 24, 1},
		{Inverse(), 0, 1},
		{Inverse(), 1, 1},
		{Inverse(), 8, 0.125},
		{InvSqrt(), 0, 1},
		{InvSqrt(), 3, 0.5},
		{InvSqrt(), 15, 0.25},
		{Custom("neg", func(uint64) float64 { return -3 }), 1, 0},
		{Custom("nan", func(uint64) float64 { return math.NaN() }), 1, 0},
		{Custom("big", func(uint64) float64 { return 7 }), 1, 1},
	}
	for _, tt := range tests {
		got := tt.p.Weight(tt.tau)
		if math.Abs(got-tt.want) > 1e-12 {
			t.Errorf("%s: s(%d) = %v, want %v", tt.p, tt.tau, got, tt.want)
		}
	}
}

func TestPoliciesMonotone(t *testing.T) {
	for _, spec := range []string{"const", "poly", "poly:2", "hinge", "hinge:1,0", "inv", "sqrt"} {
		p, err := Parse(spec)
		if err != nil {
			t.Fatal(err)
		}
		prev := 2.0
		for tau := range uint64(200) {
			w := p.Weight(tau)
			if w > prev || w < 0 || w > 1 {
				t.Fatalf("%s: s(%d) = %v after %v: not a non-increasing weight in [0,1]", spec, tau, w, prev)
			}
			prev = w
		}
	}
}

func TestDecideAndGate(t *testing.T) {
	p := Polynomial(0.5).WithBound(3)
	for tau, want := range []Action{Accept, Accept, Accept, Accept, Reject, Reject} {
		d := p.Decide(uint64(tau))
		if d.Action != want || d.Tau != uint64(tau) {
			t.Errorf("Decide(%d) = %v, want %v", tau, d, want)
		}
		if d.Action == Reject && d.Weight != 0 {
			t.Errorf("Decide(%d): rejected with weight %v", tau, d.Weight)
		}
		g := p.Gate(uint64(tau))
		wantG := Accept
		if want == Reject {
			wantG = Wait
		}
		if g.Action != wantG {
			t.Errorf("Gate(%d) = %v, want %v", tau, g, wantG)
		}
	}
	// ssp:0 is fully synchronous: only τ = 0 passes.
	if d := SSP(0).Decide(1); d.Action != Reject {
		t.Errorf("ssp:0 Decide(1) = %v", d)
	}
	if d := SSP(0).Decide(0); d.Action != Accept || d.Weight != 1 {
		t.Errorf("ssp:0 Decide(0) = %v", d)
	}
	// Without a bound nothing is rejected.
	if d := Inverse().Decide(math.MaxUint64); d.Action != Accept {
		t.Errorf("inv Decide(max) = %v", d)
	}
	if _, ok := SSP(5).WithBound(-1).Bound(); ok {
		t.Error("WithBound(-1) kept a bound")
	}
}

func TestParse(t *testing.T) {
	good := []struct{ spec, canon string }{
		{"const", "const"},
		{"constant", "const"},
		{"poly", "poly:0.5"},
		{"poly:0.5", "poly:0.5"},
		{"poly:2", "poly:2"},
		{"hinge", "hinge:10,4"},
		{"hinge:10,4", "hinge:10,4"},
		{"hinge: 3 , 1.5", "hinge:3,1.5"},
		{"inv", "inv"},
		{"sqrt", "sqrt"},
		{"ssp:3", "ssp:3"},
		{"ssp:0", "ssp:0"},
		{"const+ssp:3", "ssp:3"},
		{"ssp:3+sqrt", "sqrt+ssp:3"},
		{" Poly:1 + SSP:16 ", "poly:1+ssp:16"},
	}
	for _, tt := range good {
		p, err := Parse(tt.spec)
		if err != nil {
			t.Errorf("Parse(%q): %v", tt.spec, err)
			continue
		}
		if p.String() != tt.canon {
			t.Errorf("Parse(%q) = %s, want %s", tt.spec, p, tt.canon)
		}
		q, err := Parse(p.String())
		if err != nil || q.String() != p.String() {
			t.Errorf("round trip of %q: %v, %v", p, q, err)
		}
	}
	bad := []struct{ spec, msg string }{
		{"", "empty"},
		{"  ", "empty"},
		{"exp", `unknown policy "exp"`},
		{"poly:x", `a="x"`},
		{"poly:-1", `a="-1"`},
		{"poly:NaN", `a="NaN"`},
		{"poly:inf", `a="inf"`},
		{"poly:1,2", "too many values"},
		{"hinge:1", "missing b="},
		{"hinge:1,2,3", "too many values"},
		{"inv:1", "takes no arguments"},
		{"const:1", "takes no arguments"},
		{"ssp", "missing s="},
		{"ssp:1.5", `s="1.5"`},
		{"ssp:-2", `s="-2"`},
		{"ssp:1+ssp:2", "more than one ssp"},
		{"poly+inv", "more than one weight"},
		{"+", "no name"},
		{strings.Repeat("x", spec.MaxLen+1), "longer than"},
	}
	for _, tt := range bad {
		_, err := Parse(tt.spec)
		if !errors.Is(err, ErrBadSpec) {
			t.Errorf("Parse(%q) = %v, want ErrBadSpec", tt.spec, err)
			continue
		}
		if !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("Parse(%q) = %q, want it to mention %q", tt.spec, err, tt.msg)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"const", "poly:0.5", "hinge:10,4", "inv", "sqrt", "ssp:3", "poly+ssp:2", "hinge:1e308,1e-308", "ssp:99999999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		p, err := Parse(spec)
		if err != nil {
			if !errors.Is(err, ErrBadSpec) {
				t.Fatalf("Parse(%q): error %v does not wrap ErrBadSpec", spec, err)
			}
			return
		}
		q, err := Parse(p.String())
		if err != nil || q.String() != p.String() {
			t.Fatalf("Parse(%q) = %s does not round-trip: %v, %v", spec, p, q, err)
		}
		for _, tau := range []uint64{0, 1, 5, 1 << 20, math.MaxUint64} {
			if w := p.Weight(tau); !(w >= 0 && w <= 1) {
				t.Fatalf("%s: s(%d) = %v", p, tau, w)
			}
			if a, b := p.Decide(tau), q.Decide(tau); a != b {
				t.Fatalf("%s: Decide(%d) = %v after round trip, %v before", p, tau, b, a)
			}
		}
	})
}

func TestStaleness(t *testing.T) {
	if tau, err := Staleness(12, 7); tau != 5 || err != nil {
		t.Errorf("Staleness(12, 7) = %d, %v", tau, err)
	}
	if tau, err := Staleness(7, 7); tau != 0 || err != nil {
		t.Errorf("Staleness(7, 7) = %d, %v", tau, err)
	}
	if _, err := Staleness(7, 8); !errors.Is(err, ErrFutureVersion) {
		t.Errorf("Staleness(7, 8) = %v, want ErrFutureVersion", err)
	}
	if tau, err := Staleness(math.MaxUint64, 0); tau != math.MaxUint64 || err != nil {
		t.Errorf("Staleness(max, 0) = %d, %v", tau, err)
	}
}

// TestVersionClockStall: a peer heard from every second but stuck at one
// version (hung, or lying to hold SSP gates shut) stops counting for
// Slowest after the stall time, wobbling below its highest version does
// not count as moving, and it counts again once it moves on.
func TestVersionClockStall(t *testing.T) {
	t0 := time.Unix(1000, 0)
	c := NewVersionClock(10, 5*time.Second)
	c.SetStall(30 * time.Second)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	for s := 0; s < 30; s++ {
		c.Observe("liar", Version(s%2), at(s)) // 0, 1, 0, 1, …
		c.Observe("honest", Version(8+s/10), at(s))
		if p, _, _ := c.Slowest(at(s)); p != "liar" {
			t.Fatalf("at %ds: slowest %s, want liar (it counts until it has stalled 30 s)", s, p)
		}
	}
	// Its highest version, 1, came at 1 s.
	c.Observe("liar", 0, at(31))
	c.Observe("honest", 10, at(31))
	if p, v, _ := c.Slowest(at(31)); p != "honest" || v != 10 {
		t.Fatalf("at 31s: slowest %s at %d, want honest at 10 (the liar stalled)", p, v)
	}
	c.Observe("liar", 2, at(32))
	if p, v, _ := c.Slowest(at(32)); p != "liar" || v != 2 {
		t.Fatalf("after it moved on: slowest %s at %d, want liar at 2", p, v)
	}
}

func TestVersionClock(t *testing.T) {
	t0 := time.Unix(1000, 0)
	c := NewVersionClock(5, 10*time.Second)
	if c.Tick() != 6 || c.Local() != 6 {
		t.Fatal("Tick")
	}
	if _, _, ok := c.Slowest(t0); ok {
		t.Fatal("Slowest with no peers")
	}
	c.Observe("b", 3, t0)
	c.Observe("a", 3, t0.Add(time.Second))
	c.Observe("c", 9, t0.Add(2*time.Second))
	if p, v, ok := c.Slowest(t0.Add(5 * time.Second)); p != "a" || v != 3 || !ok {
		t.Errorf("Slowest = %s %d %v, want a 3 (tie broken by name)", p, v, ok)
	}
	if lag := c.Lag(t0.Add(5 * time.Second)); lag != 3 {
		t.Errorf("Lag = %d, want 3", lag)
	}
	// At t0+10s b has expired (seen at t0), a has not.
	if p, _, _ := c.Slowest(t0.Add(10 * time.Second)); p != "a" {
		t.Errorf("Slowest after b's ttl = %s, want a", p)
	}
	// Only c is live at t0+11.5s and it is ahead: lag 0.
	if lag := c.Lag(t0.Add(11500 * time.Millisecond)); lag != 0 {
		t.Errorf("Lag with only a faster peer = %d, want 0", lag)
	}
	if gone := c.Expire(t0.Add(11 * time.Second)); !slices.Equal(gone, []string{"a", "b"}) {
		t.Errorf("Expire = %v, want [a b]", gone)
	}
	if c.Len() != 1 {
		t.Errorf("Len = %d after expiry", c.Len())
	}
	if v, ok := c.Peer("c"); v != 9 || !ok {
		t.Errorf("Peer(c) = %d %v", v, ok)
	}
	c.Forget("c")
	if _, ok := c.Peer("c"); ok {
		t.Error("Forget")
	}
	// ttl ≤ 0: peers never expire.
	n := NewVersionClock(0, 0)
	n.Observe("x", 1, t0)
	if gone := n.Expire(t0.Add(1000 * time.Hour)); len(gone) != 0 {
		t.Errorf("Expire with ttl 0 = %v", gone)
	}
}

// randVecRef returns randVec(r, n) and a float64 copy of it, the naive
// reference a test updates alongside.
func randVecRef(r *rand.Rand, n int) ([]float32, []float64) {
	x := randVec(r, n)
	ref := make([]float64, n)
	for i, v := range x {
		ref[i] = float64(v)
	}
	return x, ref
}

func randVec(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64())
	}
	return v
}

// TestMixerMatchesNaive replays a random stream of contributions through a
// Mixer and through the formula written out in float64.
func TestMixerMatchesNaive(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	const dim = 37
	for _, spec := range []string{"const", "poly:0.5", "hinge:10,4", "inv", "sqrt", "poly:0.5+ssp:6"} {
		p, _ := Parse(spec)
		vc := NewVersionClock(0, 0)
		m, err := NewMixer(MixerConfig{Alpha: 0.6, Policy: p}, vc)
		if err != nil {
			t.Fatal(err)
		}
		x, ref := randVecRef(r, dim)
		for range 300 {
			local := vc.Local()
			base := local - Version(r.IntN(int(min(local, 10))+1))
			xn := randVec(r, dim)
			d, err := m.Mix(x, xn, base)
			if err != nil {
				t.Fatal(err)
			}
			tau := uint64(local - base)
			wantD := p.Decide(tau)
			if d != wantD {
				t.Fatalf("%s: decision %v, want %v", spec, d, wantD)
			}
			if d.Action == Accept {
				a := 0.6 * p.Weight(tau)
				for i := range ref {
					ref[i] = (1-a)*ref[i] + a*float64(xn[i])
				}
				if vc.Local() != local+1 {
					t.Fatalf("accepted mix did not tick: %d → %d", local, vc.Local())
				}
			} else if vc.Local() != local {
				t.Fatal("rejected mix ticked the clock")
			}
			// Local SGD steps between mixes.
			for range r.IntN(3) {
				vc.Tick()
			}
		}
		for i := range ref {
			if math.Abs(float64(x[i])-ref[i]) > 1e-4 {
				t.Fatalf("%s: x[%d] = %v, naive %v", spec, i, x[i], ref[i])
			}
		}
	}
}

func TestMixerDropsLeaveModel(t *testing.T) {
	vc := NewVersionClock(3, 0)
	m, _ := NewMixer(DefaultMixerConfig(), vc)
	x := []float32{1, 2, 3}
	orig := slices.Clone(x)
	cases := []struct {
		v    []float32
		base Version
		want error
	}{
		{[]float32{1, float32(math.NaN()), 1}, 3, ErrNonFinite},
		{[]float32{1, 1, float32(math.Inf(-1))}, 3, ErrNonFinite},
		{[]float32{1, 1}, 3, ErrShape},
		{nil, 3, ErrShape},
		{[]float32{1, 1, 1}, 4, ErrFutureVersion},
	}
	for _, c := range cases {
		d, err := m.Mix(x, c.v, c.base)
		if !errors.Is(err, c.want) || d.Action != Reject {
			t.Errorf("Mix(%v, base %d) = %v, %v; want reject, %v", c.v, c.base, d, err, c.want)
		}
		if !slices.Equal(x, orig) || vc.Local() != 3 {
			t.Fatalf("dropped contribution changed the model or clock: %v, %d", x, vc.Local())
		}
	}
	st := m.Stats()
	if st.NonFinite != 2 || st.Shape != 2 || st.Future != 1 || st.Accepted != 0 || st.Dropped() != 5 {
		t.Errorf("stats = %v", st)
	}
}

func TestMixerConfig(t *testing.T) {
	if err := DefaultMixerConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	for _, a := range []float64{0, -0.1, 1.01, math.NaN(), math.Inf(1)} {
		if err := (MixerConfig{Alpha: a}).Validate(); !errors.Is(err, ErrBadConfig) {
			t.Errorf("alpha %v: %v", a, err)
		}
	}
	if _, err := NewMixer(DefaultMixerConfig(), nil); !errors.Is(err, ErrBadConfig) {
		t.Errorf("nil clock: %v", err)
	}
	if err := DefaultBufferConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []BufferConfig{{K: 0, ServerLR: 1}, {K: 2, ServerLR: 0}, {K: 2, ServerLR: math.NaN()}, {K: 2, ServerLR: math.Inf(1)}} {
		if err := c.Validate(); !errors.Is(err, ErrBadConfig) {
			t.Errorf("%+v: %v", c, err)
		}
	}
}

// TestBufferMatchesNaive checks the FedBuff step against the formula.
func TestBufferMatchesNaive(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	const dim, k = 19, 4
	vc := NewVersionClock(20, 0)
	b, err := NewBuffer(dim, BufferConfig{K: k, ServerLR: 0.7, Policy: InvSqrt().WithBound(8)}, vc)
	if err != nil {
		t.Fatal(err)
	}
	x, ref := randVecRef(r, dim)
	pend := make([]float64, dim)
	n, steps := 0, 0
	for range 200 {
		local := vc.Local()
		base := local - Version(r.IntN(12))
		d := randVec(r, dim)
		dec, flushed, err := b.Add(x, d, base)
		if err != nil {
			t.Fatal(err)
		}
		tau := uint64(local - base)
		if tau > 8 {
			if dec.Action != Reject || flushed {
				t.Fatalf("τ=%d beyond bound: %v %v", tau, dec, flushed)
			}
			continue
		}
		w := 1 / math.Sqrt(1+float64(tau))
		for i := range pend {
			pend[i] += w * float64(d[i])
		}
		n++
		if n == k {
			for i := range ref {
				ref[i] += 0.7 * pend[i] / k
				pend[i] = 0
			}
			n = 0
			steps++
			if !flushed || vc.Local() != local+1 {
				t.Fatalf("step %d: flushed=%v local %d→%d", steps, flushed, local, vc.Local())
			}
		} else if flushed || b.Len() != n {
			t.Fatalf("flushed early: n=%d Len=%d", n, b.Len())
		}
	}
	if steps < 10 {
		t.Fatalf("only %d steps", steps)
	}
	for i := range ref {
		if math.Abs(float64(x[i])-ref[i]) > 1e-4 {
			t.Fatalf("x[%d] = %v, naive %v", i, x[i], ref[i])
		}
	}
	st := b.Stats()
	if st.Accepted+st.Stale != 200 || st.Stale == 0 {
		t.Errorf("stats %v", st)
	}
	if _, _, err := b.Add(x[:3], make([]float32, dim), vc.Local()); !errors.Is(err, ErrShape) {
		t.Errorf("short model: %v", err)
	}
}

func TestCompensate(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, n := range []int{0, 1, 7, 1000} {
		g, w, bak := randVec(r, n), randVec(r, n), randVec(r, n)
		got, err := Compensate(nil, g, w, bak, 0.3)
		if err != nil {
			t.Fatal(err)
		}
		for i := range g {
			want := float64(g[i]) + 0.3*float64(g[i])*float64(g[i])*(float64(w[i])-float64(bak[i]))
			if math.Abs(float64(got[i])-want) > 1e-5*(1+math.Abs(want)) {
				t.Fatalf("n=%d: [%d] = %v, want %v", n, i, got[i], want)
			}
		}
		// In place: dst aliases g.
		g2 := slices.Clone(g)
		inPlace, _ := Compensate(g2[:0], g2, w, bak, 0.3)
		if !slices.Equal(inPlace, got) {
			t.Fatalf("n=%d: in-place result differs", n)
		}
	}
	if _, err := Compensate(nil, make([]float32, 3), make([]float32, 3), make([]float32, 2), 1); !errors.Is(err, ErrShape) {
		t.Errorf("shape: %v", err)
	}
}

func TestAdaptiveCompensator(t *testing.T) {
	a := NewAdaptiveCompensator(2)
	g := []float32{2, 0}
	w := []float32{1, 1}
	bak := []float32{0, 0}
	// m = 0.05·4 = 0.2; λ = 2/√0.2 ≈ 4.4721; result = 2 + 4.4721·4·1.
	got, err := a.Compensate(nil, g, w, bak)
	if err != nil {
		t.Fatal(err)
	}
	want := 2 + 2/math.Sqrt(0.2+1e-7)*4
	if math.Abs(float64(got[0])-want) > 1e-3 || got[1] != 0 {
		t.Fatalf("got %v, want [%v 0]", got, want)
	}
	// Second step: m = 0.95·0.2 + 0.05·4 = 0.39.
	got, _ = a.Compensate(got[:0], g, w, bak)
	want = 2 + 2/math.Sqrt(0.39+1e-7)*4
	if math.Abs(float64(got[0])-want) > 1e-3 {
		t.Fatalf("second step %v, want %v", got[0], want)
	}
	// Scale-free: scaling g by c scales the correction's λ by 1/c.
	if _, err := a.Compensate(nil, make([]float32, 3), make([]float32, 3), make([]float32, 3)); !errors.Is(err, ErrShape) {
		t.Errorf("shape: %v", err)
	}
}

func BenchmarkMix(b *testing.B) {
	for _, n := range []int{1 << 10, 1 << 20} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			r := rand.New(rand.NewPCG(1, 1))
			x, xn := randVec(r, n), randVec(r, n)
			vc := NewVersionClock(0, 0)
			m, _ := NewMixer(DefaultMixerConfig(), vc)
			b.SetBytes(int64(4 * n))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := m.Mix(x, xn, vc.Local()); err != nil {
					b.Fatal(err)
				}
			}
			if m.Stats().Accepted == 0 {
				b.Fatal("nothing mixed")
			}
		})
	}
}

func BenchmarkCompensate(b *testing.B) {
	for _, n := range []int{1 << 10, 1 << 20} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			r := rand.New(rand.NewPCG(1, 1))
			g, w, bak := randVec(r, n), randVec(r, n), randVec(r, n)
			dst := make([]float32, n)
			b.SetBytes(int64(4 * n))
			b.ReportAllocs()
			for b.Loop() {
				dst, _ = Compensate(dst, g, w, bak, DefaultDCLambda)
			}
			if len(dst) != n {
				b.Fatal("short result")
			}
		})
	}
}
