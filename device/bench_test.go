package device_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/starling-ml/starling/device"
	"github.com/starling-ml/starling/device/devicetest"
)

// gemmShape is one GEMM of a model step: C (m×n) = op(A) (m×k) · op(B) (k×n).
type gemmShape struct {
	name    string
	tA, tB  bool
	m, n, k int
}

// Shapes of the MLP 784-128-10 at batch 256 and of the FedAvg CNN
// (conv5x5×32, pool, conv5x5×64, pool, FC 3136→512, FC 512→10) at batch 64
// with im2col convolutions.
var gemmShapes = []gemmShape{
	{"mlp/fc1-fwd", false, false, 256, 128, 784},
	{"mlp/fc1-dW", true, false, 784, 128, 256},
	{"mlp/fc1-dX", false, true, 256, 784, 128},
	{"mlp/fc2-fwd", false, false, 256, 10, 128},
	{"mlp/fc2-dW", true, false, 128, 10, 256},
	{"mlp/fc2-dX", false, true, 256, 128, 10},
	{"cnn/conv1-fwd", false, true, 64 * 28 * 28, 32, 25},
	{"cnn/conv1-dW", true, false, 32, 25, 64 * 28 * 28},
	{"cnn/conv2-fwd", false, true, 64 * 14 * 14, 64, 800},
	{"cnn/conv2-dW", true, false, 64, 800, 64 * 14 * 14},
	{"cnn/conv2-dcol", false, false, 64 * 14 * 14, 800, 64},
	{"cnn/fc1-fwd", false, true, 64, 512, 3136},
	{"cnn/fc1-dW", true, false, 512, 3136, 64},
	{"cnn/fc1-dX", false, false, 64, 3136, 512},
}

func gemmOperands(s gemmShape) (a, b, c []float32) {
	r := rand.New(rand.NewPCG(1, 1))
	return devicetest.RandSlice(r, s.m*s.k), devicetest.RandSlice(r, s.k*s.n), make([]float32, s.m*s.n)
}

// BenchmarkGemm runs every model shape on the fast backend and on gonum in
// the same run; compare the GFLOP/s metrics.
func BenchmarkGemm(b *testing.B) {
	backends := []device.Backend{device.NewFast(), device.NewCPU()}
	for _, s := range gemmShapes {
		for _, be := range backends {
			b.Run(fmt.Sprintf("%s-%dx%dx%d/%s", s.name, s.m, s.n, s.k, be.Name()), func(b *testing.B) {
				benchGemm(b, be, s)
			})
		}
	}
}

func benchGemm(b *testing.B, be device.Backend, s gemmShape) {
	a, bb, c := gemmOperands(s)
	lda, ldb := s.k, s.n
	if s.tA {
		lda = s.m
	}
	if s.tB {
		ldb = s.k
	}
	b.ReportAllocs()
	for b.Loop() {
		be.Gemm(s.tA, s.tB, s.m, s.n, s.k, 1, a, lda, bb, ldb, 0, c, s.n)
	}
	b.ReportMetric(2*float64(s.m)*float64(s.n)*float64(s.k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}
