package compression

import (
	"errors"
	"math"
	"math/big"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"

	"gonum.org/v1/gonum/mat"
)

func TestFP32BitExact(t *testing.T) {
	x := append(gradLike(5000, 1), specials()...)
	for i := 0; i < 1000; i++ {
		x = append(x, math.Float32frombits(rand.Uint32()))
	}
	b := FP32{}.Encode(nil, x)
	y := make([]float32, len(x))
	mustDecode(t, FP32{}, y, b)
	for i := range x {
		if math.Float32bits(x[i]) != math.Float32bits(y[i]) {
			t.Fatalf("value %d: %#x became %#x", i, math.Float32bits(x[i]), math.Float32bits(y[i]))
		}
	}
	if len(b) != headerLen(len(x))+4*len(x) {
		t.Fatalf("len %d", len(b))
	}
}

// halfTable lists every finite non-negative half as float64, ascending.
var halfTable = func() []float64 {
	var t []float64
	for h := 0; h < 0x7c00; h++ {
		t = append(t, float64(f16ToF32(uint16(h))))
	}
	return t
}()

// refF16 converts x to half by searching the table of all halves for the
// nearest (ties to even), with hivemind-style saturation: an independent
// reference for f32ToF16.
func refF16(x float32) uint16 {
	var sign uint16
	v := float64(x)
	if math.Signbit(v) {
		sign, v = 0x8000, -v
	}
	if math.IsNaN(v) {
		// Quiet, with the top payload bits: what VCVTPS2PH does.
		return sign | 0x7e00 | uint16(math.Float32bits(x)>>13)&0x3ff
	}
	if math.IsInf(v, 0) {
		return sign | 0x7c00
	}
	i := sort.SearchFloat64s(halfTable, v) // first ≥ v
	if i == len(halfTable) {
		return sign | 0x7bff // saturate
	}
	if halfTable[i] == v || i == 0 {
		return sign | uint16(i)
	}
	lo, hi := v-halfTable[i-1], halfTable[i]-v
	switch {
	case lo < hi:
		return sign | uint16(i-1)
	case hi < lo:
		return sign | uint16(i)
	case i%2 == 0:
		return sign | uint16(i)
	}
	return sign | uint16(i-1)
}

func TestF16AgainstReference(t *testing.T) {
	check := func(x float32) {
		got, want := f32ToF16(math.Float32bits(x)), refF16(x)
		if got != want {
			t.Fatalf("f32ToF16(%g [%#x]) = %#04x, want %#04x", x, math.Float32bits(x), got, want)
		}
	}
	for _, x := range specials() {
		check(x)
	}
	// Every half and the midpoints and neighbours around it.
	for h := 0; h < 0x7c00; h++ {
		f := f16ToF32(uint16(h))
		if got := f32ToF16(math.Float32bits(f)); got != uint16(h) {
			t.Fatalf("half %#04x does not round-trip: %#04x", h, got)
		}
		b := math.Float32bits(f)
		for _, d := range []uint32{1, 1 << 11, 1 << 12, 1<<12 + 1, 1<<13 - 1} {
			check(math.Float32frombits(b + d))
			check(-math.Float32frombits(b + d))
		}
	}
	r := rand.New(rand.NewPCG(7, 7))
	for i := 0; i < 1<<20; i++ {
		check(math.Float32frombits(r.Uint32()))
		// Bias towards the half range.
		check(math.Float32frombits(0x33000000 + r.Uint32N(0x48000000-0x33000000)))
	}
	// The bulk loop agrees with the scalar one.
	x := append(gradLike(10000, 2), specials()...)
	b := FP16{}.Encode(nil, x)
	h := headerLen(len(x))
	for i, v := range x {
		if got, want := uint16(b[h+2*i])|uint16(b[h+2*i+1])<<8, f32ToF16(math.Float32bits(v)); got != want {
			t.Fatalf("bulk %d: %#04x, scalar %#04x", i, got, want)
		}
	}
}

func TestF16ErrorBound(t *testing.T) {
	x := append(gradLike(100000, 3), specials()...)
	y := make([]float32, len(x))
	mustDecode(t, FP16{}, y, FP16{}.Encode(nil, x))
	for i, v := range x {
		a := math.Abs(float64(v))
		switch {
		case math.IsNaN(a):
			if !math.IsNaN(float64(y[i])) {
				t.Fatalf("NaN became %g", y[i])
			}
		case a > f16Max:
			want := math.Copysign(f16Max, float64(v))
			if math.IsInf(a, 0) {
				want = float64(v)
			}
			if float64(y[i]) != want {
				t.Fatalf("%g became %g, want %g (saturation)", v, y[i], want)
			}
		default:
			bound := math.Max(a*0x1p-11, 0x1p-25)
			if e := math.Abs(float64(y[i]) - float64(v)); e > bound {
				t.Fatalf("%g became %g: error %g > %g", v, y[i], e, bound)
			}
		}
	}
}

// refBF16 rounds x to 8 significant bits, ties to even, with big.Float.
func refBF16(x float32) uint16 {
	if math.IsNaN(float64(x)) {
		return uint16(math.Float32bits(x)>>16) | 0x40
	}
	f := new(big.Float).SetPrec(8).SetMode(big.ToNearestEven)
	f.SetFloat64(float64(x))
	v, _ := f.Float64()
	if math.Abs(v) > math.MaxFloat32 {
		return uint16(math.Float32bits(float32(math.Inf(int(math.Copysign(1, v))))) >> 16)
	}
	// Subnormal float32s have fewer significant bits: round at 2⁻¹³³.
	if math.Abs(float64(x)) < 0x1p-126 {
		q := math.RoundToEven(float64(x) / 0x1p-133)
		v = q * 0x1p-133
	}
	return uint16(math.Float32bits(float32(v)) >> 16)
}

func TestBF16AgainstReference(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	check := func(x float32) {
		got, want := f32ToBF16(math.Float32bits(x)), refBF16(x)
		if got != want {
			t.Fatalf("f32ToBF16(%g [%#x]) = %#04x, want %#04x", x, math.Float32bits(x), got, want)
		}
	}
	for _, x := range specials() {
		check(x)
	}
	for h := 0; h < 1<<16; h++ {
		b := uint32(h) << 16
		for _, d := range []uint32{0, 1, 0x7fff, 0x8000, 0x8001, 0xffff} {
			check(math.Float32frombits(b | d))
		}
	}
	for i := 0; i < 1<<20; i++ {
		check(math.Float32frombits(r.Uint32()))
	}
	x := append(gradLike(100000, 4), specials()...)
	y := make([]float32, len(x))
	mustDecode(t, BF16{}, y, BF16{}.Encode(nil, x))
	for i, v := range x {
		a := math.Abs(float64(v))
		if math.IsNaN(a) || math.IsInf(a, 0) || a > 3.38e38 {
			continue
		}
		bound := math.Max(a*0x1p-8, 0x1p-134)
		if e := math.Abs(float64(y[i]) - float64(v)); e > bound {
			t.Fatalf("%g became %g: error %g > %g", v, y[i], e, bound)
		}
	}
}

func TestInt8ErrorBound(t *testing.T) {
	for _, block := range []int{1, 7, 64, 256, 4096} {
		for _, n := range []int{0, 1, 255, 1000, 10000} {
			x := gradLike(n, uint64(block*n))
			if n > 300 {
				clear(x[:min(block, n)]) // an all-zero block
			}
			c := Int8{Block: block}
			b := c.Encode(nil, x)
			if want := headerLen(n) + uvarintLen(uint64(block)) + 4*((n+block-1)/block) + n; len(b) != want {
				t.Fatalf("block %d n %d: %d bytes, want %d", block, n, len(b), want)
			}
			y := make([]float32, n)
			mustDecode(t, Int8{}, y, b) // any Int8 decodes any block size
			for lo := 0; lo < n; lo += block {
				hi := min(lo+block, n)
				var absmax float64
				for _, v := range x[lo:hi] {
					absmax = math.Max(absmax, math.Abs(float64(v)))
				}
				// Half a quantisation step plus float32 rounding of the
				// scale, the product and the reciprocal.
				bound := absmax/254 + absmax*0x1p-20
				for i := lo; i < hi; i++ {
					if e := math.Abs(float64(y[i]) - float64(x[i])); e > bound {
						t.Fatalf("block %d n %d value %d: %g became %g, error %g > absmax/254 = %g",
							block, n, i, x[i], y[i], e, absmax/254)
					}
				}
			}
		}
	}
}

// refTopK returns the indices of the k largest magnitudes, ties (and NaN
// counted as largest) broken by lowest index, sorted ascending.
func refTopK(x []float32, k int) []int {
	idx := make([]int, len(x))
	for i := range idx {
		idx[i] = i
	}
	mag := func(i int) uint32 { return math.Float32bits(x[i]) & 0x7fffffff }
	sort.SliceStable(idx, func(a, b int) bool { return mag(idx[a]) > mag(idx[b]) })
	idx = idx[:k]
	sort.Ints(idx)
	return idx
}

func TestTopKKeepsExactlyTheLargest(t *testing.T) {
	ties := make([]float32, 1000)
	for i := range ties {
		ties[i] = float32(i%7) - 3
	}
	// Large inputs: the usual candidate path, and a tied one whose
	// threshold bucket holds nearly everything (the full-scan fallback).
	bigTies := make([]float32, 300000)
	for i := range bigTies {
		bigTies[i] = float32(i%3) * 1e-3
	}
	cases := map[string][]float32{
		"grad":    gradLike(20000, 5),
		"bigGrad": gradLike(300000, 6),
		"bigTies": bigTies,
		"ties":    ties,
		"zeros":   make([]float32, 500),
		"special": specials(),
		"one":     {-2},
	}
	for name, x := range cases {
		for _, frac := range []float64{0.001, 0.01, 0.1, 0.5, 1} {
			if len(x) > 100000 && frac > 0.01 {
				continue
			}
			c := &TopK{Frac: frac}
			k := c.K(len(x))
			b := c.Encode(nil, x)
			var it sparseIter
			if err := it.init(b, len(x)); err != nil {
				t.Fatal(err)
			}
			var got []int
			for {
				i, v, ok := it.next()
				if !ok {
					break
				}
				if math.Float32bits(v) != math.Float32bits(x[i]) {
					t.Fatalf("%s frac %g: value %d is %g, want %g", name, frac, i, v, x[i])
				}
				got = append(got, i)
			}
			if it.err != nil {
				t.Fatal(it.err)
			}
			if want := refTopK(x, k); !slices.Equal(got, want) {
				t.Fatalf("%s frac %g: kept %v, want %v", name, frac, got, want)
			}
			y := make([]float32, len(x))
			mustDecode(t, &TopK{}, y, b)
			kept := make([]bool, len(x))
			for _, i := range got {
				kept[i] = true
			}
			for i := range y {
				if kept[i] {
					if math.Float32bits(y[i]) != math.Float32bits(x[i]) {
						t.Fatalf("decoded %d = %g", i, y[i])
					}
				} else if y[i] != 0 {
					t.Fatalf("%s frac %g: decoded %d = %g, want 0 (kept %v)", name, frac, i, y[i], got)
				}
			}
		}
	}
}

func TestKFor(t *testing.T) {
	for _, c := range []struct {
		n    int
		frac float64
		k    int
	}{{0, 0.01, 0}, {1, 0.01, 1}, {100, 0.01, 1}, {100, 0.07, 7}, {1000, 0.0015, 2}, {10, 1, 10}, {149, 0.01, 1}, {150, 0.01, 2}} {
		if k := kFor(c.n, c.frac); k != c.k {
			t.Errorf("kFor(%d, %g) = %d, want %d", c.n, c.frac, k, c.k)
		}
	}
}

func TestRandK(t *testing.T) {
	x := gradLike(10007, 6)
	c := &RandK{Frac: 0.01, Seed: 42}
	k := c.K(len(x))
	b := c.Encode(nil, x)
	if want := headerLen(len(x)) + uvarintLen(uint64(k)) + 8 + 4*k; len(b) != want {
		t.Fatalf("%d bytes, want %d", len(b), want)
	}
	y := make([]float32, len(x))
	mustDecode(t, &RandK{}, y, b)
	// One kept value per stratum [⌊j·n/k⌋, ⌊(j+1)·n/k⌋), equal to the input.
	n := len(x)
	for j := 0; j < k; j++ {
		lo, hi := j*n/k, (j+1)*n/k
		kept := 0
		for i := lo; i < hi; i++ {
			if y[i] != 0 {
				kept++
				if y[i] != x[i] {
					t.Fatalf("value %d: %g, want %g", i, y[i], x[i])
				}
			}
		}
		if kept > 1 {
			t.Fatalf("stratum %d kept %d values", j, kept)
		}
	}
	// Same seed and step, same encoding; next step, other indices.
	c2 := &RandK{Frac: 0.01, Seed: 42}
	if b2 := c2.Encode(nil, x); !slices.Equal(b, b2) {
		t.Fatal("same seed and step gave different bytes")
	}
	if b3 := c2.Encode(nil, x); slices.Equal(b, b3) {
		t.Fatal("next step drew the same indices")
	}
	// Inclusion is uniform within a stratum: n=1000, k=10, 20000 draws, each
	// index expected 200 times.
	counts := make([]int, 1000)
	v := make([]float32, 1000)
	for i := range v {
		v[i] = 1
	}
	w := make([]float32, 1000)
	rk := &RandK{Frac: 0.01, Seed: 1}
	var buf []byte
	for s := 0; s < 20000; s++ {
		buf = rk.Encode(buf, v)
		mustDecode(t, rk, w, buf)
		for i, u := range w {
			if u != 0 {
				counts[i]++
			}
		}
	}
	for i, cnt := range counts {
		if cnt < 130 || cnt > 270 {
			t.Fatalf("index %d kept %d times of 20000, expected about 200", i, cnt)
		}
	}
}

func TestSign(t *testing.T) {
	x := append(gradLike(5000, 8), specials()[:20]...)
	for _, c := range []Sign{{}, {Block: 100}, {Block: 7}, {Block: -1}} {
		b := c.Encode(nil, x)
		y := make([]float32, len(x))
		mustDecode(t, Sign{}, y, b)
		block := c.block(len(x))
		for lo := 0; lo < len(x); lo += block {
			hi := min(lo+block, len(x))
			var s float64
			for _, v := range x[lo:hi] {
				s += math.Abs(float64(v))
			}
			scale := float32(s / float64(hi-lo))
			for i := lo; i < hi; i++ {
				want := scale
				if math.Signbit(float64(x[i])) {
					want = -scale
				}
				if y[i] != want {
					t.Fatalf("%s: value %d (%g) became %g, want %g", c.Name(), i, x[i], y[i], want)
				}
			}
		}
	}
}

// lowRank returns a rows×cols matrix of rank r plus noise of the given size.
func lowRank(rows, cols, r int, noise float64, seed uint64) []float32 {
	g := rand.New(rand.NewPCG(seed, 1))
	m := make([]float32, rows*cols)
	for l := 0; l < r; l++ {
		u := make([]float64, rows)
		v := make([]float64, cols)
		for i := range u {
			u[i] = g.NormFloat64()
		}
		for j := range v {
			v[j] = g.NormFloat64() / float64(l+1)
		}
		for i := range u {
			for j := range v {
				m[i*cols+j] += float32(u[i] * v[j])
			}
		}
	}
	for i := range m {
		m[i] += float32(g.NormFloat64() * noise)
	}
	return m
}

func TestPowerSGDLowRankIsExact(t *testing.T) {
	m := lowRank(60, 40, 3, 0, 1)
	c := &PowerSGD{Rank: 3}
	if err := c.SetLayout([]Shape{{60, 40}}); err != nil {
		t.Fatal(err)
	}
	y := make([]float32, len(m))
	b := c.Encode(nil, m)
	mustDecode(t, &PowerSGD{}, y, b)
	if want := headerLen(len(m)) + 1 + 1 + 1 + 1 + 4*3*(60+40); len(b) != want {
		t.Fatalf("%d bytes, want %d", len(b), want)
	}
	d := make([]float32, len(m))
	for i := range d {
		d[i] = y[i] - m[i]
	}
	if rel := norm2(d) / norm2(m); rel > 1e-5 {
		t.Fatalf("rank-3 matrix at rank 3: relative error %g", rel)
	}
}

// With a fixed matrix, warm-started power iteration converges to the best
// rank-r approximation (Eckart–Young): after enough steps the error is within
// 1 % of √(Σ_{i>r} σᵢ²).
func TestPowerSGDWarmStartConverges(t *testing.T) {
	rows, cols, r := 50, 30, 2
	m := lowRank(rows, cols, 6, 0.01, 2)
	var svd mat.SVD
	md := mat.NewDense(rows, cols, nil)
	for i := 0; i < rows; i++ {
		for j := 0; j < cols; j++ {
			md.Set(i, j, float64(m[i*cols+j]))
		}
	}
	if !svd.Factorize(md, mat.SVDNone) {
		t.Fatal("svd failed")
	}
	var best float64
	for _, s := range svd.Values(nil)[r:] {
		best += s * s
	}
	best = math.Sqrt(best)
	c := &PowerSGD{Rank: r, Seed: 5}
	if err := c.SetLayout([]Shape{{rows, cols}}); err != nil {
		t.Fatal(err)
	}
	y := make([]float32, len(m))
	d := make([]float32, len(m))
	var buf []byte
	var errs []float64
	for step := 0; step < 40; step++ {
		buf = c.Encode(buf, m)
		mustDecode(t, c, y, buf)
		for i := range d {
			d[i] = y[i] - m[i]
		}
		errs = append(errs, norm2(d))
	}
	if errs[len(errs)-1] > 1.01*best {
		t.Fatalf("after 40 warm-started steps error %g, best rank-%d error %g (first step %g)", errs[len(errs)-1], r, best, errs[0])
	}
	if errs[0] <= errs[len(errs)-1]*1.001 && errs[0] > 1.01*best {
		t.Fatalf("warm start did not improve: %g → %g", errs[0], errs[len(errs)-1])
	}
}

func TestPowerSGDLayoutAndRaw(t *testing.T) {
	layout := []Shape{{20, 30}, {1, 30}, {30, 5}, {1, 5}, {3, 3}}
	n := 0
	for _, s := range layout {
		n += s.Rows * s.Cols
	}
	x := gradLike(n, 9)
	c := &PowerSGD{Rank: 2}
	if err := c.SetLayout(layout); err != nil {
		t.Fatal(err)
	}
	y := make([]float32, n)
	mustDecode(t, &PowerSGD{}, y, c.Encode(nil, x))
	// Biases and the 3×3 matrix ((3+3)·2 ≥ 9) are raw: bit-exact.
	off := 0
	for _, s := range layout {
		sz := s.Rows * s.Cols
		if effRank(s, 2) == 0 {
			for i := off; i < off+sz; i++ {
				if y[i] != x[i] {
					t.Fatalf("raw tensor %v: value %d %g, want %g", s, i, y[i], x[i])
				}
			}
		}
		off += sz
	}
	if err := c.SetLayout([]Shape{{0, 3}}); !errors.Is(err, ErrBadSpec) {
		t.Fatalf("bad shape: %v", err)
	}
	// Without a layout the vector is folded.
	f := &PowerSGD{Rank: 1}
	mustDecode(t, f, make([]float32, 1001), f.Encode(nil, gradLike(1001, 1)))
	if l := f.Layout(); len(l) != 2 || l[0] != (Shape{32, 31}) || l[1] != (Shape{1, 9}) {
		t.Fatalf("folded layout %v", l)
	}
}

// Every codec round-trips the empty vector and rejects a length mismatch.
func TestEmptyAndLengthMismatch(t *testing.T) {
	for _, c := range allCodecs() {
		b := c.Encode(nil, nil)
		if err := c.Decode(nil, b); err != nil {
			t.Errorf("%s: empty: %v", c.Name(), err)
		}
		b = c.Encode(nil, gradLike(100, 1))
		if err := c.Decode(make([]float32, 99), b); !errors.Is(err, ErrLength) {
			t.Errorf("%s: 100 values into 99: %v", c.Name(), err)
		}
		if err := c.Decode(make([]float32, 100), b[:len(b)-1]); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: truncated: %v", c.Name(), err)
		}
		if err := c.Decode(make([]float32, 100), append(b, 0)); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: trailing byte: %v", c.Name(), err)
		}
		if len(b) > MaxEncodedLen(c.ID(), 100) {
			t.Errorf("%s: %d bytes > MaxEncodedLen %d", c.Name(), len(b), MaxEncodedLen(c.ID(), 100))
		}
	}
}

// Encode reuses dst and does not allocate once it has capacity; Decode never
// allocates.
func TestNoAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("allocation counts")
	}
	x := gradLike(1<<14, 2)
	y := make([]float32, len(x))
	cs := allCodecs()
	cs = append(cs, NewErrorFeedback(&TopK{}), NewErrorFeedback(Int8{}), NewErrorFeedback(Sign{}))
	for _, m := range []EntropyMode{EntropyS2, EntropyZstd} {
		e, _ := NewEntropy(&TopK{}, m)
		cs = append(cs, e)
	}
	for _, c := range cs {
		buf := c.Encode(nil, x)
		buf = c.Encode(buf, x)
		mustDecode(t, c, y, buf)
		if a := testing.AllocsPerRun(5, func() { buf = c.Encode(buf, x) }); a != 0 {
			t.Errorf("%s: Encode: %v allocs", c.Name(), a)
		}
		if a := testing.AllocsPerRun(5, func() { _ = c.Decode(y, buf) }); a != 0 {
			t.Errorf("%s: Decode: %v allocs", c.Name(), a)
		}
	}
}
