package compression

import (
	"math"
	"math/rand/v2"
	"testing"
)

// gradLike returns n gradient-like values: Laplace-distributed with a scale
// that changes every 1024 values over four decades (the layers of one flat
// parameter vector), about 1 % exact zeros (dead ReLUs) and some repeated
// values, from a fixed seed.
func gradLike(n int, seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	x := make([]float32, n)
	scale := 1e-3
	for i := range x {
		if i%1024 == 0 {
			scale = math.Pow(10, -5+4*r.Float64())
		}
		switch u := r.Float64(); {
		case u < 0.01:
			x[i] = 0
		case u < 0.02 && i > 0:
			x[i] = -x[i-1]
		default:
			x[i] = float32(r.ExpFloat64() * scale * float64(1-2*r.IntN(2)))
		}
	}
	return x
}

// specials are float32 values at the edges of every format.
func specials() []float32 {
	inf := float32(math.Inf(1))
	vals := []float32{
		0, float32(math.Copysign(0, -1)), 1, -1, 0.5, 65504, 65505, 65519, 65520, 65536, -65520,
		6.1035156e-05, 6.097555e-05, 5.9604645e-08, 2.9802322e-08, 2.9802326e-08, 1e-9,
		math.MaxFloat32, -math.MaxFloat32, math.SmallestNonzeroFloat32, 1.1754944e-38,
		inf, -inf, float32(math.NaN()), math.Float32frombits(0x7f800001), math.Float32frombits(0xffc00000),
		3.3895314e38, 1.0009766, 1.0004883, 1.0014648,
	}
	return vals
}

// codecs returns one instance of every base codec with non-default parameters
// where it has them.
func allCodecs() []Codec {
	return []Codec{
		FP32{}, FP16{}, BF16{}, Int8{Block: 64}, &TopK{Frac: 0.05}, &RandK{Frac: 0.05, Seed: 3},
		Sign{Block: 100}, &PowerSGD{Rank: 2, Seed: 1}, FP4{Block: 33}, Int4{Block: 16},
	}
}

func mustDecode(t testing.TB, c Codec, dst []float32, b []byte) {
	t.Helper()
	if err := c.Decode(dst, b); err != nil {
		t.Fatalf("%s: decode: %v", c.Name(), err)
	}
}

func norm2(x []float32) float64 { return math.Sqrt(sumSq(x)) }

func nil2rand() *rand.Rand { return rand.New(rand.NewPCG(77, 78)) }
