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

// butterfly runs the data phase of the butterfly all-reduce: a direct
// reduce-scatter followed by an all-gather, chunked and pipelined.
//
// Goroutines, for each other rank j: scatterTo(j) sends our part of j's
// shard; scatterFrom(j) receives j's part of our shard; gatherTo(j) sends
// our reduced shard as its chunks become ready; gatherFrom(j) receives j's
// reduced shard into dst. One reducer reduces our shard chunk by chunk as
// the contributions arrive (local rules) or once all have arrived
// (Krum, centered clipping, which first agree on statistics with the other
// owners).
func (a *attempt) butterfly() {
	n, me, d := a.n, a.rank, len(a.src)
	C := a.chunk
	ownOff, ownSize := shardRange(d, n, me)
	ownChunks := numChunks(ownSize, C)

	// gather holds the contributions to our shard, one row per rank (our
	// own row points into src).
	rows := make([][]float32, n)
	gbuf := a.r.buf("gather", n*ownSize)
	for j := range n {
		if j == me {
			rows[j] = a.src[ownOff : ownOff+ownSize]
		} else {
			rows[j] = gbuf[j*ownSize : (j+1)*ownSize]
		}
	}
	weights := make([]float64, n)
	weights[me] = a.weight
	// arrived[j] gets one token for j's header and one per chunk.
	arrived := make([]chan struct{}, n)
	// ready[j] gets one token per reduced chunk of our shard, for gatherTo(j).
	ready := make([]chan struct{}, n)
	for j := range n {
		if j != me {
			arrived[j] = make(chan struct{}, ownChunks+1)
			ready[j] = make(chan struct{}, ownChunks)
		}
	}

	var wg sync.WaitGroup
	a.lanes.Store(int64(4*(n-1) + 1))
	for j := range n {
		if j == me {
			continue
		}
		wg.Go(func() { a.scatterTo(j) })
		wg.Go(func() { a.scatterFrom(j, rows[j], &weights[j], arrived[j]) })
		wg.Go(func() { a.gatherTo(j, ownOff, ownSize, ready[j]) })
		wg.Go(func() { a.gatherFrom(j) })
	}
	wg.Go(func() { a.reduceShard(rows, weights, arrived, ready, ownOff, ownSize) })
	wg.Wait()
}

func (a *attempt) scatterTo(j int) {
	var hw [headerLen]float32
	header{cfg: a.cfg, d: uint64(len(a.src)), weight: a.weight}.encode(hw[:])
	if !a.send(j, StepScatter, 0, hw[:], 1) {
		return
	}
	C := a.chunk
	off, size := shardRange(len(a.src), a.n, j)
	for k := range numChunks(size, C) {
		lo, hi := chunkRange(off, size, C, k)
		if !a.send(j, StepScatter, uint32(k+1), a.src[lo:hi], 1) {
			return
		}
	}
	a.laneDone()
}

func (a *attempt) scatterFrom(j int, row []float32, w *float64, arrived chan<- struct{}) {
	h, ok := a.recvHeader(j, StepScatter, 1, kindStall)
	if !ok {
		return
	}
	*w = h.weight
	arrived <- struct{}{}
	C := a.chunk
	chunk := func(k int) []float32 { lo, hi := chunkRange(0, len(row), C, k); return row[lo:hi] }
	if a.recvLane(j, StepScatter, 1, numChunks(len(row), C), chunk, 1, kindStall, true, func(int) { arrived <- struct{}{} }) {
		a.laneDone()
	}
}

func (a *attempt) gatherTo(j, off, size int, ready <-chan struct{}) {
	C := a.chunk
	for k := range numChunks(size, C) {
		if !a.wait(ready) {
			return
		}
		lo, hi := chunkRange(off, size, C, k)
		if !a.send(j, StepGather, uint32(k), a.dst[lo:hi], 2) {
			return
		}
	}
	a.laneDone()
}

func (a *attempt) gatherFrom(j int) {
	C := a.chunk
	off, size := shardRange(len(a.src), a.n, j)
	chunk := func(k int) []float32 { lo, hi := chunkRange(off, size, C, k); return a.dst[lo:hi] }
	if a.recvLane(j, StepGather, 0, numChunks(size, C), chunk, 2, kindTimeout, true, nil) {
		a.laneDone()
	}
}

// reduceShard reduces our shard into dst[off:off+size] and hands each
// finished chunk to the gatherTo lanes.
func (a *attempt) reduceShard(rows [][]float32, weights []float64, arrived, ready []chan struct{}, off, size int) {
	n, me := a.n, a.rank
	C := a.chunk
	chunks := numChunks(size, C)
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
	publish := func() {
		for j := range n {
			if j != me {
				ready[j] <- struct{}{}
			}
		}
	}
	srcs := make([][]float32, n)
	if lr, ok := a.r.cfg.Rule.(rule.LocalRule); ok {
		var s rule.Scratch
		for k := range chunks {
			for j := range n {
				if j != me && !a.wait(arrived[j]) {
					return
				}
			}
			lo, hi := chunkRange(0, size, C, k)
			for j := range n {
				srcs[j] = rows[j][lo:hi]
			}
			out := a.dst[off+lo : off+hi]
			if err := lr.ReduceLocal(out, srcs, weights, &s); err != nil {
				a.setFault(faultRule)
				return
			}
			if rule.FirstNonFinite(out) >= 0 {
				a.setFault(faultOverflow)
				return
			}
			publish()
		}
		a.laneDone()
		return
	}

	// Non-local rules: wait for the whole shard, then agree on statistics.
	for range chunks {
		for j := range n {
			if j != me && !a.wait(arrived[j]) {
				return
			}
		}
	}
	p, err := a.r.cfg.Rule.Start(rows, weights)
	if err != nil {
		a.setFault(faultRule)
		return
	}
	for pass := uint32(0); ; pass++ {
		st := p.Stats()
		if st == nil {
			break
		}
		global, ok := a.exchangeStats(pass, st)
		if !ok {
			return
		}
		if p.Absorb(global) != nil {
			a.setFault(faultRule)
			return
		}
	}
	out := a.dst[off : off+size]
	if p.Finish(out) != nil {
		a.setFault(faultRule)
		return
	}
	if rule.FirstNonFinite(out) >= 0 {
		a.setFault(faultOverflow)
		return
	}
	for range chunks {
		publish()
	}
	a.laneDone()
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
