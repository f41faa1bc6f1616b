package device_test

import (
	"math/rand/v2"
	"testing"

	"github.com/starling-ml/starling/device"
	"github.com/starling-ml/starling/device/devicetest"
)

func TestFastConformance(t *testing.T) {
	for _, isa := range device.SupportedISAs() {
		t.Run(isa, func(t *testing.T) { devicetest.Run(t, device.NewFastISA(isa)) })
	}
}

// TestGemmDifferential compares every GEMM implementation with the float64
// reference over random shapes, transposes, strides, alpha and beta. The
// tolerance (devicetest.CheckGemm) is 1.6e-6·(k·|alpha| + |beta| + 1)
// absolute for inputs in [-1, 1): a few float32 ulps per accumulated term.
func TestGemmDifferential(t *testing.T) {
	for _, isa := range device.SupportedISAs() {
		t.Run(isa, func(t *testing.T) {
			be := device.NewFastISA(isa)
			r := rand.New(rand.NewPCG(21, 22))
			iters := 400
			if testing.Short() {
				iters = 100
			}
			for it := 0; it < iters; it++ {
				m, n, k := 1+r.IntN(90), 1+r.IntN(90), 1+r.IntN(300)
				if it%10 == 0 { // cross the cache-block boundaries
					m, n, k = 1+r.IntN(400), 1+r.IntN(1200), 1+r.IntN(700)
				}
				tA, tB := r.IntN(2) == 1, r.IntN(2) == 1
				alpha := []float32{1, -1, 0.5, 3}[r.IntN(4)]
				beta := []float32{0, 1, -0.25, 2}[r.IntN(4)]
				if err := devicetest.CheckGemm(be, r, tA, tB, m, n, k, alpha, beta); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}
