package aggregate

import (
	"sync"

	"github.com/starling-ml/starling/aggregate/rule"
	"github.com/starling-ml/starling/device"
)

// ringItem is one chunk of the ring's send or receive sequence: the
// coordinates [lo, hi) of the vector it carries; whether it is a partial
// sum still to be combined with our own contribution (reduce-scatter)
// rather than a final value (all-gather); and, for a received partial sum,
// whether combining it completes the sum (our own segment, last step).
type ringItem struct {
	lo, hi        int
	reduce, final bool
}

// ringPlan lists, in order, the chunks rank me of n sends to its right
// neighbour and receives from its left one, for a vector of d values in
// chunks of c. Segment s is shardRange(d, n, s). In step t of the
// reduce-scatter (0 ≤ t < n−1) a rank sends its partial sum of segment
// me−t and receives its left neighbour's of segment me−t−1, adds its own
// contribution and sends that on in step t+1; after step n−2 it holds the
// full sum of segment me+1. In step u of the all-gather (0 ≤ u < n−1) it
// sends final segment me+1−u and receives final segment me−u, which it
// sends on in the next step. So received item k is sent item k+m₀, where
// m₀ is the number of chunks of our own segment (step 0); and a sender's
// item i is its right neighbour's received item i, which is the chunk
// number both use in the tag.
func ringPlan(d, n, me, c int) (send, recv []ringItem) {
	mod := func(x int) int { return ((x % n) + n) % n }
	add := func(items []ringItem, s int, reduce, final bool) []ringItem {
		off, size := shardRange(d, n, mod(s))
		for k := range numChunks(size, c) {
			lo, hi := chunkRange(off, size, c, k)
			items = append(items, ringItem{lo, hi, reduce, final})
		}
		return items
	}
	for t := range n - 1 {
		send = add(send, me-t, true, false)
		recv = add(recv, me-t-1, true, t == n-2)
	}
	for u := range n - 1 {
		send = add(send, me+1-u, false, false)
		recv = add(recv, me-u, false, false)
	}
	return send, recv
}

// ring runs the data phase of the ring all-reduce (linear rules): a
// pipelined reduce-scatter around the ring of ranks, then an all-gather
// around it (see ringPlan). Each rank sends 2(n−1)/n of the vector, all of
// it to one neighbour on one stream, and receives as much from the other;
// chunks flow on as soon as they are combined, so every link is busy from
// the first chunk to the last.
//
// Goroutines: one per other rank sends it our header (weight, settings),
// hdrFrom(j) receives theirs (the owner of a segment needs the total
// weight to finish a mean); lane A receives the left neighbour's header and
// its step-0 chunks, which depend on no one else (a silence there is a
// stall); lane B receives the rest, which depends on the whole ring (a
// silence there is a timeout); the sender combines each received partial
// sum with our contribution and sends every chunk on in order.
//
// Blame: a rank checks what it receives (non-finite values blame the left
// neighbour), what it creates (an overflow is a group fault) and its own
// input where it reads it (blaming itself), so a bad value is pinned on the
// rank that sent it. A silent rank starves the whole ring, but in order: a
// rank sends only what it received, so its right neighbour last heard of it
// after it last heard of its left one, and the rank next to the silence
// times out first (a timeout, blaming a member that then blames no one
// unless it is itself waiting; see decide); its FAIL vote stops the others
// before their own waits run out. Should its timer run late (a busy
// machine) and the next rank time out first and blame it, its wait is
// overdue when that vote stops it, and it blames the silent rank as if the
// timer had fired (see overdue), which clears it. And a rank whose sender
// was waiting for input when the data phase stopped says so in its vote
// (starvedBy), so that a timeout on it, however the timers fell, does not
// exclude it.
func (a *attempt) ring() {
	n, me, d := a.n, a.rank, len(a.src)
	if n == 1 {
		a.butterfly(a.plainPass()) // a group of one: the butterfly's lone owner does it
		return
	}
	left, right := (me+n-1)%n, (me+1)%n
	send, recv := ringPlan(d, n, me, a.chunk)
	_, mean := a.r.cfg.Rule.(rule.Mean)
	coef := float32(1)
	if mean {
		coef = float32(a.weight)
	}
	// Step 0 sends our weighted contribution to our own segment, own[i]
	// (from coordinate ownOff) times coef, chunk by chunk (ringSend), scaled
	// into ring0 unless coef is 1.
	ownOff, size := shardRange(d, n, me)
	own := a.src[ownOff : ownOff+size]
	var scaled []float32
	if coef != 1 {
		scaled = a.r.buf("ring0", size)
	}
	m0 := numChunks(size, a.chunk)
	_, sizeA := shardRange(d, n, left) // our step-0 receipt is the left's own segment
	mA := numChunks(sizeA, a.chunk)

	weights := make([]float64, n)
	weights[me] = a.weight
	hdrs := make(chan struct{}, n-1)    // a token per checked header
	leftOK := make(chan struct{})       // closed once the left's header checks out
	arrivedA := make(chan struct{}, mA) // a token per received item k < mA, in order
	arrivedB := make(chan struct{}, len(recv)-mA)

	// hdrFrom receives and records rank j's header.
	hdrFrom := func(j int) bool {
		h, ok := a.recvHeader(j, StepScatter, a.plainPass(), 1, kindStall)
		if ok {
			weights[j] = h.weight
			hdrs <- struct{}{}
		}
		return ok
	}

	var wg sync.WaitGroup
	a.lanes.Store(int64(2*(n-1) + 2))
	var hw [headerLen]float32
	header{cfg: a.cfg, d: uint64(d), weight: a.weight}.encode(hw[:])
	for j := range n {
		if j == me {
			continue
		}
		wg.Go(func() {
			if a.send(j, StepScatter, 0, hw[:], 1) {
				a.laneDone()
			}
		})
		if j != left {
			wg.Go(func() {
				if hdrFrom(j) {
					a.laneDone()
				}
			})
		}
	}
	item := func(k int) []float32 { return a.dst[recv[k].lo:recv[k].hi] }
	// A partial sum is checked where ringSend adds our contribution to it
	// (device.AxpyFinite: one pass for both checks and the sum); a
	// completed one on receipt.
	checkA := func(k int) bool { return !recv[k].reduce }
	checkB := func(k int) bool { return !recv[mA+k].reduce }
	// Where the transport can, it adds our contribution to a partial sum
	// as the sum arrives, with the kernel AxpyFinite would use, and keeps
	// its checksums of what it delivered for the chunk's way on.
	fusedSums := make([]fused, len(recv))
	var fuse func(k int) *fused
	if _, ok := a.r.t.(AxpyReceiver); ok {
		sums := device.AxpyToRuns(a.r.be)
		fuse = func(k int) *fused {
			fusedSums[k] = fused{alpha: coef}
			if recv[k].reduce && sums {
				fusedSums[k].x = a.src[recv[k].lo:recv[k].hi]
			}
			return &fusedSums[k]
		}
	}
	fuseA, fuseB := fuse, fuse
	if fuse != nil {
		fuseB = func(k int) *fused { return fuse(mA + k) }
	}
	wg.Go(func() { // lane A
		if !hdrFrom(left) {
			return
		}
		close(leftOK)
		if a.recvLane(left, StepRing, 0, mA, item, 1, kindStall, checkA, fuseA, func(int) { arrivedA <- struct{}{} }) {
			a.laneDone()
		}
	})
	wg.Go(func() { // lane B
		if !a.wait(leftOK) {
			return
		}
		rest := func(k int) []float32 { return item(mA + k) }
		if a.recvLane(left, StepRing, uint32(mA), len(recv)-mA, rest, 2, kindTimeout, checkB, fuseB, func(int) { arrivedB <- struct{}{} }) {
			a.laneDone()
		}
	})
	wg.Go(func() {
		a.ringSend(right, send, recv, fusedSums, m0, mA, own, scaled, ownOff, coef, mean, weights, hdrs, arrivedA, arrivedB)
	})
	wg.Wait()
}

// ringSend is the ring's sender: item i < m0 is our own segment (own,
// from coordinate ownOff), checked and then, unless coef is 1, scaled by
// coef into scaled, as it goes; item i ≥ m0 is received item i−m0,
// combined with our contribution first if it is a partial sum (unless the
// transport did so as it arrived: fusedSums).
// Completed sums are our segment of the result: for a mean they are
// divided by the total weight, which needs every member's header. Every
// rank learns the total, even one whose segment is empty.
func (a *attempt) ringSend(right int, send, recv []ringItem, fusedSums []fused, m0, mA int, own, scaled []float32, ownOff int, coef float32, mean bool, weights []float64, hdrs, arrivedA, arrivedB <-chan struct{}) {
	be := a.r.be
	haveTotal := false
	total := func() bool {
		if haveTotal {
			return true
		}
		for range len(weights) - 1 {
			if !a.wait(hdrs) {
				return false
			}
		}
		var t float64
		for _, w := range weights {
			t += w
		}
		a.total, haveTotal = t, true
		if mean && !(t > 0 && isFinite(t)) {
			a.setFault(faultZeroWeight)
			return false
		}
		return true
	}
	for i, it := range send {
		if i < m0 {
			// Our input is checked where it is read (attempt.ringChecksOwn):
			// our own segment here, a chunk at a time just before it goes,
			// so that node's checksum reads it from the cache (a bad chunk
			// is never sent; those before it may have been), the rest where
			// we add it to partial sums below. A scaled chunk is checked
			// once, after scaling (a bad input stays bad); only a bad one
			// is looked at again, to tell a bad input from a weight that
			// overflows.
			chunk := own[it.lo-ownOff : it.hi-ownOff]
			if scaled != nil {
				sc := scaled[it.lo-ownOff : it.hi-ownOff]
				copy(sc, chunk)
				be.Scale(coef, sc)
				if !device.AllFinite(sc) {
					if !device.AllFinite(chunk) {
						a.accuse(a.rank, kindBadValue) // vote to be left out
					} else {
						a.setFault(faultOverflow) // a huge weight: the same fault for all
					}
					return
				}
				chunk = sc
			} else if !device.AllFinite(chunk) {
				a.accuse(a.rank, kindBadValue) // vote to be left out
				return
			}
			if !a.send(right, StepRing, uint32(i), chunk, 2) {
				return
			}
			continue
		}
		k := i - m0
		ch := arrivedB
		if k < mA {
			ch = arrivedA
		}
		if !a.wait(ch) {
			a.starvedBy((a.rank + a.n - 1) % a.n)
			return
		}
		out := a.dst[it.lo:it.hi]
		sums := fusedSums[k].sums // of out as received: until changed here
		if recv[k].reduce {
			x := a.src[it.lo:it.hi]
			in, ok := fusedSums[k].in, fusedSums[k].ok
			if !fusedSums[k].summed {
				in, ok = device.AxpyFinite(be, coef, x, out)
				sums = nil
			}
			if (!in || !ok) && !device.AllFinite(x) {
				a.accuse(a.rank, kindBadValue) // our own input: see ringChecksOwn
				return
			}
			if !in {
				a.accuse((a.rank+a.n-1)%a.n, kindBadValue) // the left's partial sum
				return
			}
			if recv[k].final && mean {
				if !total() {
					return
				}
				ok = device.DivFinite(out, a.total)
				sums = nil
			}
			if !ok {
				a.setFault(faultOverflow)
				return
			}
		}
		if !a.sendSums(right, StepRing, uint32(i), out, 2, sums) {
			return
		}
	}
	if total() {
		a.laneDone()
	}
}
