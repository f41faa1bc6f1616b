package device

import (
	"runtime"
	"sync"
)

// Pointwise and row kernels without a SIMD version run as Go loops split
// across GOMAXPROCS goroutines that start and end within the call
// (forkJoin, as a large GEMM's do): GELU with its derivative costs about
// 10 ns a value in scalar Go, LayerNorm about 3.

// splitMin is the fewest values worth a goroutine of their own (about half
// a millisecond of GELU).
const splitMin = 1 << 16

// splitOp names the kernel a splitCall runs.
type splitOp uint8

const (
	opGELU              splitOp = iota // dst = GELU(b), a = GELU'(b) unless nil; n values
	opLayerNorm                        // dst = LayerNorm(a); n rows of cols
	opLayerNormBackward                // dst = dx from dy b and x a; n rows of cols
)

// splitCall is one kernel over n values or rows, split into nt contiguous
// parts.
type splitCall struct {
	op        splitOp
	n, nt     int
	dst, a, b []float32
	vec       bool // the AVX-512 kernels (LayerNorm's: when cols%8 == 0)

	cols                        int // row kernels
	eps                         float32
	mean, rstd, w, bias, dw, db []float32
	partial                     [][]float32 // LayerNormBackward: dw‖db of parts 1…nt−1

	wg sync.WaitGroup
}

func (c *splitCall) run(w int) {
	lo, hi := c.n*w/c.nt, c.n*(w+1)/c.nt
	switch c.op {
	case opGELU:
		var d []float32
		if c.a != nil {
			d = c.a[lo:hi]
		}
		if c.vec && hi > lo {
			var dp *float32
			if d != nil {
				dp = &d[0]
			}
			geluAVX512(&c.dst[lo], dp, &c.b[lo], hi-lo)
			break
		}
		gelu32(c.dst[lo:hi], d, c.b[lo:hi])
	case opLayerNorm:
		r, k := c.cols, hi-lo
		if c.vec && k > 0 && r > 0 && r%8 == 0 {
			layerNormAVX512(&c.dst[lo*r], &c.mean[lo], &c.rstd[lo], &c.a[lo*r], &c.w[0], &c.bias[0], k, r, c.eps)
			break
		}
		portable.LayerNorm(c.dst[lo*r:hi*r], c.mean[lo:hi], c.rstd[lo:hi], c.a[lo*r:hi*r], c.w, c.bias, k, r, c.eps)
	case opLayerNormBackward:
		r, k := c.cols, hi-lo
		dw, db := c.dw, c.db
		if w > 0 {
			p := c.partial[w]
			clear(p)
			dw, db = p[:r], p[r:]
		}
		if c.vec && k > 0 && r > 0 && r%8 == 0 {
			layerNormBackwardAVX512(&c.dst[lo*r], &dw[0], &db[0], &c.b[lo*r], &c.a[lo*r], &c.mean[lo], &c.rstd[lo], &c.w[0], k, r)
			break
		}
		portable.LayerNormBackward(c.dst[lo*r:hi*r], dw, db, c.b[lo*r:hi*r], c.a[lo*r:hi*r], c.mean[lo:hi], c.rstd[lo:hi], c.w, k, r)
	}
}

func (c *splitCall) waitGroup() *sync.WaitGroup { return &c.wg }

var splitCalls = make(freeList[splitCall], 64)

// portable runs the row kernels' parts.
var portable CPU

// newSplit returns a pooled call for n units of size values each.
func newSplit(op splitOp, n, size int) *splitCall {
	c := splitCalls.get()
	c.op, c.n = op, n
	c.nt = max(min(runtime.GOMAXPROCS(0), n*size/splitMin, n), 1)
	return c
}

// do runs the call's parts and returns it to the pool.
func (c *splitCall) do() {
	forkJoin(c, c.nt)
	if c.op == opLayerNormBackward {
		for w := 1; w < c.nt; w++ {
			p := c.partial[w]
			for j, v := range p[:c.cols] {
				c.dw[j] += v
			}
			for j, v := range p[c.cols:] {
				c.db[j] += v
			}
		}
	}
	partial := c.partial
	*c = splitCall{partial: partial}
	splitCalls.put(c)
}

// pointwise runs GELU over the first n values of dst, a and b (the caller
// checked the lengths), in parallel when n is large enough to pay, with
// the AVX-512 kernel if vec.
func pointwise(op splitOp, n int, dst, a, b []float32, vec bool) {
	c := newSplit(op, n, 1)
	c.dst, c.a, c.b, c.vec = dst, a, b, vec
	c.do()
}

// layerNormSplit runs LayerNorm or its backward (op) over rows×cols in
// parallel when that pays, with the AVX-512 kernels if vec; lengths are
// the caller's to check.
func layerNormSplit(op splitOp, rows, cols int, dst, a, b, mean, rstd, w, bias, dw, db []float32, eps float32, vec bool) {
	c := newSplit(op, rows, cols)
	c.dst, c.a, c.b, c.cols, c.eps, c.vec = dst, a, b, cols, eps, vec
	c.mean, c.rstd, c.w, c.bias, c.dw, c.db = mean, rstd, w, bias, dw, db
	if op == opLayerNormBackward {
		for len(c.partial) < c.nt {
			c.partial = append(c.partial, nil)
		}
		for i := 1; i < c.nt; i++ {
			if cap(c.partial[i]) < 2*cols {
				c.partial[i] = make([]float32, 2*cols)
			}
			c.partial[i] = c.partial[i][:2*cols]
		}
	}
	c.do()
}
