package aggregate

import (
	"sync"

	"github.com/starling-ml/starling/aggregate/rule"
)

// The tree is a binary heap over ranks: rank r's parent is (r−1)/2 and its
// children are 2r+1 and 2r+2. Rank 0 is the root.

// treeHeight returns the height of the subtree rooted at rank r of n (0 for
// a leaf). The leftmost path of a heap is its longest.
func treeHeight(r, n int) int {
	h := 0
	for c := 2*r + 1; c < n; c = 2*c + 1 {
		h++
	}
	return h
}

// tree runs the data phase of the tree all-reduce, chunked and pipelined:
// each rank adds its children's partial sums of chunk k to its own weighted
// chunk and sends the sum up as soon as it has it; the root turns chunk k
// into the final result and sends it down, and every rank forwards what it
// receives from its parent to its children.
//
// Goroutines: upFrom(c) per child receives the child's partial sums;
// combine adds and sends up (or, at the root, finalises); downFrom receives
// the result from the parent into dst; downTo(c) per child forwards it.
func (a *attempt) tree() {
	n, me, d := a.n, a.rank, len(a.src)
	chunks := numChunks(d, a.chunk)
	var kids []int
	for _, c := range []int{2*me + 1, 2*me + 2} {
		if c < n {
			kids = append(kids, c)
		}
	}
	kidBufs := make([][]float32, len(kids))
	kidW := make([]float64, len(kids))
	arrived := make([]chan struct{}, len(kids))
	ready := make([]chan struct{}, len(kids))
	for i := range kids {
		kidBufs[i] = a.r.buf([]string{"kid0", "kid1"}[i], d)
		arrived[i] = make(chan struct{}, chunks+1)
		ready[i] = make(chan struct{}, chunks+1)
	}
	publish := func() {
		for _, ch := range ready {
			ch <- struct{}{}
		}
	}

	var wg sync.WaitGroup
	lanes := 2*len(kids) + 1
	if me > 0 {
		lanes++
		wg.Go(func() { a.downFrom((me-1)/2, chunks, publish) })
	}
	a.lanes.Store(int64(lanes))
	for i, c := range kids {
		wg.Go(func() { a.upFrom(c, kidBufs[i], &kidW[i], arrived[i]) })
		wg.Go(func() { a.downTo(c, chunks, ready[i]) })
	}
	wg.Go(func() { a.combine(me, kidBufs, kidW, arrived, chunks, publish) })
	wg.Wait()
}

// downMult is the timeout multiple for rank me's wait on its parent: the
// result comes only after the whole tree has reduced (the root waits at most
// H stall timeouts for its children), and each level waits one timeout
// longer than its parent, so that the member nearest a failure times out,
// and says so, first.
func (a *attempt) downMult(me int) int { return treeHeight(0, a.n) + treeDepth(me) }

// treeDepth returns the depth of rank r (0 for the root).
func treeDepth(r int) int {
	d := 0
	for ; r > 0; r = (r - 1) / 2 {
		d++
	}
	return d
}

func (a *attempt) upFrom(c int, buf []float32, w *float64, arrived chan<- struct{}) {
	h := treeHeight(c, a.n)
	mult, k := 1+h, kindTimeout
	if h == 0 {
		k = kindStall // a leaf's sums depend on no one
	}
	hd, ok := a.recvHeader(c, StepUp, mult, k)
	if !ok {
		return
	}
	*w = hd.weight
	arrived <- struct{}{}
	C := a.chunk
	chunk := func(i int) []float32 { lo, hi := chunkRange(0, len(buf), C, i); return buf[lo:hi] }
	if a.recvLane(c, StepUp, 1, numChunks(len(buf), C), chunk, mult, k, true, func(int) { arrived <- struct{}{} }) {
		a.laneDone()
	}
}

func (a *attempt) combine(me int, kidBufs [][]float32, kidW []float64, arrived []chan struct{}, chunks int, publish func()) {
	for _, ch := range arrived {
		if !a.wait(ch) {
			return
		}
	}
	sub := a.weight
	for _, w := range kidW {
		sub += w
	}
	_, mean := a.r.cfg.Rule.(rule.Mean)
	parent := (me - 1) / 2
	if me == 0 {
		a.total = sub
		if mean && !(sub > 0 && isFinite(sub)) {
			a.setFault(faultZeroWeight)
			return
		}
		publish() // the down header can go
	} else {
		var hw [headerLen]float32
		header{cfg: a.cfg, d: uint64(len(a.src)), weight: sub}.encode(hw[:])
		if !a.send(parent, StepUp, 0, hw[:], a.maxMult()) {
			return
		}
	}
	coef := float32(1)
	if mean {
		coef = float32(a.weight)
	}
	acc := a.r.buf("acc", len(a.src))
	C := a.chunk
	be := a.r.be
	for k := range chunks {
		for _, ch := range arrived {
			if !a.wait(ch) {
				return
			}
		}
		lo, hi := chunkRange(0, len(a.src), C, k)
		if len(kidBufs) == 0 && me == 0 {
			copy(a.dst[lo:hi], a.src[lo:hi]) // alone: the sum and the mean are src itself
			continue
		}
		out := acc[lo:hi]
		copy(out, a.src[lo:hi])
		if coef != 1 {
			be.Scale(coef, out)
		}
		for _, b := range kidBufs {
			be.Axpy(1, b[lo:hi], out)
		}
		if rule.FirstNonFinite(out) >= 0 {
			a.setFault(faultOverflow)
			return
		}
		if me != 0 {
			if !a.send(parent, StepUp, uint32(k+1), out, a.maxMult()) {
				return
			}
			continue
		}
		final := a.dst[lo:hi]
		if mean {
			for i, v := range out {
				final[i] = float32(float64(v) / a.total)
			}
		} else {
			copy(final, out)
		}
		publish()
	}
	a.laneDone()
}

func (a *attempt) downFrom(parent, chunks int, publish func()) {
	mult := a.downMult(a.rank)
	h, ok := a.recvHeader(parent, StepDown, mult, kindTimeout)
	if !ok {
		return
	}
	a.total = h.weight
	publish()
	C := a.chunk
	chunk := func(k int) []float32 { lo, hi := chunkRange(0, len(a.src), C, k); return a.dst[lo:hi] }
	if a.recvLane(parent, StepDown, 1, chunks, chunk, mult, kindTimeout, true, func(int) { publish() }) {
		a.laneDone()
	}
}

func (a *attempt) downTo(c, chunks int, ready <-chan struct{}) {
	mult := a.maxMult()
	if !a.wait(ready) {
		return
	}
	var hw [headerLen]float32
	header{cfg: a.cfg, d: uint64(len(a.src)), weight: a.total}.encode(hw[:])
	if !a.send(c, StepDown, 0, hw[:], mult) {
		return
	}
	C := a.chunk
	for k := range chunks {
		if !a.wait(ready) {
			return
		}
		lo, hi := chunkRange(0, len(a.src), C, k)
		if !a.send(c, StepDown, uint32(k+1), a.dst[lo:hi], mult) {
			return
		}
	}
	a.laneDone()
}
