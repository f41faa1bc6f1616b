package device

import (
	"math/rand/v2"
	"testing"
)

// TestMinMax checks the AVX-512 kernel (where this CPU has it) and the
// portable loop for every length up to four 64-value steps and a tail,
// with equal values among them, and that nothing past len(a) is touched.
func TestMinMax(t *testing.T) {
	impls := map[string]func(a, b []float32){"go": minMaxGo}
	if finiteVec {
		impls["avx512"] = func(a, b []float32) { minMaxAVX512(&a[0], &b[0], len(a)) }
	} else {
		t.Log("no AVX-512 on this CPU: only the portable loop runs")
	}
	r := rand.New(rand.NewPCG(7, 8))
	for name, f := range impls {
		for n := 1; n <= 4*64+17; n++ {
			a, b := make([]float32, n+1), make([]float32, n+1)
			for i := range a {
				a[i], b[i] = float32(r.IntN(9)-4), float32(r.IntN(9)-4)
			}
			a[n], b[n] = 9, -9 // past the end: must stay
			wa, wb := append([]float32(nil), a...), append([]float32(nil), b...)
			for i := range n {
				wa[i], wb[i] = min(a[i], b[i]), max(a[i], b[i])
			}
			f(a[:n], b[:n])
			for i := range a {
				if a[i] != wa[i] || b[i] != wb[i] {
					t.Fatalf("%s n=%d: [%d] = %v, %v; want %v, %v", name, n, i, a[i], b[i], wa[i], wb[i])
				}
			}
		}
	}
}
