package device

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// refBF16 rounds through float64 arithmetic: the nearest bfloat16 of x,
// ties to the even mantissa, for finite x.
func refBF16(x float32) uint16 {
	b := math.Float32bits(x)
	lo, hi := b&0xffff0000, (b&0xffff0000)+0x10000 // the two candidates
	d0 := float64(math.Float32bits(x)) - float64(lo)
	d1 := float64(hi) - float64(math.Float32bits(x))
	switch {
	case d0 < d1:
		return uint16(lo >> 16)
	case d1 < d0:
		return uint16(hi >> 16)
	}
	if (lo>>16)&1 == 0 {
		return uint16(lo >> 16)
	}
	return uint16(hi >> 16)
}

func TestBF16Rounding(t *testing.T) {
	cases := []struct {
		name string
		in   uint32
		want uint16
	}{
		{"one", 0x3f800000, 0x3f80},
		{"below half, rounds down", 0x3f807fff, 0x3f80},
		{"tie to even (down)", 0x3f808000, 0x3f80},
		{"tie to even (up)", 0x3f818000, 0x3f82},
		{"above half, rounds up", 0x3f808001, 0x3f81},
		{"negative tie to even", 0xbf818000, 0xbf82},
		{"+0", 0, 0},
		{"-0", 0x80000000, 0x8000},
		{"smallest subnormal rounds to 0", 0x00000001, 0x0000},
		{"subnormal kept", 0x00010000, 0x0001},
		{"max float32 overflows to Inf", 0x7f7fffff, 0x7f80},
		{"largest finite bf16 stays", 0x7f7f0000, 0x7f7f},
		{"+Inf", 0x7f800000, 0x7f80},
		{"-Inf", 0xff800000, 0xff80},
		{"quiet NaN", 0x7fc00000, 0x7fc0},
		{"signalling NaN with low payload stays NaN", 0x7f800001, 0x7fc0},
		{"negative NaN", 0xff800100, 0xffc0},
	}
	for _, c := range cases {
		if got := BF16Bits(c.in); got != c.want {
			t.Errorf("%s: BF16Bits(%#08x) = %#04x, want %#04x", c.name, c.in, got, c.want)
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 100000 {
		b := r.Uint32()
		x := math.Float32frombits(b)
		if math.IsNaN(float64(x)) {
			if h := BF16Bits(b); !math.IsNaN(float64(FromBF16(h))) {
				t.Fatalf("NaN %#08x became %#04x", b, h)
			}
			continue
		}
		if math.Abs(float64(x)) >= float64(math.Float32frombits(0x7f7f8000)) {
			continue // rounds to Inf: checked above
		}
		if got, want := BF16Bits(b), refBF16(x); got != want {
			t.Fatalf("BF16Bits(%#08x) = %#04x, want %#04x", b, got, want)
		}
	}
}

// TestBF16VecMatchesScalar: the bulk (AVX2) conversions are bit for bit
// the scalar ones, at every length around the vector width.
func TestBF16VecMatchesScalar(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{0, 1, 15, 16, 17, 31, 32, 33, 100, 1000, 4099} {
		x := make([]float32, n)
		for i := range x {
			x[i] = math.Float32frombits(r.Uint32())
		}
		if n > 4 {
			x[0], x[1], x[2], x[3] = float32(math.Inf(1)), float32(math.NaN()), math.Float32frombits(0x3f808000), -0
		}
		got, want := make([]uint16, n), make([]uint16, n)
		EncodeBF16(got, x)
		for i, v := range x {
			want[i] = ToBF16(v)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("n=%d: EncodeBF16 differs from ToBF16", n)
		}
		back := make([]float32, n)
		DecodeBF16(back, got)
		for i, h := range got {
			if math.Float32bits(back[i]) != math.Float32bits(FromBF16(h)) {
				t.Fatalf("n=%d: DecodeBF16[%d] = %#08x, want %#08x", n, i, math.Float32bits(back[i]), math.Float32bits(FromBF16(h)))
			}
		}
	}
}
