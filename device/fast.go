package device

import (
	"fmt"
	"math"
)

// Fast is the SIMD CPU backend: a packed, register-blocked GEMM with
// AVX-512 or AVX2/FMA micro-kernels chosen at run time and split across
// GOMAXPROCS goroutines, and vectorised elementwise kernels. On CPUs without
// AVX2/FMA, and with -tags purego, it runs portable Go kernels.
//
// A Fast is safe for concurrent use; it holds no per-call state.
type Fast struct {
	cpu CPU // the portable kernels, for what has no SIMD version here

	isa  string
	gemm *gemmImpl
	vec  bool // AVX-512 elementwise kernels
}

var _ Backend = (*Fast)(nil)

// NewFast returns the fast backend for the best instruction set this CPU
// supports ("avx512", "avx2" or "go").
func NewFast() *Fast { return newFast(bestISA()) }

// NewFastISA returns the fast backend restricted to one instruction set
// of SupportedISAs ("avx512", "avx2", "go"), for comparisons.
func NewFastISA(isa string) *Fast { return newFast(isa) }

// SupportedISAs lists the instruction sets this CPU and build can run,
// best first.
func SupportedISAs() []string { return supportedISAs() }

func newFast(isa string) *Fast {
	g := gemmFor(isa)
	if g == nil {
		panic("device: unsupported ISA " + isa)
	}
	return &Fast{isa: isa, gemm: g, vec: isa == "avx512"}
}

// Name implements Backend: "cpu/avx512", "cpu/avx2" or "cpu/go".
func (f *Fast) Name() string { return "cpu/" + f.isa }

// ISA reports the instruction set the kernels use: "avx512", "avx2" or "go".
func (f *Fast) ISA() string { return f.isa }

// Gemm implements Backend.
func (f *Fast) Gemm(tA, tB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	f.gemm.gemm(tA, tB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// GemmStrided implements Backend; a batch of GEMMs each too small to split
// is split across goroutines between them.
func (f *Fast) GemmStrided(tA, tB bool, m, n, k int, alpha float32, a []float32, lda, sa int, b []float32, ldb, sb int, beta float32, c []float32, ldc, sc int, count int) {
	f.gemm.gemmStrided(tA, tB, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, count)
}

var goGemm = &gemmImpl{
	name: "go4x4", mr: 4, nr: 4, masked: true, kStep: gemmGo4x4, packAll: true,
	kc: 256, mc: 64, nc: 512, parFlops: 1 << 21,
}

// The elementwise kernels below run the AVX-512 assembly when f.vec is set
// and fall back to the portable CPU loops otherwise. Each checks the slice
// lengths the way the CPU backend does (by slicing, so a short slice panics
// the same way) before handing raw pointers to the assembly.

// Axpy implements Backend.
func (f *Fast) Axpy(alpha float32, x, y []float32) {
	if !f.vec {
		f.cpu.Axpy(alpha, x, y)
		return
	}
	y = y[:len(x)]
	if len(x) > 0 {
		axpyAVX512(alpha, &x[0], &y[0], len(x))
	}
}

// Scale implements Backend.
func (f *Fast) Scale(alpha float32, x []float32) {
	if !f.vec {
		f.cpu.Scale(alpha, x)
		return
	}
	if len(x) > 0 {
		scaleAVX512(alpha, &x[0], len(x))
	}
}

// Dot implements Backend.
func (f *Fast) Dot(x, y []float32) float64 {
	if !f.vec {
		return f.cpu.Dot(x, y)
	}
	y = y[:len(x)]
	if len(x) == 0 {
		return 0
	}
	return dotAVX512(&x[0], &y[0], len(x))
}

// SumSquares implements Backend.
func (f *Fast) SumSquares(x []float32) float64 {
	if !f.vec {
		return f.cpu.SumSquares(x)
	}
	if len(x) == 0 {
		return 0
	}
	return sumSquaresAVX512(&x[0], len(x))
}

// WeightedSum implements Backend. dst is written once and each source read
// once, whatever the number of sources.
func (f *Fast) WeightedSum(dst []float32, srcs [][]float32, w []float32) {
	if !f.vec {
		f.cpu.WeightedSum(dst, srcs, w)
		return
	}
	if len(srcs) != len(w) {
		panic("device: WeightedSum: len(srcs) != len(w)")
	}
	if len(srcs) == 0 {
		clear(dst)
		return
	}
	for j, s := range srcs {
		if len(s) < len(dst) {
			panic(fmt.Sprintf("device: WeightedSum: len(srcs[%d]) = %d < len(dst) = %d", j, len(s), len(dst)))
		}
	}
	if len(dst) > 0 {
		weightedSumAVX512(&dst[0], &srcs[0], &w[0], len(srcs), len(dst))
	}
}

func checkRows(name string, x []float32, rows, cols int) {
	if rows < 0 || cols < 0 || len(x) < rows*cols {
		panic(fmt.Sprintf("device: %s: len = %d, want ≥ %d×%d", name, len(x), rows, cols))
	}
}

// AddRowVector implements Backend.
func (f *Fast) AddRowVector(x, v []float32, rows, cols int) {
	if !f.vec || cols < 16 { // short rows: the scalar loop wins
		f.cpu.AddRowVector(x, v, rows, cols)
		return
	}
	v = v[:cols]
	checkRows("AddRowVector", x, rows, cols)
	if rows > 0 {
		biasRowsAVX512(&x[0], &v[0], rows, cols, false)
	}
}

// BiasReLU implements Backend.
func (f *Fast) BiasReLU(x, bias []float32, rows, cols int) {
	if !f.vec || cols < 16 {
		f.cpu.BiasReLU(x, bias, rows, cols)
		return
	}
	bias = bias[:cols]
	checkRows("BiasReLU", x, rows, cols)
	if rows > 0 {
		biasRowsAVX512(&x[0], &bias[0], rows, cols, true)
	}
}

// SumRows implements Backend.
func (f *Fast) SumRows(dst, x []float32, rows, cols int) {
	if !f.vec {
		f.cpu.SumRows(dst, x, rows, cols)
		return
	}
	dst = dst[:cols]
	checkRows("SumRows", x, rows, cols)
	if rows > 0 && cols > 0 {
		sumRowsAVX512(&dst[0], &x[0], rows, cols)
	}
}

// ReLU implements Backend.
func (f *Fast) ReLU(y, x []float32) {
	if !f.vec {
		f.cpu.ReLU(y, x)
		return
	}
	y = y[:len(x)]
	if len(x) > 0 {
		reluAVX512(&y[0], &x[0], len(x))
	}
}

// ReLUBackward implements Backend.
func (f *Fast) ReLUBackward(dx, dy, y []float32) {
	if !f.vec {
		f.cpu.ReLUBackward(dx, dy, y)
		return
	}
	dx = dx[:len(dy)]
	y = y[:len(dy)]
	if len(dy) > 0 {
		reluBackwardAVX512(&dx[0], &dy[0], &y[0], len(dy))
	}
}

// SGD implements Backend.
func (f *Fast) SGD(w, g, buf []float32, lr, mu, wd float32, nesterov bool) {
	if !f.vec {
		f.cpu.SGD(w, g, buf, lr, mu, wd, nesterov)
		return
	}
	if len(w) == 0 {
		return
	}
	g = g[:len(w)]
	bp := (*float32)(nil)
	if mu == 0 {
		mu = 0 // −0 → +0: the kernel tests the bit pattern
	} else {
		buf = buf[:len(w)]
		bp = &buf[0]
	}
	sgdAVX512(&w[0], &g[0], bp, len(w), lr, mu, wd, nesterov)
}

// adamParams is the per-step constant block of the Adam kernel.
type adamParams struct {
	beta1, oneMinusBeta1 float32
	beta2, oneMinusBeta2 float32
	invSqrtBC2, eps      float32
	step                 float32 // lr / (1 − beta1^t)
	wd                   float32 // L2 decay added to the gradient
	lrWD                 float32 // decoupled decay applied to the weights
}

// Adam implements Backend.
func (f *Fast) Adam(w, g, m, v []float32, t int, lr, beta1, beta2, eps, wd float32, decoupled bool) {
	if !f.vec {
		f.cpu.Adam(w, g, m, v, t, lr, beta1, beta2, eps, wd, decoupled)
		return
	}
	if len(w) == 0 {
		return
	}
	g, m, v = g[:len(w)], m[:len(w)], v[:len(w)]
	bc1 := 1 - math.Pow(float64(beta1), float64(t))
	bc2 := 1 - math.Pow(float64(beta2), float64(t))
	p := adamParams{
		beta1: beta1, oneMinusBeta1: 1 - beta1,
		beta2: beta2, oneMinusBeta2: 1 - beta2,
		invSqrtBC2: float32(1 / math.Sqrt(bc2)), eps: eps,
		step: lr / float32(bc1),
	}
	if decoupled {
		p.lrWD = lr * wd
	} else {
		p.wd = wd
	}
	adamAVX512(&w[0], &g[0], &m[0], &v[0], len(w), &p)
}

// SoftmaxXent implements Backend. With AVX-512 each row is one pass of
// vector max, first-argmax, exp (a float32 polynomial, about 1 ulp) and
// scale; the loss is accumulated in float64 from each row's float32 sum of
// exponentials, so it agrees with the float64 reference to about 1e-7·cols
// absolute per row.
func (f *Fast) SoftmaxXent(grad, logits []float32, labels []int32, rows, cols int) (float64, int) {
	if !f.vec {
		return f.cpu.SoftmaxXent(grad, logits, labels, rows, cols)
	}
	if rows == 0 {
		return 0, 0
	}
	if cols <= 0 {
		panic(fmt.Sprintf("device: SoftmaxXent: cols = %d", cols))
	}
	checkRows("SoftmaxXent logits", logits, rows, cols)
	checkRows("SoftmaxXent grad", grad, rows, cols)
	labels = labels[:rows]
	inv := 1 / float32(rows)
	var loss float64
	correct := 0
	for r, lab := range labels {
		z := logits[r*cols : r*cols+cols]
		g := grad[r*cols : r*cols+cols]
		y := int(lab)
		zy := z[y] // before g (which may be z) is written
		mx, sum, arg := softmaxRowAVX512(&g[0], &z[0], cols, inv)
		if arg == y {
			correct++
		}
		loss += math.Log(float64(sum)) - float64(zy-mx)
		g[y] -= inv
	}
	return loss / float64(rows), correct
}

// SoftmaxRows implements Backend. With AVX-512 each row is the softmax
// pass of SoftmaxXent (a float32 polynomial exp, about 1 ulp).
func (f *Fast) SoftmaxRows(y, x []float32, rows, cols int, causal bool) {
	if !f.vec || cols == 0 {
		f.cpu.SoftmaxRows(y, x, rows, cols, causal)
		return
	}
	checkRows("SoftmaxRows x", x, rows, cols)
	checkRows("SoftmaxRows y", y, rows, cols)
	for r := 0; r < rows; r++ {
		valid := cols
		if causal {
			valid = r%cols + 1
		}
		softmaxRowAVX512(&y[r*cols], &x[r*cols], valid, 1)
		clear(y[r*cols+valid : r*cols+cols])
	}
}

// SoftmaxRowsBackward implements Backend: a vector dot product per row and
// a Go loop for the elementwise part.
func (f *Fast) SoftmaxRowsBackward(dx, dy, y []float32, rows, cols int) {
	checkRows("SoftmaxRowsBackward dy", dy, rows, cols)
	checkRows("SoftmaxRowsBackward y", y, rows, cols)
	checkRows("SoftmaxRowsBackward dx", dx, rows, cols)
	for r := 0; r < rows; r++ {
		g, p, d := dy[r*cols:r*cols+cols], y[r*cols:r*cols+cols], dx[r*cols:r*cols+cols]
		s := float32(f.Dot(g, p))
		for j, v := range g {
			d[j] = p[j] * (v - s)
		}
	}
}

// LayerNorm implements Backend: the AVX-512 kernel (cols a multiple of 8),
// else the portable loop, over parts of the rows split across goroutines
// (pointwise.go).
func (f *Fast) LayerNorm(y, mean, rstd, x, w, b []float32, rows, cols int, eps float32) {
	checkRows("LayerNorm x", x, rows, cols)
	checkRows("LayerNorm y", y, rows, cols)
	mean, rstd, w, b = mean[:rows], rstd[:rows], w[:cols], b[:cols]
	layerNormSplit(opLayerNorm, rows, cols, y, x, nil, mean, rstd, w, b, nil, nil, eps, f.vec)
}

// LayerNormBackward implements Backend as LayerNorm does; each part sums
// its own dw and db, added up after the join.
func (f *Fast) LayerNormBackward(dx, dw, db, dy, x, mean, rstd, w []float32, rows, cols int) {
	checkRows("LayerNormBackward x", x, rows, cols)
	checkRows("LayerNormBackward dy", dy, rows, cols)
	checkRows("LayerNormBackward dx", dx, rows, cols)
	mean, rstd, w, dw, db = mean[:rows], rstd[:rows], w[:cols], dw[:cols], db[:cols]
	layerNormSplit(opLayerNormBackward, rows, cols, dx, x, dy, mean, rstd, w, nil, dw, db, 0, f.vec)
}

// GELU implements Backend with the AVX-512 kernel, else float32 Go loops
// (gelu.go), split across goroutines (pointwise.go): within 5e-6 relative
// of the float64 reference.
func (f *Fast) GELU(y, d, x []float32) {
	if d != nil {
		d = d[:len(x)]
	}
	pointwise(opGELU, len(x), y[:len(x)], d, x, f.vec)
}

// Mul implements Backend (the portable loop).
func (f *Fast) Mul(dst, x, y []float32) { f.cpu.Mul(dst, x, y) }

// MaxPoolBackward implements Backend (a scatter: the portable loop).
func (f *Fast) MaxPoolBackward(dx, dy []float32, arg []int32) { f.cpu.MaxPoolBackward(dx, dy, arg) }

// RandNormal implements Backend; values are those of every backend.
func (f *Fast) RandNormal(x []float32, mean, std float32, seed uint64) {
	f.cpu.RandNormal(x, mean, std, seed)
}

// RandUniform implements Backend; values are those of every backend.
func (f *Fast) RandUniform(x []float32, lo, hi float32, seed uint64) {
	f.cpu.RandUniform(x, lo, hi, seed)
}
