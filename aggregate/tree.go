package aggregate

import (
	"sync"

	"github.com/starling-ml/starling/aggregate/rule"
	"github.com/starling-ml/starling/device"
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

// tree runs pass p over the tree, chunked and pipelined: each rank adds its
// children's partial sums of chunk k to its own weighted chunk and sends the
// sum up as soon as it has it; the root turns chunk k into the final result
// and sends it down, and every rank forwards what it receives from its
// parent to its children. A compressed pass moves whole messages: a rank
// decodes and sums its own and its children's, re-encodes the sum for its
// parent, and forwards the root's bytes once it has decoded them.
//
// Goroutines: upFrom(c) per child receives the child's partial sums;
// combine adds them (at the root, finalises); upTo sends the sums to the
// parent; downFrom receives the result from the parent into dst; downTo(c)
// per child forwards it.
func (a *attempt) tree(p *pass) {
	n, me := a.n, a.rank
	var kids []int
	for _, c := range []int{2*me + 1, 2*me + 2} {
		if c < n {
			kids = append(kids, c)
		}
	}
	in, sum, fwd := a.treeMsgs(p, kids)
	kidW := make([]float64, len(kids))
	chunks := p.maxChunks(p.d)
	// arrived[i] gets a token for kid i's header, then one per chunk;
	// ready[i] one once the result's header may go down to it, then one
	// per chunk; up one once our sum's header may go up, then one per
	// chunk.
	arrived := make([]chan struct{}, len(kids))
	ready := make([]chan struct{}, len(kids))
	for i := range kids {
		arrived[i] = make(chan struct{}, chunks+1)
		ready[i] = make(chan struct{}, chunks+1)
	}
	var up chan struct{}
	var upW float64 // our subtree's weight, set before the first token on up
	publish := func(k int) { signal(k, ready...) }

	var wg sync.WaitGroup
	lanes := 2*len(kids) + 1
	down := sum // the result going down: ours at the root, else the parent's
	if me > 0 {
		lanes += 2
		parent := (me - 1) / 2
		up = make(chan struct{}, chunks+1)
		down = fwd
		wg.Go(func() { // downFrom
			hdr := func(h header) { a.total = h.weight; publish(1) }
			if a.recvResult(parent, StepDown, p, 0, p.d, fwd, a.downMult(me), kindTimeout, hdr, func(int) { publish(1) }) {
				a.laneDone()
			}
		})
		wg.Go(func() { // upTo
			if a.wait(up) && a.sendMsg(parent, StepUp, p, upW, *sum, up, a.maxMult()) {
				a.laneDone()
			}
		})
	}
	a.lanes.Store(int64(lanes))
	for i, c := range kids {
		wg.Go(func() { // upFrom
			h := treeHeight(c, n)
			mult, why := 1+h, kindTimeout
			if h == 0 {
				why = kindStall // a leaf's sums depend on no one
			}
			token := func(int) { arrived[i] <- struct{}{} }
			hdr := func(h header) { kidW[i] = h.weight; token(0) }
			if a.recvMsg(c, StepUp, p, p.d, in[c], mult, why, hdr, token) {
				a.laneDone()
			}
		})
		wg.Go(func() { // downTo
			if a.wait(ready[i]) && a.sendMsg(c, StepDown, p, a.total, *down, ready[i], a.maxMult()) {
				a.laneDone()
			}
		})
	}
	wg.Go(func() { a.combine(p, kids, in, kidW, arrived, sum, up, &upW, publish) })
	wg.Wait()
}

// treeMsgs returns the messages of a tree pass: buffers for the children's
// sums by rank (in; in[me] is our own contribution), our sum (sum: what
// goes up, or down from the root) and what the parent sends down (fwd).
func (a *attempt) treeMsgs(p *pass, kids []int) (in []*msg, sum, fwd *msg) {
	me := a.rank
	in = make([]*msg, a.n)
	if p.coded() {
		c := a.r.comp
		c.ranks(a.n)
		a.encodePart(p, &c.parts[me], 0, 0, p.d, false)
		for _, k := range kids {
			in[k] = &c.in[k]
		}
		in[me] = &c.parts[me]
		return in, &c.out, &c.res[(me-1)/2]
	}
	for i, c := range kids {
		in[c] = &msg{w: a.r.buf([]string{"kid0", "kid1"}[i], p.d)}
	}
	in[me] = &msg{w: p.src}
	sum = &msg{w: a.r.buf("acc", p.d)}
	if me == 0 {
		sum = &msg{w: p.dst}
	}
	return in, sum, &msg{}
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

// combine sums our contribution and the children's (from in, as they
// arrive) into sum and hands it on: at the root, where sum is dst, to the
// downTo lanes (publish); elsewhere, with our subtree's weight in upW, to
// upTo (tokens on up).
func (a *attempt) combine(p *pass, kids []int, in []*msg, kidW []float64, arrived []chan struct{}, sum *msg, up chan struct{}, upW *float64, publish func(int)) {
	me := a.rank
	for _, ch := range arrived {
		if !a.wait(ch) {
			return
		}
	}
	sub := a.weight
	for _, w := range kidW {
		sub += w
	}
	*upW = sub
	_, mean := a.r.cfg.Rule.(rule.Mean)
	if me == 0 {
		a.total = sub
		if mean && !(sub > 0 && isFinite(sub)) {
			a.setFault(faultZeroWeight)
			return
		}
	}
	// hand announces k more tokens' worth of sum to whoever sends it on.
	hand := func(k int) {
		if me == 0 {
			publish(k)
		} else {
			signal(k, up)
		}
	}
	if p.coded() {
		for i, c := range kids {
			if !a.waitWhole(p, in[c], arrived[i]) {
				return
			}
		}
		if !a.sumAtHop(p.d, append([]int{me}, kids...), in, sum) || (me == 0 && !a.decodeInto(me, p.dst, sum.b)) {
			return
		}
		hand(1 + numChunks(len(sum.w), p.chunk))
		a.laneDone()
		return
	}

	coef := float32(1)
	if mean {
		coef = float32(a.weight)
	}
	be := a.r.be
	hand(1) // the header can go
	for k := range numChunks(p.d, p.chunk) {
		for _, ch := range arrived {
			if !a.wait(ch) {
				return
			}
		}
		lo, hi := chunkRange(0, p.d, p.chunk, k)
		if len(kids) == 0 && me == 0 {
			copy(p.dst[lo:hi], p.src[lo:hi]) // alone: the sum and the mean are src itself
			continue
		}
		out := sum.w[lo:hi]
		copy(out, p.src[lo:hi])
		if coef != 1 {
			be.Scale(coef, out)
		}
		for _, c := range kids {
			be.Axpy(1, in[c].w[lo:hi], out)
		}
		if rule.FirstNonFinite(out) >= 0 {
			a.setFault(faultOverflow)
			return
		}
		if me == 0 && mean && !device.DivFinite(out, a.total) {
			a.setFault(faultOverflow)
			return
		}
		hand(1)
	}
	a.laneDone()
}
