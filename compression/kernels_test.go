package compression

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// randomBits returns n floats with random bit patterns, biased so that every
// class (zero, subnormal, the half range, huge, Inf, NaN) shows up.
func randomBits(n int, r *rand.Rand) []float32 {
	x := make([]float32, n)
	for i := range x {
		switch r.IntN(6) {
		case 0:
			x[i] = math.Float32frombits(r.Uint32())
		case 1:
			x[i] = math.Float32frombits(r.Uint32() & 0x807fffff) // zero/subnormal
		case 2:
			x[i] = math.Float32frombits(r.Uint32()&0x80ffffff | 0x7f000000) // huge, Inf, NaN
		case 3:
			x[i] = float32(r.NormFloat64() * 70000) // around the fp16 limit
		default:
			x[i] = math.Float32frombits(0x33000000+r.Uint32N(0x48000000-0x33000000)) * float32(1-2*r.IntN(2))
		}
	}
	return x
}

// The dispatched bulk loops (AVX2 on amd64 CPUs that have it) give bit for
// bit the pure-Go results, so peers on different machines agree.
func TestKernelsMatchPureGo(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	lengths := []int{0, 1, 15, 16, 17, 31, 32, 33, 100, 1000, 4099}
	for _, n := range lengths {
		for rep := 0; rep < 20; rep++ {
			x := randomBits(n, r)

			a, b := make([]byte, 2*n), make([]byte, 2*n)
			encodeF16(a, x)
			encodeF16Go(b, x)
			if !slices.Equal(a, b) {
				t.Fatalf("fp16 encode differs (n=%d)", n)
			}
			encodeBF16(a, x)
			encodeBF16Go(b, x)
			if !slices.Equal(a, b) {
				t.Fatalf("bf16 encode differs (n=%d)", n)
			}
			if absmaxBits(x) != absmaxBitsGo(x) {
				t.Fatalf("absmax %#x, pure Go %#x (n=%d)", absmaxBits(x), absmaxBitsGo(x), n)
			}

			// Quantise finite values of magnitude at most 127.25 (the
			// encoder's x·127/absmax is at most 127 plus rounding), with
			// exact halves to check round-half-even.
			y := make([]float32, n)
			for i := range y {
				y[i] = float32(r.IntN(255)-127) + float32(r.IntN(2))*0.25
				if r.IntN(4) == 0 {
					y[i] = float32(r.IntN(254)-127) + 0.5
				}
			}
			qa, qb := make([]byte, n), make([]byte, n)
			inv := float32(1)
			if rep%2 == 1 {
				inv = 127 / 127.25
			}
			// FP4 pairs: finite values scaled as the encoder scales a
			// block (inv maps its absmax to 24), with zeros, negative
			// zeros, subnormals and the absmax itself among them.
			if n >= 2 {
				z := randomBits(n&^1, r)
				var mx float32
				for i := range z {
					switch r.IntN(8) {
					case 0:
						z[i] = float32(math.Copysign(0, float64(1-2*r.IntN(2))))
					case 1:
						z[i] = math.Float32frombits(r.Uint32() & 0x807fffff)
					}
					if a := math.Float32frombits(math.Float32bits(z[i]) & 0x7fffffff); a >= 0x1p100 || a != a {
						z[i] = float32(r.NormFloat64())
					}
					mx = max(mx, float32(math.Abs(float64(z[i]))))
				}
				// (A float32 inv that overflows sends the encoder to float64.)
				if finv := float32(4 * fp4Max / float64(mx)); mx > 0 && !math.IsInf(float64(finv), 0) {
					pa, pb := make([]byte, len(z)/2), make([]byte, len(z)/2)
					packFP4Pairs(pa, z, finv)
					packFP4PairsGo(pb, z, finv)
					if !slices.Equal(pa, pb) {
						t.Fatalf("fp4 pairs differ (n=%d)", n)
					}
				}
				// Every multiple of ¼ up to 24, at and around the
				// thresholds of fp4Code.
				for i := range z {
					z[i] = float32(r.IntN(193)-96) / 4
				}
				for _, finv := range []float32{1, 0.999, 1.001, 1.3} { // |v·inv| < 32, as in the encoder
					pa, pb := make([]byte, len(z)/2), make([]byte, len(z)/2)
					packFP4Pairs(pa, z, finv)
					packFP4PairsGo(pb, z, finv)
					if !slices.Equal(pa, pb) {
						t.Fatalf("fp4 pairs of quarters differ (n=%d, inv %v)", n, finv)
					}
				}
			}

			quantise(qa, y, inv)
			quantiseGo(qb, y, inv)
			if !slices.Equal(qa, qb) {
				t.Fatalf("quantise differs (n=%d)", n)
			}
			da, db := make([]float32, n), make([]float32, n)
			s := float32(r.Float64())
			dequantise(da, qa, s)
			dequantiseGo(db, qa, s)
			if !bitsEqual(da, db) {
				t.Fatalf("dequantise differs (n=%d)", n)
			}
		}
	}
	// Every half pattern decodes identically.
	all := make([]byte, 2<<16)
	for h := 0; h < 1<<16; h++ {
		all[2*h], all[2*h+1] = byte(h), byte(h>>8)
	}
	da, db := make([]float32, 1<<16), make([]float32, 1<<16)
	decodeF16(da, all)
	decodeF16Go(db, all)
	if !bitsEqual(da, db) {
		for i := range da {
			if math.Float32bits(da[i]) != math.Float32bits(db[i]) {
				t.Fatalf("half %#04x decodes to %#x, pure Go %#x", i, math.Float32bits(da[i]), math.Float32bits(db[i]))
			}
		}
	}
}
