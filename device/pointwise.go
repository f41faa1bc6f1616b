package device

import (
	"runtime"
	"sync"
)

// Pointwise kernels without a SIMD version run as Go loops split across
// GOMAXPROCS goroutines that start and end within the call, as a large
// GEMM's do: GELU with its derivative costs about 10 ns a value in scalar
// Go.

// pointwiseMin is the fewest values worth a goroutine of their own (about
// half a millisecond of GELU).
const pointwiseMin = 1 << 16

// pointwiseOp names the kernel a pointwiseCall runs.
type pointwiseOp uint8

const (
	opGELU pointwiseOp = iota // dst = GELU(b), a = GELU'(b) unless nil
)

// pointwiseCall is one pointwise kernel over n values split into nt
// contiguous parts.
type pointwiseCall struct {
	op        pointwiseOp
	dst, a, b []float32
	n, nt     int
	wg        sync.WaitGroup
}

func (c *pointwiseCall) run(w int) {
	lo, hi := c.n*w/c.nt, c.n*(w+1)/c.nt
	switch c.op {
	case opGELU:
		var d []float32
		if c.a != nil {
			d = c.a[lo:hi]
		}
		gelu32(c.dst[lo:hi], d, c.b[lo:hi])
	}
}

func runPointwisePart(c *pointwiseCall, w int) {
	c.run(w)
	c.wg.Done()
}

var pointwiseCalls = make(chan *pointwiseCall, 64)

// pointwise runs op over the first n values of dst, a and b (the caller
// checked the lengths), in parallel when n is large enough to pay.
func pointwise(op pointwiseOp, n int, dst, a, b []float32) {
	var c *pointwiseCall
	select {
	case c = <-pointwiseCalls:
	default:
		c = new(pointwiseCall)
	}
	c.op, c.dst, c.a, c.b, c.n = op, dst, a, b, n
	c.nt = max(min(runtime.GOMAXPROCS(0), n/pointwiseMin), 1)
	c.wg.Add(c.nt - 1)
	for w := 1; w < c.nt; w++ {
		go runPointwisePart(c, w)
	}
	c.run(0)
	c.wg.Wait()
	c.dst, c.a, c.b = nil, nil, nil
	select {
	case pointwiseCalls <- c:
	default:
	}
}
