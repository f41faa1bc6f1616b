package device

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Backend is the compute interface. Methods panic only on programmer errors
// (slices too short for the stated shapes), never on data values.
type Backend interface {
	// Name identifies the backend and its kernel choice, e.g. "cpu/avx512".
	Name() string

	// Gemm computes C = alpha·op(A)·op(B) + beta·C where op(A) is m×k and
	// op(B) is k×n; op(X) is X or Xᵀ as tA/tB say. Row-major with leading
	// dimensions lda, ldb, ldc. With beta == 0, C is not read (NaNs in C do
	// not propagate).
	Gemm(tA, tB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int)

	// GemmStrided runs count independent GEMMs of one shape, as Gemm: the
	// i-th reads a[i·sa:], b[i·sb:] and writes c[i·sc:] (strides ≥ 0), so
	// with leading dimensions they address the heads of attention in
	// place. A backend may run them in parallel; their C blocks must not
	// overlap.
	GemmStrided(tA, tB bool, m, n, k int, alpha float32, a []float32, lda, sa int, b []float32, ldb, sb int, beta float32, c []float32, ldc, sc int, count int)

	// Axpy computes y += alpha·x. len(y) must be ≥ len(x).
	Axpy(alpha float32, x, y []float32)
	// Scale computes x *= alpha.
	Scale(alpha float32, x []float32)
	// Dot returns Σ x[i]·y[i], accumulated in float64.
	Dot(x, y []float32) float64
	// SumSquares returns Σ x[i]², accumulated in float64.
	SumSquares(x []float32) float64
	// WeightedSum sets dst = Σ_j w[j]·srcs[j]. Every src must be as long as dst.
	WeightedSum(dst []float32, srcs [][]float32, w []float32)

	// AddRowVector adds v (length cols) to every row of the rows×cols matrix x.
	AddRowVector(x, v []float32, rows, cols int)
	// SumRows accumulates the column sums of the rows×cols matrix x into dst
	// (length cols): dst[j] += Σ_i x[i,j]. It is the gradient of AddRowVector.
	SumRows(dst, x []float32, rows, cols int)
	// BiasReLU sets x = max(x + bias, 0) row-wise (fused AddRowVector + ReLU).
	BiasReLU(x, bias []float32, rows, cols int)
	// ReLU sets y = max(x, 0). y and x may be the same slice.
	ReLU(y, x []float32)
	// ReLUBackward sets dx = dy where y > 0 and 0 elsewhere. dx may alias dy.
	ReLUBackward(dx, dy, y []float32)
	// SoftmaxXent computes the mean softmax cross-entropy of the rows×cols
	// logits against labels (each in [0, cols)) and writes its gradient with
	// respect to the logits into grad (may alias logits). It returns the
	// mean loss (float64) and the number of rows whose argmax equals the label.
	SoftmaxXent(grad, logits []float32, labels []int32, rows, cols int) (loss float64, correct int)

	// SoftmaxRows sets each row of the rows×cols matrix y to the softmax of
	// the same row of x. With causal, row r covers only its first r%cols+1
	// entries and the rest of y's row is zero: the rows are stacked
	// cols×cols blocks of causal attention scores. y may alias x.
	SoftmaxRows(y, x []float32, rows, cols int, causal bool)
	// SoftmaxRowsBackward sets each row of dx to y⊙(dy − Σ_j dy_j·y_j), the
	// gradient through SoftmaxRows given its output y. dx may alias dy.
	SoftmaxRowsBackward(dx, dy, y []float32, rows, cols int)
	// LayerNorm normalises each row of the rows×cols matrix x as
	// torch.nn.LayerNorm does (biased variance, eps inside the square root)
	// and sets y = (x − mean)·rstd·w + b; it stores each row's mean and
	// rstd = 1/√(var + eps) for LayerNormBackward.
	LayerNorm(y, mean, rstd, x, w, b []float32, rows, cols int, eps float32)
	// LayerNormBackward sets dx to the gradient through LayerNorm and
	// accumulates dw += Σ_rows dy⊙x̂ and db += Σ_rows dy (x̂ the normalised x).
	// dx may alias dy.
	LayerNormBackward(dx, dw, db, dy, x, mean, rstd, w []float32, rows, cols int)
	// GELU sets y = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), the tanh
	// approximation (torch's approximate='tanh'), and, unless d is nil,
	// d = GELU'(x): the backward pass is then dx = dy⊙d (Mul), at the cost
	// of d's memory rather than of a second tanh per value. y may alias x;
	// d may not.
	GELU(y, d, x []float32)
	// Mul sets dst = x⊙y elementwise. dst may alias x or y.
	Mul(dst, x, y []float32)

	// Im2Col fills col ((N·OH·OW) × (C·KH·KW)) from the NHWC image batch x.
	Im2Col(col, x []float32, g ConvGeom)
	// Col2Im accumulates col back into dx (NHWC); dx must be zeroed by the
	// caller if it is not to accumulate.
	Col2Im(dx, col []float32, g ConvGeom)
	// MaxPool writes the max over each window of the NHWC batch x into y
	// and the flat index into x of each max into arg.
	MaxPool(y []float32, arg []int32, x []float32, g PoolGeom)
	// MaxPoolBackward sets dx to zero and routes each dy to arg's position.
	MaxPoolBackward(dx, dy []float32, arg []int32)

	// SGD performs one SGD step with momentum mu (buf is the momentum
	// buffer, ignored when mu == 0), optional Nesterov momentum and L2
	// weight decay wd added to the gradient (PyTorch's torch.optim.SGD).
	SGD(w, g, buf []float32, lr, mu, wd float32, nesterov bool)
	// Adam performs one Adam step (t ≥ 1 is the step count). With decoupled,
	// weight decay is applied to the weights directly (AdamW); otherwise it
	// is added to the gradient (Adam with L2), as torch.optim does.
	Adam(w, g, m, v []float32, t int, lr, beta1, beta2, eps, wd float32, decoupled bool)

	// RandNormal fills x with N(mean, std²) values derived from (seed, i).
	RandNormal(x []float32, mean, std float32, seed uint64)
	// RandUniform fills x with U[lo, hi) values derived from (seed, i).
	RandUniform(x []float32, lo, hi float32, seed uint64)
}

// ConvGeom describes a 2-D convolution over an NHWC batch.
type ConvGeom struct {
	N, H, W, C       int // batch, input height, width, channels
	KH, KW           int // kernel size
	StrideH, StrideW int
	PadH, PadW       int
}

// OutH returns the output height.
func (g ConvGeom) OutH() int { return (g.H+2*g.PadH-g.KH)/g.StrideH + 1 }

// OutW returns the output width.
func (g ConvGeom) OutW() int { return (g.W+2*g.PadW-g.KW)/g.StrideW + 1 }

// ColRows returns the number of rows of the im2col matrix (N·OH·OW).
func (g ConvGeom) ColRows() int { return g.N * g.OutH() * g.OutW() }

// ColCols returns the number of columns of the im2col matrix (C·KH·KW).
func (g ConvGeom) ColCols() int { return g.C * g.KH * g.KW }

// Validate reports whether the geometry is usable.
func (g ConvGeom) Validate() error {
	if g.N < 0 || g.H <= 0 || g.W <= 0 || g.C <= 0 || g.KH <= 0 || g.KW <= 0 || g.StrideH <= 0 || g.StrideW <= 0 || g.PadH < 0 || g.PadW < 0 {
		return fmt.Errorf("device: bad conv geometry %+v", g)
	}
	if g.OutH() <= 0 || g.OutW() <= 0 {
		return fmt.Errorf("device: conv kernel %dx%d larger than padded input %dx%d", g.KH, g.KW, g.H+2*g.PadH, g.W+2*g.PadW)
	}
	return nil
}

// PoolGeom describes a max pooling over an NHWC batch (no padding).
type PoolGeom struct {
	N, H, W, C int
	K, Stride  int
}

// OutH returns the output height.
func (g PoolGeom) OutH() int { return (g.H-g.K)/g.Stride + 1 }

// OutW returns the output width.
func (g PoolGeom) OutW() int { return (g.W-g.K)/g.Stride + 1 }

// Validate reports whether the geometry is usable.
func (g PoolGeom) Validate() error {
	if g.N < 0 || g.H <= 0 || g.W <= 0 || g.C <= 0 || g.K <= 0 || g.Stride <= 0 || g.K > g.H || g.K > g.W {
		return fmt.Errorf("device: bad pool geometry %+v", g)
	}
	return nil
}

var defaultBackend = pickDefault()

// pickDefault returns the Fast backend where it has SIMD kernels for this
// CPU (AVX-512, or AVX2 with FMA) and the gonum-based CPU backend otherwise
// (other CPUs, -tags purego), whose Sgemm beats the portable Go kernel.
func pickDefault() Backend {
	if f := NewFast(); f.ISA() != "go" {
		return f
	}
	return NewCPU()
}

// Default returns the process-wide default backend: the fastest CPU backend
// this machine supports ("cpu/avx512" or "cpu/avx2" from NewFast, else
// "cpu/gonum" from NewCPU). It needs no build flags or environment.
func Default() Backend { return defaultBackend }

// ErrUnknownDevice reports a backend name ByName does not know.
var ErrUnknownDevice = errors.New("device: unknown backend")

// ByName returns the backend a --device flag names: "cpu" (Default, the
// fastest CPU backend here), "gonum" (NewCPU: pure Go, gonum's GEMM) or
// "cpu/ISA" (the fast backend restricted to one of SupportedISAs, for
// comparisons).
func ByName(name string) (Backend, error) {
	switch name {
	case "cpu", "":
		return Default(), nil
	case "gonum", "cpu/gonum":
		return NewCPU(), nil
	}
	if isa, ok := strings.CutPrefix(name, "cpu/"); ok && slices.Contains(SupportedISAs(), isa) {
		return NewFastISA(isa), nil
	}
	return nil, fmt.Errorf("%w %q (want cpu, gonum or cpu/ISA with ISA one of %s)", ErrUnknownDevice, name, strings.Join(SupportedISAs(), ", "))
}
