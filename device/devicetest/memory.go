package devicetest

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/starling-ml/starling/device"
)

// Tracked is a backend with memory of its own (device.Memory) in front of
// another backend: it computes with the inner backend, and it records
// every kernel call that is handed a buffer it did not allocate. A model
// that trains on a Tracked backend without such calls keeps its tensors
// where a GPU backend's kernels can reach them, with host copies only
// where it stages them (device.Stage) or syncs (device.Sync).
type Tracked struct {
	inner device.Backend

	mu      sync.Mutex
	regions []region // every buffer allocated, kept alive so no address is reused
	bufs    []any
	bad     []string
	syncs   int
	calls   int
}

type region struct{ lo, hi uintptr }

var _ device.Memory = (*Tracked)(nil)

// NewTracked returns a Tracked backend computing with inner.
func NewTracked(inner device.Backend) *Tracked { return &Tracked{inner: inner} }

// Violations returns one line per kernel call that was handed a host
// buffer (not from Alloc), at most the first 20.
func (t *Tracked) Violations() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]string(nil), t.bad...)
}

// Syncs returns how many times Sync was called; Calls how many kernels ran.
func (t *Tracked) Syncs() int { t.mu.Lock(); defer t.mu.Unlock(); return t.syncs }

// Calls returns how many kernel calls the backend has seen.
func (t *Tracked) Calls() int { t.mu.Lock(); defer t.mu.Unlock(); return t.calls }

// AllocFloat32 implements device.Memory.
func (t *Tracked) AllocFloat32(n int) []float32 {
	b := make([]float32, n)
	t.keep(b, unsafe.Pointer(unsafe.SliceData(b)), 4*n)
	return b
}

// AllocInt32 implements device.Memory.
func (t *Tracked) AllocInt32(n int) []int32 {
	b := make([]int32, n)
	t.keep(b, unsafe.Pointer(unsafe.SliceData(b)), 4*n)
	return b
}

// Sync implements device.Memory.
func (t *Tracked) Sync() { t.mu.Lock(); t.syncs++; t.mu.Unlock() }

func (t *Tracked) keep(b any, p unsafe.Pointer, size int) {
	if size == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.regions = append(t.regions, region{uintptr(p), uintptr(p) + uintptr(size)})
	t.bufs = append(t.bufs, b)
}

// owned reports whether the size bytes at p lie in one allocated buffer.
func (t *Tracked) owned(p unsafe.Pointer, size int) bool {
	if size == 0 {
		return true
	}
	lo, hi := uintptr(p), uintptr(p)+uintptr(size)
	for _, r := range t.regions {
		if lo >= r.lo && hi <= r.hi {
			return true
		}
	}
	return false
}

// check records a violation of kernel for each argument not from Alloc.
func (t *Tracked) check(kernel string, fs [][]float32, is ...[]int32) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.calls++
	for i, f := range fs {
		if !t.owned(unsafe.Pointer(unsafe.SliceData(f)), 4*len(f)) && len(t.bad) < 20 {
			t.bad = append(t.bad, fmt.Sprintf("%s: float32 argument %d (%d values) is host memory", kernel, i, len(f)))
		}
	}
	for i, x := range is {
		if !t.owned(unsafe.Pointer(unsafe.SliceData(x)), 4*len(x)) && len(t.bad) < 20 {
			t.bad = append(t.bad, fmt.Sprintf("%s: int32 argument %d (%d values) is host memory", kernel, i, len(x)))
		}
	}
}

func f32s(xs ...[]float32) [][]float32 { return xs }

// Name implements device.Backend.
func (t *Tracked) Name() string { return "tracked/" + t.inner.Name() }

// Gemm implements device.Backend.
func (t *Tracked) Gemm(tA, tB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	t.check("Gemm", f32s(a, b, c))
	t.inner.Gemm(tA, tB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// GemmStrided implements device.Backend.
func (t *Tracked) GemmStrided(tA, tB bool, m, n, k int, alpha float32, a []float32, lda, sa int, b []float32, ldb, sb int, beta float32, c []float32, ldc, sc int, count int) {
	t.check("GemmStrided", f32s(a, b, c))
	t.inner.GemmStrided(tA, tB, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, count)
}

// Axpy implements device.Backend.
func (t *Tracked) Axpy(alpha float32, x, y []float32) {
	t.check("Axpy", f32s(x, y))
	t.inner.Axpy(alpha, x, y)
}

// Scale implements device.Backend.
func (t *Tracked) Scale(alpha float32, x []float32) {
	t.check("Scale", f32s(x))
	t.inner.Scale(alpha, x)
}

// Dot implements device.Backend.
func (t *Tracked) Dot(x, y []float32) float64 {
	t.check("Dot", f32s(x, y))
	return t.inner.Dot(x, y)
}

// SumSquares implements device.Backend.
func (t *Tracked) SumSquares(x []float32) float64 {
	t.check("SumSquares", f32s(x))
	return t.inner.SumSquares(x)
}

// WeightedSum implements device.Backend.
func (t *Tracked) WeightedSum(dst []float32, srcs [][]float32, w []float32) {
	t.check("WeightedSum", append(f32s(dst), srcs...))
	t.inner.WeightedSum(dst, srcs, w)
}

// AddRowVector implements device.Backend.
func (t *Tracked) AddRowVector(x, v []float32, rows, cols int) {
	t.check("AddRowVector", f32s(x, v))
	t.inner.AddRowVector(x, v, rows, cols)
}

// SumRows implements device.Backend.
func (t *Tracked) SumRows(dst, x []float32, rows, cols int) {
	t.check("SumRows", f32s(dst, x))
	t.inner.SumRows(dst, x, rows, cols)
}

// BiasReLU implements device.Backend.
func (t *Tracked) BiasReLU(x, bias []float32, rows, cols int) {
	t.check("BiasReLU", f32s(x, bias))
	t.inner.BiasReLU(x, bias, rows, cols)
}

// ReLU implements device.Backend.
func (t *Tracked) ReLU(y, x []float32) {
	t.check("ReLU", f32s(y, x))
	t.inner.ReLU(y, x)
}

// ReLUBackward implements device.Backend.
func (t *Tracked) ReLUBackward(dx, dy, y []float32) {
	t.check("ReLUBackward", f32s(dx, dy, y))
	t.inner.ReLUBackward(dx, dy, y)
}

// SoftmaxXent implements device.Backend.
func (t *Tracked) SoftmaxXent(grad, logits []float32, labels []int32, rows, cols int) (float64, int) {
	t.check("SoftmaxXent", f32s(grad, logits), labels)
	return t.inner.SoftmaxXent(grad, logits, labels, rows, cols)
}

// SoftmaxRows implements device.Backend.
func (t *Tracked) SoftmaxRows(y, x []float32, rows, cols int, causal bool) {
	t.check("SoftmaxRows", f32s(y, x))
	t.inner.SoftmaxRows(y, x, rows, cols, causal)
}

// SoftmaxRowsBackward implements device.Backend.
func (t *Tracked) SoftmaxRowsBackward(dx, dy, y []float32, rows, cols int) {
	t.check("SoftmaxRowsBackward", f32s(dx, dy, y))
	t.inner.SoftmaxRowsBackward(dx, dy, y, rows, cols)
}

// LayerNorm implements device.Backend.
func (t *Tracked) LayerNorm(y, mean, rstd, x, w, b []float32, rows, cols int, eps float32) {
	t.check("LayerNorm", f32s(y, mean, rstd, x, w, b))
	t.inner.LayerNorm(y, mean, rstd, x, w, b, rows, cols, eps)
}

// LayerNormBackward implements device.Backend.
func (t *Tracked) LayerNormBackward(dx, dw, db, dy, x, mean, rstd, w []float32, rows, cols int) {
	t.check("LayerNormBackward", f32s(dx, dw, db, dy, x, mean, rstd, w))
	t.inner.LayerNormBackward(dx, dw, db, dy, x, mean, rstd, w, rows, cols)
}

// GELU implements device.Backend.
func (t *Tracked) GELU(y, d, x []float32) {
	t.check("GELU", f32s(y, d, x))
	t.inner.GELU(y, d, x)
}

// Mul implements device.Backend.
func (t *Tracked) Mul(dst, x, y []float32) {
	t.check("Mul", f32s(dst, x, y))
	t.inner.Mul(dst, x, y)
}

// Im2Col implements device.Backend.
func (t *Tracked) Im2Col(col, x []float32, g device.ConvGeom) {
	t.check("Im2Col", f32s(col, x))
	t.inner.Im2Col(col, x, g)
}

// Col2Im implements device.Backend.
func (t *Tracked) Col2Im(dx, col []float32, g device.ConvGeom) {
	t.check("Col2Im", f32s(dx, col))
	t.inner.Col2Im(dx, col, g)
}

// MaxPool implements device.Backend.
func (t *Tracked) MaxPool(y []float32, arg []int32, x []float32, g device.PoolGeom) {
	t.check("MaxPool", f32s(y, x), arg)
	t.inner.MaxPool(y, arg, x, g)
}

// MaxPoolBackward implements device.Backend.
func (t *Tracked) MaxPoolBackward(dx, dy []float32, arg []int32) {
	t.check("MaxPoolBackward", f32s(dx, dy), arg)
	t.inner.MaxPoolBackward(dx, dy, arg)
}

// SGD implements device.Backend.
func (t *Tracked) SGD(w, g, buf []float32, lr, mu, wd float32, nesterov bool) {
	t.check("SGD", f32s(w, g, buf))
	t.inner.SGD(w, g, buf, lr, mu, wd, nesterov)
}

// Adam implements device.Backend.
func (t *Tracked) Adam(w, g, m, v []float32, step int, lr, beta1, beta2, eps, wd float32, decoupled bool) {
	t.check("Adam", f32s(w, g, m, v))
	t.inner.Adam(w, g, m, v, step, lr, beta1, beta2, eps, wd, decoupled)
}

// RandNormal implements device.Backend.
func (t *Tracked) RandNormal(x []float32, mean, std float32, seed uint64) {
	t.check("RandNormal", f32s(x))
	t.inner.RandNormal(x, mean, std, seed)
}

// RandUniform implements device.Backend.
func (t *Tracked) RandUniform(x []float32, lo, hi float32, seed uint64) {
	t.check("RandUniform", f32s(x))
	t.inner.RandUniform(x, lo, hi, seed)
}
