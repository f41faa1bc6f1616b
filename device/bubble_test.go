package device_test

import (
	"math"
	"math/rand/v2"
	"testing"
	"testing/synctest"

	"github.com/starling-ml/starling/device"
)

// TestGemmInBubble: a GEMM large enough to be split over goroutines runs
// inside a synctest bubble, as the strategies' tests do. Its goroutines
// start and end within the call; a pool parked between calls lived outside
// every bubble, and the runtime aborted the test binary ("WaitGroup.Add
// called from inside and outside synctest bubble").
func TestGemmInBubble(t *testing.T) {
	const m, n, k = 256, 256, 512
	r := rand.New(rand.NewPCG(3, 4))
	a, b := make([]float32, m*k), make([]float32, k*n)
	for i := range a {
		a[i] = r.Float32() - 0.5
	}
	for i := range b {
		b[i] = r.Float32() - 0.5
	}
	want := refGemm(false, false, m, n, k, 1, a, k, b, n, 0, make([]float32, m*n), n)
	for _, be := range []device.Backend{device.Default(), device.NewFast()} {
		for range 2 { // a second bubble after the first
			synctest.Test(t, func(t *testing.T) {
				c := make([]float32, m*n)
				be.Gemm(false, false, m, n, k, 1, a, k, b, n, 0, c, n)
				for i := range c {
					if d := math.Abs(float64(c[i] - want[i])); d > 1e-3 {
						t.Fatalf("%s: c[%d] = %v, want %v", be.Name(), i, c[i], want[i])
					}
				}
			})
		}
	}
}

// TestPointwiseInBubble: a pointwise kernel split over goroutines runs
// inside a synctest bubble, as TestGemmInBubble's GEMM does.
func TestPointwiseInBubble(t *testing.T) {
	x := make([]float32, 1<<18)
	for i := range x {
		x[i] = float32(i%200-100) / 25
	}
	want := make([]float32, len(x))
	device.NewCPU().GELU(want, nil, x)
	for range 2 {
		synctest.Test(t, func(t *testing.T) {
			y := make([]float32, len(x))
			device.Default().GELU(y, make([]float32, len(x)), x)
			for i := range y {
				if d := math.Abs(float64(y[i] - want[i])); d > 1e-5 {
					t.Fatalf("GELU(%v) = %v, want %v", x[i], y[i], want[i])
				}
			}
		})
	}
}
