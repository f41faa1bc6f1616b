package device_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/starling-ml/starling/device"
	"github.com/starling-ml/starling/device/devicetest"
	"github.com/starling-ml/starling/internal/rusage"
)

// gemmShape is one GEMM of a model step: C (m×n) = op(A) (m×k) · op(B) (k×n).
type gemmShape struct {
	name    string
	tA, tB  bool
	m, n, k int
}

// The GEMMs of a training step as nn/ calls them (weights stored out×in,
// PyTorch's layout): forward Y = X·Wᵀ (NT), weight gradient dW = dYᵀ·X
// (TN), input gradient dX = dY·W (NN). The MLP 784-128-10 at batch 256; the
// FedAvg CNN (conv5x5×32 same, pool, conv5x5×64 same, pool, FC 3136→512,
// FC 512→10) at batch 64 with im2col convolutions (rows = N·H·W output
// pixels, k = C·5·5).
var gemmShapes = []gemmShape{
	{"mlp/fc1-fwd", false, true, 256, 128, 784},
	{"mlp/fc1-dW", true, false, 128, 784, 256},
	{"mlp/fc1-dX", false, false, 256, 784, 128},
	{"mlp/fc2-fwd", false, true, 256, 10, 128},
	{"mlp/fc2-dW", true, false, 10, 128, 256},
	{"mlp/fc2-dX", false, false, 256, 128, 10},
	{"cnn/conv1-fwd", false, true, 64 * 28 * 28, 32, 25},
	{"cnn/conv1-dW", true, false, 32, 25, 64 * 28 * 28},
	{"cnn/conv2-fwd", false, true, 64 * 14 * 14, 64, 800},
	{"cnn/conv2-dW", true, false, 64, 800, 64 * 14 * 14},
	{"cnn/conv2-dcol", false, false, 64 * 14 * 14, 800, 64},
	{"cnn/fc1-fwd", false, true, 64, 512, 3136},
	{"cnn/fc1-dW", true, false, 512, 3136, 64},
	{"cnn/fc1-dX", false, false, 64, 3136, 512},
	{"cnn/fc2-fwd", false, true, 64, 10, 512},
	{"cnn/fc2-dW", true, false, 10, 512, 64},
	{"cnn/fc2-dX", false, false, 64, 512, 10},
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
	cpu0 := rusage.CPU()
	for b.Loop() {
		be.Gemm(s.tA, s.tB, s.m, s.n, s.k, 1, a, lda, bb, ldb, 0, c, s.n)
	}
	flops := 2 * float64(s.m) * float64(s.n) * float64(s.k) * float64(b.N)
	b.ReportMetric(flops/b.Elapsed().Seconds()/1e9, "GFLOP/s")
	// Per CPU-second of this process: on a shared machine, where the wall
	// clock includes time spent waiting for a core, this is the steadier
	// measure of kernel speed (divide by the cores used for per-core speed).
	if cpu := rusage.CPU() - cpu0; cpu > 0 {
		b.ReportMetric(flops/cpu.Seconds()/1e9, "GFLOP/cpu-s")
	}
}

// BenchmarkGemmMixed runs the CNN's shapes as nn's BF16 mode calls them
// (bfloat16 weights; the convolutions' im2col matrix in bfloat16, so a
// convolution's forward reads two bfloat16 operands and its weight
// gradient one) against the float32 GEMM in the same run.
func BenchmarkGemmMixed(b *testing.B) {
	be := device.NewFast()
	for _, s := range gemmShapes[6:] {
		conv := strings.HasPrefix(s.name, "cnn/conv")
		bfA := conv && strings.HasSuffix(s.name, "-fwd")
		bfB := !strings.HasSuffix(s.name, "-dW") || conv
		if !bfA && !bfB {
			continue
		}
		for _, p := range []string{"fp32", "bf16"} {
			b.Run(fmt.Sprintf("%s-%dx%dx%d/precision=%s", s.name, s.m, s.n, s.k, p), func(b *testing.B) {
				a, bb, c := gemmOperands(s)
				lda, ldb := s.k, s.n
				if s.tA {
					lda = s.m
				}
				if s.tB {
					ldb = s.k
				}
				am, bm := device.F32(a, lda), device.F32(bb, ldb)
				if p == "bf16" && bfA {
					h := make([]uint16, len(a))
					device.EncodeBF16(h, a)
					am = device.BF16(h, lda)
				}
				if p == "bf16" && bfB {
					h := make([]uint16, len(bb))
					device.EncodeBF16(h, bb)
					bm = device.BF16(h, ldb)
				}
				b.ReportAllocs()
				cpu0 := rusage.CPU()
				for b.Loop() {
					device.GemmMixed(be, s.tA, s.tB, s.m, s.n, s.k, 1, am, bm, 0, c, s.n)
				}
				flops := 2 * float64(s.m) * float64(s.n) * float64(s.k) * float64(b.N)
				b.ReportMetric(flops/b.Elapsed().Seconds()/1e9, "GFLOP/s")
				if cpu := rusage.CPU() - cpu0; cpu > 0 {
					b.ReportMetric(flops/cpu.Seconds()/1e9, "GFLOP/cpu-s")
				}
			})
		}
	}
}

// Parameter counts: the MLP 784-128-10 and the FedAvg CNN.
const (
	mlpParams = 784*128 + 128 + 128*10 + 10
	cnnParams = 32*25 + 32 + 64*800 + 64 + 3136*512 + 512 + 512*10 + 10
)

// BenchmarkVec runs the elementwise kernels on the fast backend and on the
// CPU baseline in the same run; MB/s counts every byte read or written.
func BenchmarkVec(b *testing.B) {
	backends := []device.Backend{device.NewFast(), device.NewCPU()}
	r := rand.New(rand.NewPCG(3, 3))
	for _, n := range []int{mlpParams, cnnParams} {
		x, y, z := devicetest.RandSlice(r, n), devicetest.RandSlice(r, n), devicetest.RandSlice(r, n)
		srcs := make([][]float32, 8)
		ws := make([]float32, len(srcs))
		for j := range srcs {
			srcs[j] = devicetest.RandSlice(r, n)
			ws[j] = 1 / float32(len(srcs))
		}
		for _, k := range []struct {
			name  string
			bytes int // per element
			run   func(be device.Backend)
		}{
			{"Axpy", 12, func(be device.Backend) { be.Axpy(1e-3, x, y) }},
			{"Scale", 8, func(be device.Backend) { be.Scale(1, y) }},
			{"Dot", 8, func(be device.Backend) { _ = be.Dot(x, y) }},
			{"SumSquares", 4, func(be device.Backend) { _ = be.SumSquares(x) }},
			{"WeightedSum8", 36, func(be device.Backend) { be.WeightedSum(z, srcs, ws) }},
			{"ReLUBackward", 12, func(be device.Backend) { be.ReLUBackward(z, y, x) }},
			{"SGDMomentum", 20, func(be device.Backend) { be.SGD(x, y, z, 1e-6, 0.9, 0, false) }},
			{"Adam", 28, func(be device.Backend) { be.Adam(x, y, z, srcs[0], 1, 1e-6, 0.9, 0.999, 1e-8, 0, false) }},
		} {
			for _, be := range backends {
				b.Run(fmt.Sprintf("%s/n=%d/%s", k.name, n, be.Name()), func(b *testing.B) {
					b.SetBytes(int64(k.bytes * n))
					b.ReportAllocs()
					for b.Loop() {
						k.run(be)
					}
				})
			}
		}
	}
	// Row kernels and the loss at the MLP's batch shapes.
	const rows = 256
	for _, cols := range []int{128, 10} {
		x, v := devicetest.RandSlice(r, rows*cols), devicetest.RandSlice(r, cols)
		grad, dst := make([]float32, rows*cols), make([]float32, cols)
		labels := make([]int32, rows)
		for i := range labels {
			labels[i] = int32(r.IntN(cols))
		}
		for _, k := range []struct {
			name  string
			bytes int
			run   func(be device.Backend)
		}{
			{"BiasReLU", 8, func(be device.Backend) { be.BiasReLU(grad, v, rows, cols) }},
			{"SumRows", 4, func(be device.Backend) { be.SumRows(dst, x, rows, cols) }},
			{"SoftmaxXent", 8, func(be device.Backend) { be.SoftmaxXent(grad, x, labels, rows, cols) }},
		} {
			for _, be := range backends {
				b.Run(fmt.Sprintf("%s/%dx%d/%s", k.name, rows, cols, be.Name()), func(b *testing.B) {
					b.SetBytes(int64(k.bytes * rows * cols))
					b.ReportAllocs()
					for b.Loop() {
						k.run(be)
					}
				})
			}
		}
	}
}

// BenchmarkGemmISA runs the model shapes on every instruction set this CPU
// supports (AVX-512, AVX2, portable Go), for comparing the kernels.
func BenchmarkGemmISA(b *testing.B) {
	for _, s := range gemmShapes {
		for _, isa := range device.SupportedISAs() {
			be := device.NewFastISA(isa)
			b.Run(fmt.Sprintf("%s-%dx%dx%d/%s", s.name, s.m, s.n, s.k, be.Name()), func(b *testing.B) {
				benchGemm(b, be, s)
			})
			if isa == "avx512" && !s.tB {
				b.Run(fmt.Sprintf("%s-%dx%dx%d/cpu/avx512-packB", s.name, s.m, s.n, s.k), func(b *testing.B) {
					benchGemm(b, device.NewFastPackedB(), s)
				})
			}
		}
	}
}

// BenchmarkConv runs im2col, col2im and max pooling at the FedAvg CNN's
// shapes (batch 64) on the fast backend and the CPU baseline; MB/s counts
// the im2col matrix (or the pooled input) once.
func BenchmarkConv(b *testing.B) {
	backends := []device.Backend{device.NewFast(), device.NewCPU()}
	r := rand.New(rand.NewPCG(4, 4))
	for _, c := range []struct {
		name string
		g    device.ConvGeom
	}{
		{"conv1", device.ConvGeom{N: 64, H: 28, W: 28, C: 1, KH: 5, KW: 5, StrideH: 1, StrideW: 1, PadH: 2, PadW: 2}},
		{"conv2", device.ConvGeom{N: 64, H: 14, W: 14, C: 32, KH: 5, KW: 5, StrideH: 1, StrideW: 1, PadH: 2, PadW: 2}},
	} {
		x := devicetest.RandSlice(r, c.g.N*c.g.H*c.g.W*c.g.C)
		col := make([]float32, c.g.ColRows()*c.g.ColCols())
		for _, be := range backends {
			b.Run(fmt.Sprintf("Im2Col/%s/%s", c.name, be.Name()), func(b *testing.B) {
				b.SetBytes(int64(4 * len(col)))
				b.ReportAllocs()
				for b.Loop() {
					be.Im2Col(col, x, c.g)
				}
			})
			b.Run(fmt.Sprintf("Col2Im/%s/%s", c.name, be.Name()), func(b *testing.B) {
				b.SetBytes(int64(4 * len(col)))
				b.ReportAllocs()
				for b.Loop() {
					be.Col2Im(x, col, c.g)
				}
			})
		}
	}
	for _, c := range []struct {
		name string
		g    device.PoolGeom
	}{
		{"pool1", device.PoolGeom{N: 64, H: 28, W: 28, C: 32, K: 2, Stride: 2}},
		{"pool2", device.PoolGeom{N: 64, H: 14, W: 14, C: 64, K: 2, Stride: 2}},
	} {
		x := devicetest.RandSlice(r, c.g.N*c.g.H*c.g.W*c.g.C)
		n := c.g.N * c.g.OutH() * c.g.OutW() * c.g.C
		y, arg := make([]float32, n), make([]int32, n)
		for _, be := range backends {
			b.Run(fmt.Sprintf("MaxPool/%s/%s", c.name, be.Name()), func(b *testing.B) {
				b.SetBytes(int64(4 * len(x)))
				b.ReportAllocs()
				for b.Loop() {
					be.MaxPool(y, arg, x, c.g)
				}
			})
		}
	}
}
