package train

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/starling-ml/starling/device"
	"github.com/starling-ml/starling/nn"
)

// demoViews is a model of a 5×7 matrix, a 70×3×2×2 conv kernel and a
// vector of 10: edge tiles of every kind with chunk 4.
var demoViews = []nn.View{
	{Name: "w", Shape: []int{5, 7}, Offset: 0, Len: 35},
	{Name: "k", Shape: []int{70, 3, 2, 2}, Offset: 35, Len: 840},
	{Name: "b", Shape: []int{10}, Offset: 875, Len: 10},
}

func randVec(n int, seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, 1))
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	return x
}

func newTestDeMo(t *testing.T, cfg DeMoConfig) *DeMo {
	t.Helper()
	d, err := NewDeMo(cfg, demoViews, device.Default())
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestDeMoDCTIsOrthonormal: the inverse undoes the forward transform on
// every tile shape, and the transform keeps the norm (Parseval).
func TestDeMoDCTIsOrthonormal(t *testing.T) {
	d := newTestDeMo(t, DeMoConfig{Chunk: 4, TopK: 2, Beta: 0.9})
	x := randVec(d.Len(), 1)
	c, y := make([]float32, d.Len()), make([]float32, d.Len())
	d.forward(c, x)
	d.inverse(y, c)
	for i := range x {
		if math.Abs(float64(x[i]-y[i])) > 1e-5 {
			t.Fatalf("value %d: %g after forward and inverse, was %g", i, y[i], x[i])
		}
	}
	var nx, nc float64
	for i := range x {
		nx += float64(x[i]) * float64(x[i])
		nc += float64(c[i]) * float64(c[i])
	}
	if math.Abs(nx-nc) > 1e-4*nx {
		t.Fatalf("‖x‖² %g, ‖DCT x‖² %g", nx, nc)
	}
	// A constant tile has one coefficient, the first.
	ones := make([]float32, d.Len())
	for i := range 35 {
		ones[i] = 1
	}
	d.forward(c, ones)
	tl := d.tiles[0] // rows 0–3, cols 0–3 of w
	for j, v := range tileOf(c, tl) {
		if j == 0 {
			if math.Abs(float64(v)-4) > 1e-5 {
				t.Fatalf("DC coefficient %g, want 4", v)
			}
		} else if math.Abs(float64(v)) > 1e-5 {
			t.Fatalf("coefficient %d of a constant tile is %g", j, v)
		}
	}
}

// tileOf returns tile t's values of x, row-major.
func tileOf(x []float32, t demoTile) []float32 {
	var out []float32
	for i := range t.rows {
		out = append(out, x[t.off+i*t.ld:t.off+i*t.ld+t.cols]...)
	}
	return out
}

// demoStep runs one step of d on gradient g into send and checks that the
// momentum keeps what was not sent: m' + IDCT(sent) = β·m + g, which it
// returns.
func demoStep(t *testing.T, d *DeMo, send, g []float32) []float32 {
	t.Helper()
	want := slices.Clone(d.Momentum())
	for i := range want {
		want[i] = d.cfg.Beta*want[i] + g[i]
	}
	d.Prepare(send, g)
	d.Commit()
	back := make([]float32, len(send))
	d.inverse(back, send)
	for i := range want {
		if got := d.Momentum()[i] + back[i]; math.Abs(float64(got-want[i])) > 1e-4 {
			t.Fatalf("value %d: momentum + sent = %g, want β·m + g = %g", i, got, want[i])
		}
	}
	return want
}

// TestDeMoSendsTopKAndKeepsTheRest: each tile sends exactly its k largest
// coefficients, and the momentum keeps what was not sent:
// β·m + g = m' + IDCT(sent).
func TestDeMoSendsTopKAndKeepsTheRest(t *testing.T) {
	cfg := DeMoConfig{Chunk: 4, TopK: 3, Beta: 0.9}
	d := newTestDeMo(t, cfg)
	n := d.Len()
	send := make([]float32, n)
	for step := range 3 {
		want := demoStep(t, d, send, randVec(n, uint64(10+step)))
		coef := make([]float32, n)
		d.forward(coef, want)
		for _, tl := range d.tiles {
			sent, all := tileOf(send, tl), tileOf(coef, tl)
			nz := 0
			var minSent, maxKept float64 = math.Inf(1), 0
			for j := range sent {
				if sent[j] != 0 {
					nz++
					if math.Abs(float64(sent[j]-all[j])) > 1e-4 {
						t.Fatalf("tile %+v sends %g for coefficient %g", tl, sent[j], all[j])
					}
					minSent = min(minSent, math.Abs(float64(all[j])))
				} else {
					maxKept = max(maxKept, math.Abs(float64(all[j])))
				}
			}
			if nz != tl.k || maxKept > minSent+1e-5 {
				t.Fatalf("tile %+v: %d sent (want %d), smallest sent %g, largest kept %g", tl, nz, tl.k, minSent, maxKept)
			}
		}
	}
	// Full tiles keep k = 3, and so does w's 4×3 tile (⌈3·12/16⌉); its
	// last row's 1×4 and 1×3 tiles keep one.
	var ks []int
	for _, tl := range d.tiles[:4] {
		ks = append(ks, tl.k)
	}
	if !slices.Equal(ks, []int{3, 3, 1, 1}) {
		t.Fatalf("k of w's tiles %v, want [3 3 1 1]", ks)
	}
}

// TestDeMoWithEveryCoefficientIsTheGradient: with k = s², β = 0 and no
// sign, DeMo hands the optimiser exactly the mean gradient it was given.
func TestDeMoWithEveryCoefficientIsTheGradient(t *testing.T) {
	d := newTestDeMo(t, DeMoConfig{Chunk: 4, TopK: 16, Beta: 0, NoSign: true})
	g := randVec(d.Len(), 3)
	send, out := make([]float32, d.Len()), make([]float32, d.Len())
	d.Prepare(send, g)
	d.Commit()
	d.Finish(out, send)
	for i := range g {
		if math.Abs(float64(out[i]-g[i])) > 1e-5 || math.Abs(float64(d.Momentum()[i])) > 1e-5 {
			t.Fatalf("value %d: %g handed on (gradient %g), momentum left %g", i, out[i], g[i], d.Momentum()[i])
		}
	}
	// With the sign, the update is ±1 (or 0).
	d = newTestDeMo(t, DeMoConfig{Chunk: 4, TopK: 2, Beta: 0.5})
	d.Prepare(send, g)
	d.Finish(out, send)
	for i, v := range out {
		if v != 1 && v != -1 && v != 0 {
			t.Fatalf("value %d of a sign step is %g", i, v)
		}
	}
}

func TestKthLargest(t *testing.T) {
	for seed := range uint64(50) {
		x := randVec(1+int(seed*7%100), seed)
		for i := range x {
			if i%5 == 0 {
				x[i] = x[0] // ties
			}
		}
		sorted := slices.Clone(x)
		slices.Sort(sorted)
		slices.Reverse(sorted)
		for k := 1; k <= len(x); k += 1 + len(x)/7 {
			if got := kthLargest(slices.Clone(x), k); got != sorted[k-1] {
				t.Fatalf("seed %d: %d-th largest of %d is %g, got %g", seed, k, len(x), sorted[k-1], got)
			}
		}
	}
}

func TestParseSyncStrategy(t *testing.T) {
	for _, c := range []struct {
		in   string
		want DeMoConfig
		bad  bool
	}{
		{in: "dp"},
		{in: "demo", want: DeMoConfig{Chunk: 64, TopK: 32, Beta: 0.999}},
		{in: "demo:chunk=32,k=4,beta=0.9,sign=0", want: DeMoConfig{Chunk: 32, TopK: 4, Beta: 0.9, NoSign: true}},
		{in: "demo:bits=7", want: DeMoConfig{Chunk: 64, TopK: 32, Beta: 0.999, Bits: 7}},
		{in: "demo:bits=23", want: DeMoConfig{Chunk: 64, TopK: 32, Beta: 0.999}},
		{in: "demo:bits=0", bad: true},
		{in: "demo:chunk=2,k=5", bad: true},
		{in: "demo:beta=1", bad: true},
		{in: "demo:topk=3", bad: true},
		{in: "fedavg", bad: true},
	} {
		got, err := ParseSyncStrategy(c.in)
		if (err != nil) != c.bad || (!c.bad && got != c.want) {
			t.Errorf("ParseSyncStrategy(%q) = %+v, %v", c.in, got, err)
		}
	}
}

// BenchmarkDeMo times one step's transforms (Prepare, Commit and Finish)
// on the default CharLM (0.8 M parameters) at DeMo's defaults, to set
// against the model's step (nn's BenchmarkCharLMStep).
//
//	go test -run '^$' -bench DeMo -benchtime 20x ./train/
func BenchmarkDeMo(b *testing.B) {
	m, err := nn.NewCharLM(nn.DefaultCharLMConfig(), 1)
	if err != nil {
		b.Fatal(err)
	}
	cfg, err := ParseSyncStrategy("demo")
	if err != nil {
		b.Fatal(err)
	}
	d, err := NewDeMo(cfg, m.Views(), m.Backend())
	if err != nil {
		b.Fatal(err)
	}
	g := randVec(d.Len(), 1)
	send, out := make([]float32, d.Len()), make([]float32, d.Len())
	b.SetBytes(int64(4 * d.Len()))
	for b.Loop() {
		d.Prepare(send, g)
		d.Commit()
		d.Finish(out, send)
	}
}

// roundMantissa with 7 bits is bfloat16's rounding; with fewer it keeps
// the top bits, to nearest and ties to even.
func TestRoundMantissa(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 10000 {
		x := float32(r.NormFloat64() * math.Pow(10, float64(r.IntN(20)-10)))
		if got, want := roundMantissa(x, 7), device.FromBF16(device.ToBF16(x)); got != want {
			t.Fatalf("roundMantissa(%g, 7) = %g, bf16 gives %g", x, got, want)
		}
	}
	for _, c := range []struct {
		x    float32
		bits int
		want float32
	}{
		{1.0625, 3, 1},    // 1 + 1/16: a tie, to even (1.000)
		{1.1875, 3, 1.25}, // 1 + 3/16: a tie, to even (1.010)
		{1.2, 3, 1.25},    // nearest of 1.125, 1.25
		{-3.9, 2, -4},     // carries into the exponent
		{0, 5, 0},         // zero stays
		{float32(math.Inf(-1)), 3, float32(math.Inf(-1))},
	} {
		if got := roundMantissa(c.x, c.bits); got != c.want {
			t.Errorf("roundMantissa(%g, %d) = %g, want %g", c.x, c.bits, got, c.want)
		}
	}
}

// With bits < 23 every sent coefficient has its low mantissa bits zero,
// and what was rounded off stays in the momentum: momentum + sent is
// still β·m + g.
func TestDeMoRoundsWhatItSends(t *testing.T) {
	cfg := DeMoConfig{Chunk: 4, TopK: 3, Beta: 0.9, Bits: 3}
	d := newTestDeMo(t, cfg)
	n := d.Len()
	send := make([]float32, n)
	for step := range 3 {
		demoStep(t, d, send, randVec(n, uint64(20+step)))
		nz := 0
		for _, v := range send {
			if v != 0 {
				nz++
				if math.Float32bits(v)&(1<<20-1) != 0 {
					t.Fatalf("sent %g keeps more than 3 mantissa bits", v)
				}
			}
		}
		if nz == 0 {
			t.Fatal("nothing sent")
		}
	}
}
