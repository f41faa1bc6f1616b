package device

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestAllFinite checks the AVX-512 kernel (where this CPU has it) and the
// portable bit test against math.IsNaN/IsInf for every length up to four
// 64-value steps and every position of one bad value, among values next to
// the bad ones (the largest finite values, subnormals).
func TestAllFinite(t *testing.T) {
	bad := []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)), math.Float32frombits(0x7fc00001), math.Float32frombits(0xff800001), math.Float32frombits(0x7f800001)}
	good := []float32{0, float32(math.Copysign(0, -1)), 1, -1, math.MaxFloat32, -math.MaxFloat32, math.SmallestNonzeroFloat32, math.Float32frombits(0x7f7fffff), math.Float32frombits(0xff7fffff), math.Float32frombits(0x00800000)}
	impls := map[string]func([]float32) bool{"go": allFiniteGo}
	if finiteVec {
		impls["avx512"] = func(x []float32) bool { return !nonFiniteAVX512(&x[0], len(x)) }
	} else {
		t.Log("no AVX-512 on this CPU: only the portable test runs")
	}
	r := rand.New(rand.NewPCG(3, 4))
	for name, f := range impls {
		for n := 1; n <= 4*64+17; n++ {
			// One more value than n, bad, past the end: never read.
			buf := make([]float32, n+1)
			for i := range buf {
				buf[i] = good[r.IntN(len(good))]
			}
			buf[n] = bad[0]
			x := buf[:n]
			if !f(x) {
				t.Fatalf("%s n=%d all finite: reported a bad value", name, n)
			}
			for pos := range n {
				old := x[pos]
				x[pos] = bad[r.IntN(len(bad))]
				if f(x) {
					t.Fatalf("%s n=%d: missed %v at %d", name, n, x[pos], pos)
				}
				x[pos] = old
			}
		}
	}
	if !AllFinite(nil) {
		t.Fatal("AllFinite(nil) = false")
	}
}

func BenchmarkAllFinite(b *testing.B) {
	x := make([]float32, 1<<18) // one 1 MiB chunk
	for i := range x {
		x[i] = float32(i) * 0.5
	}
	b.Run("avx512", func(b *testing.B) {
		if !finiteVec {
			b.Skip("no AVX-512")
		}
		b.SetBytes(int64(4 * len(x)))
		for b.Loop() {
			if nonFiniteAVX512(&x[0], len(x)) {
				b.Fatal("finite input")
			}
		}
	})
	b.Run("go", func(b *testing.B) {
		b.SetBytes(int64(4 * len(x)))
		for b.Loop() {
			if !allFiniteGo(x) {
				b.Fatal("finite input")
			}
		}
	})
}
