package aggregate

import (
	"sync"

	"github.com/starling-ml/starling/aggregate/rule"
)

// shardRange returns the coordinates [off, off+size) that rank j of n owns
// in a vector of d values: contiguous shards whose sizes differ by at most
// one.
func shardRange(d, n, j int) (off, size int) {
	off = int(int64(d) * int64(j) / int64(n))
	end := int(int64(d) * int64(j+1) / int64(n))
	return off, end - off
}

// numChunks returns how many chunks of c values cover size values.
func numChunks(size, c int) int { return (size + c - 1) / c }

// chunkRange returns chunk k of a span of size values starting at off.
func chunkRange(off, size, c, k int) (lo, hi int) {
	lo = off + k*c
	hi = min(lo+c, off+size)
	return lo, hi
}

// butterfly runs pass p as a butterfly: a direct reduce-scatter followed by
// an all-gather, chunked and pipelined.
//
// Goroutines, for each other rank j: scatterTo(j) sends our part of j's
// shard; scatterFrom(j) receives j's part of our shard; gatherTo(j) sends
// our reduced shard as its chunks become ready; gatherFrom(j) receives j's
// reduced shard into dst. One reducer reduces our shard chunk by chunk as
// the contributions arrive (local rules), or once all have arrived: Krum
// and centered clipping, which first agree on statistics with the other
// owners, and compressed passes, which decode, sum and re-encode.
func (a *attempt) butterfly(p *pass) {
	n, me := a.n, a.rank
	ownOff, ownSize := shardRange(p.d, n, me)
	out, in, res, result := a.butterflyMsgs(p)
	weights := make([]float64, n)
	weights[me] = a.weight
	// arrived[j] gets one token for j's header and one per chunk.
	arrived := make([]chan struct{}, n)
	// ready[j] gets one token once the reduced shard may go, then one per
	// chunk, for gatherTo(j).
	ready := make([]chan struct{}, n)
	for j := range n {
		if j != me {
			arrived[j] = make(chan struct{}, p.maxChunks(ownSize)+1)
			ready[j] = make(chan struct{}, p.maxChunks(ownSize)+1)
		}
	}

	var wg sync.WaitGroup
	a.lanes.Store(int64(4*(n-1) + 1))
	for j := range n {
		if j == me {
			continue
		}
		token := func(int) { arrived[j] <- struct{}{} }
		off, size := shardRange(p.d, n, j)
		wg.Go(func() { // scatterTo
			if a.sendMsg(j, StepScatter, p, a.weight, out[j], nil, 1) {
				a.laneDone()
			}
		})
		wg.Go(func() { // scatterFrom
			hdr := func(h header) { weights[j] = h.weight; token(0) }
			if a.recvMsg(j, StepScatter, p, ownSize, in[j], 1, kindStall, hdr, token) {
				a.laneDone()
			}
		})
		wg.Go(func() { // gatherTo
			if a.wait(ready[j]) && a.sendMsg(j, StepGather, p, a.total, *result, ready[j], 2) {
				a.laneDone()
			}
		})
		wg.Go(func() { // gatherFrom
			if a.recvResult(j, StepGather, p, off, size, &res[j], 2, kindTimeout, nil, nil) {
				a.laneDone()
			}
		})
	}
	wg.Go(func() { a.reduceShard(p, in, weights, arrived, ready, ownOff, ownSize, result) })
	wg.Wait()
}

// butterflyMsgs returns the messages of a butterfly pass by rank: our part
// of each rank's shard (out), buffers for each rank's part of ours (in;
// in[me] is our own) and for each rank's reduced shard (res), and our
// reduced shard's message (result), which the reducer fills before it
// lets the gather go.
func (a *attempt) butterflyMsgs(p *pass) (out []msg, in []*msg, res []msg, result *msg) {
	n, me := a.n, a.rank
	in = make([]*msg, n)
	if p.coded() {
		c := a.r.comp
		c.ranks(n)
		for j := range n {
			off, size := shardRange(p.d, n, j)
			a.encodePart(p, &c.parts[j], j, off, off+size, j != me)
			in[j] = &c.in[j]
		}
		in[me] = &c.parts[me]
		return c.parts, in, c.res, &c.out
	}
	out, res = make([]msg, n), make([]msg, n)
	_, ownSize := shardRange(p.d, n, me)
	gbuf := a.r.buf("gather", n*ownSize)
	for j := range n {
		off, size := shardRange(p.d, n, j)
		out[j] = msg{w: p.src[off : off+size]}
		in[j] = &msg{w: gbuf[j*ownSize : (j+1)*ownSize]}
	}
	in[me] = &out[me]
	off, _ := shardRange(p.d, n, me)
	return out, in, res, &msg{w: p.dst[off : off+ownSize]}
}

// reduceShard reduces our shard into dst[off:off+size] and hands each
// finished chunk to the gatherTo lanes (a compressed pass: the encoded
// shard in result, all at once).
func (a *attempt) reduceShard(p *pass, in []*msg, weights []float64, arrived, ready []chan struct{}, off, size int, result *msg) {
	n, me := a.n, a.rank
	for j := range n {
		if j != me && !a.wait(arrived[j]) {
			return
		}
	}
	var total float64
	for _, w := range weights {
		total += w
	}
	a.total = total
	if _, mean := a.r.cfg.Rule.(rule.Mean); mean && !(total > 0 && isFinite(total)) {
		a.setFault(faultZeroWeight)
		return
	}
	publish := func(k int) { signal(k, ready...) }
	srcs := make([][]float32, n)
	if lr, ok := a.r.cfg.Rule.(rule.LocalRule); ok && !p.coded() {
		publish(1)
		s := rule.Scratch{Backend: a.r.be}
		for k := range numChunks(size, p.chunk) {
			for j := range n {
				if j != me && !a.wait(arrived[j]) {
					return
				}
			}
			lo, hi := chunkRange(0, size, p.chunk, k)
			for j := range n {
				srcs[j] = in[j].w[lo:hi]
			}
			out := p.dst[off+lo : off+hi]
			if err := lr.ReduceLocal(out, srcs, weights, &s); err != nil {
				a.setFault(faultRule)
				return
			}
			if rule.FirstNonFinite(out) >= 0 {
				a.setFault(faultOverflow)
				return
			}
			publish(1)
		}
		a.laneDone()
		return
	}

	// Wait for every contribution whole.
	for j := range n {
		if j != me && !a.waitWhole(p, in[j], arrived[j]) {
			return
		}
	}
	if p.coded() {
		if !a.sumAtHop(size, a.allRanks(), in, result) || !a.decodeInto(me, p.dst[off:off+size], result.b) {
			return
		}
		publish(1 + numChunks(len(result.w), p.chunk))
		a.laneDone()
		return
	}
	// Non-local rules: agree on statistics with the other owners.
	for j := range n {
		srcs[j] = in[j].w
	}
	rp, err := a.rule.Start(srcs, weights)
	if err != nil {
		a.setFault(faultRule)
		return
	}
	for sp := uint32(0); ; sp++ {
		st := rp.Stats()
		if st == nil {
			break
		}
		global, ok := a.exchangeStats(sp, st)
		if !ok {
			return
		}
		if rp.Absorb(global) != nil {
			a.setFault(faultRule)
			return
		}
	}
	out := p.dst[off : off+size]
	if rp.Finish(out) != nil {
		a.setFault(faultRule)
		return
	}
	if rule.FirstNonFinite(out) >= 0 {
		a.setFault(faultOverflow)
		return
	}
	publish(1 + numChunks(size, p.chunk))
	a.laneDone()
}

// allRanks returns 0, …, n−1.
func (a *attempt) allRanks() []int {
	r := make([]int, a.n)
	for j := range r {
		r[j] = j
	}
	return r
}

// exchangeStats sends our statistics of a pass to every other owner,
// receives theirs, and returns the element-wise sum in rank order, which
// is the same bits on every owner.
func (a *attempt) exchangeStats(pass uint32, st []float64) ([]float64, bool) {
	n, me := a.n, a.rank
	mine := make([]float32, 2*len(st))
	encodeStats(mine, st)
	var wg sync.WaitGroup
	for j := range n {
		if j != me {
			wg.Go(func() { a.send(j, StepStats, pass, mine, 2) })
		}
	}
	all := make([][]float64, n)
	all[me] = st
	ok := true
	w := make([]float32, 2*len(st))
	for j := range n {
		if j == me {
			continue
		}
		if !a.recv(j, StepStats, pass, w, 2, kindTimeout) {
			ok = false
			break
		}
		all[j] = make([]float64, len(st))
		if decodeStats(all[j], w) != nil {
			a.accuse(j, kindBadValue)
			ok = false
			break
		}
	}
	wg.Wait()
	if !ok || a.bad.Load() {
		return nil, false
	}
	global := make([]float64, len(st))
	for _, s := range all {
		for i, v := range s {
			global[i] += v
		}
	}
	return global, true
}
