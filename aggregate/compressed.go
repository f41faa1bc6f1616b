package aggregate

import (
	"encoding/binary"
	"fmt"
	"math"
	"sync"

	"github.com/starling-ml/starling/aggregate/rule"
	"github.com/starling-ml/starling/compression"
)

// Compressed all-reduce: Config.Compress names a codec (compression.Parse
// syntax), and every contribution then travels encoded. The protocol is the
// same tree or butterfly, the same lanes, watchdogs and votes as the plain
// one; what differs is what a lane carries and what a reducing hop does:
//
//   - Each lane carries one message: a cheader (settings hash, vector
//     length, weight, byte length) as chunk 0, then the encoded bytes packed
//     four to a float32 word (little-endian, zero-padded) in chunks of
//     ChunkElems words. Messages of pass p use chunk indices p<<24 | c.
//   - A peer's contribution is v = w·x + e (w = its weight for Mean, 1 for
//     Sum; e = its error-feedback residual), encoded with the leaf codec, per
//     shard in a butterfly (each owner's shard encoded separately) and whole
//     in a tree. With error feedback the peer keeps e' = v − decode(encode(v))
//     and commits it only when the round commits, so a re-run attempt
//     re-encodes from the same state.
//   - A reducing hop (butterfly owner, tree node) decodes each contribution,
//     blames its sender for bytes that do not decode or decode to NaN/±Inf,
//     and sums them with a compression.Combiner: sparse codecs are merged
//     exactly (densified once the union stops paying), dense ones summed and
//     re-encoded with compression.HopCodec (fp16/bf16/int8 with themselves,
//     sign with int8). The owner's (the root's) bytes go to every peer
//     unchanged, and every peer, the owner included, decodes those bytes, so
//     all members end with the same bits. Mean then divides by the total
//     weight.
//   - PowerSGD runs as two passes of dense float32 all-reduce in one
//     attempt: P = Σ M_i·Q, then Q = Σ M_iᵀ·P̂ (see compression.PowerSGD);
//     the result is P̂·Qᵀ / W and every peer keeps Q as the next warm start
//     (committed with the round). With "ef", peer i keeps e_i = M_i − P̂·Q_iᵀ
//     on the compressed tensors; raw tensors (biases) travel exactly.
//
// Robust rules (median, Krum, …) need every contribution exactly and are not
// offered with compression (Config.Validate refuses them).

// passShift is where the pass number sits in a compressed lane's chunk index.
const passShift = 24

// maxPassChunks bounds the data chunks of one compressed message.
const maxPassChunks = 1<<passShift - 1

const (
	cheaderMagic = 0x504d4353 // "SCMP"
	cheaderLen   = 10
)

// cheader opens every compressed lane.
type cheader struct {
	cfg    uint64
	d      uint64 // vector length of the pass (of the whole vector, not the shard)
	weight float64
	nbytes uint64
}

func (h cheader) encode(w []float32) {
	putU32(w[0:], cheaderMagic)
	putU64(w[1:], h.cfg)
	putU64(w[3:], h.d)
	putF64(w[5:], h.weight)
	putU64(w[7:], h.nbytes)
	putU32(w[9:], 0)
}

func decodeCHeader(w []float32) (cheader, error) {
	if len(w) != cheaderLen {
		return cheader{}, fmt.Errorf("%w: compressed header of %d words", ErrBadValue, len(w))
	}
	if getU32(w[0:]) != cheaderMagic || getU32(w[9:]) != 0 {
		return cheader{}, fmt.Errorf("%w: bad compressed header magic or flags", ErrBadValue)
	}
	h := cheader{cfg: getU64(w[1:]), d: getU64(w[3:]), weight: getF64(w[5:]), nbytes: getU64(w[7:])}
	if !rule.ValidWeight(h.weight) {
		return cheader{}, fmt.Errorf("%w: header weight %v", ErrBadValue, h.weight)
	}
	return h, nil
}

// packWords stores b in ⌈len(b)/4⌉ words of dst (grown as needed), four
// bytes a word, little-endian, the last word zero-padded.
func packWords(dst []float32, b []byte) []float32 {
	n := (len(b) + 3) / 4
	if cap(dst) < n {
		dst = make([]float32, n)
	}
	dst = dst[:n]
	full := len(b) / 4
	for i := range full {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	if full < n {
		var tail [4]byte
		copy(tail[:], b[4*full:])
		dst[full] = math.Float32frombits(binary.LittleEndian.Uint32(tail[:]))
	}
	return dst
}

// unpackWords is packWords' inverse: the first n bytes stored in w.
func unpackWords(dst []byte, w []float32, n int) []byte {
	if cap(dst) < 4*len(w) {
		dst = make([]byte, 4*len(w))
	}
	dst = dst[:4*len(w)]
	for i, v := range w {
		binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
	}
	return dst[:n]
}

// maxEncoded is the longest encoding of n values any codec of
// compression may produce: what a receiver accepts before reading it.
func maxEncoded(n int) int { return compression.MaxEncodedLenAny(n) }

// Compression is one peer's state for compressed all-reduce (see
// Config.Compress): the codec, the error-feedback residual, PowerSGD's
// layout and warm start, and scratch. A Runner built with Config.Compress
// owns one (Runner.Compression); save its state with a checkpoint
// (AppendState) and load it into the Runner of a resumed peer (LoadState).
// Its methods are safe for concurrent use; they wait for a running round.
type Compression struct {
	mu   sync.Mutex
	spec string // canonical spec (the parsed codec's Name)

	leaf compression.Codec     // base codec with its entropy stage, without error feedback
	ef   bool                  // error feedback
	rk   *compression.RandK    // the base codec, when random-k (its step is set per shard)
	ps   *compression.PowerSGD // the base codec, when PowerSGD
	comb *compression.Combiner // sums a hop's contributions
	dec  compression.Decoder   // decodes on the reducing side

	residual []float32 // committed error-feedback residual (len d; nil before the first round)
	pending  []float32 // the residual after this attempt's encoding
	v        []float32 // this attempt's w·x + residual
	scratch  []float32 // decoded contribution at a reducing hop

	// PowerSGD
	layoutN    int // Σ rows·cols of a layout set by SetLayout (0: folded)
	raw        []bool
	pLocal     []float32
	qLocal     []float32
	pSum, qSum []float32

	// per-rank buffers, reused across rounds
	enc   [][]byte    // our encoded part of each shard
	encW  [][]float32 // enc packed into words
	inW   [][]float32 // received words by rank
	inB   [][]byte    // received bytes by rank
	gW    [][]float32 // gathered words by rank
	gB    [][]byte    // gathered bytes by rank
	decs  []compression.Decoder
	out   []byte    // a hop's combined bytes
	outW  []float32 // out packed
	fwdB  []byte    // bytes received from the tree parent
	fwdW  []float32 // words received from the tree parent
	pass0 []float32 // dense pass input (PowerSGD)
}

// newCompression builds the state for spec.
func newCompression(spec string) (*Compression, error) {
	c0, err := compression.Parse(spec)
	if err != nil {
		return nil, err
	}
	c := &Compression{spec: c0.Name()}
	var mode compression.EntropyMode
	if e, ok := c0.(*compression.Entropy); ok {
		mode, c0 = e.Mode(), e.Inner()
	}
	if e, ok := c0.(*compression.ErrorFeedback); ok {
		c.ef, c0 = true, e.Inner()
	}
	switch b := c0.(type) {
	case *compression.RandK:
		c.rk = b
	case *compression.PowerSGD:
		c.ps = b
	}
	c.leaf = c0
	if mode != compression.EntropyStored {
		if c.leaf, err = compression.NewEntropy(c0, mode); err != nil {
			return nil, err
		}
	}
	if c.ps != nil {
		// P and Q travel as exact float32 sums.
		c.comb = compression.NewCombiner(compression.FP32{})
	} else {
		c.comb = compression.NewCombiner(c.leaf)
	}
	return c, nil
}

// Spec returns the codec spec in canonical form (what peers must agree on).
func (c *Compression) Spec() string { return c.spec }

// ErrorFeedback reports whether contributions carry error feedback.
func (c *Compression) ErrorFeedback() bool { return c.ef }

// SetLayout gives PowerSGD the tensor shapes of the vectors to come (it
// folds the vector into one matrix without it) and resets its warm start and
// the residual. Every member of a round must set the same layout. Other
// codecs ignore it.
func (c *Compression) SetLayout(layout []compression.Shape) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ps == nil {
		return nil
	}
	if err := c.ps.SetLayout(layout); err != nil {
		return err
	}
	c.layoutN = 0
	for _, s := range layout {
		c.layoutN += s.Rows * s.Cols
	}
	c.raw, c.residual = nil, nil
	return nil
}

// Residual returns a copy of the committed error-feedback residual (nil
// before the first round or without error feedback).
func (c *Compression) Residual() []float32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.residual == nil {
		return nil
	}
	return append([]float32(nil), c.residual...)
}

// Reset zeroes the residual and restarts PowerSGD from its seed.
func (c *Compression) Reset() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.residual = nil
	if c.ps != nil {
		l := c.ps.Layout()
		if c.layoutN > 0 {
			return c.ps.SetLayout(l)
		}
		*c.ps = compression.PowerSGD{Rank: c.ps.Rank, Seed: c.ps.Seed}
		c.raw = nil
	}
	return nil
}

const (
	stateCompression = 0xc5
	stateVersion     = 1
)

// AppendState appends the committed state (the residual, and PowerSGD's
// layout and warm start) to dst: compression.AppendState's convention, to
// be saved with a checkpoint.
func (c *Compression) AppendState(dst []byte) []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	dst = append(dst, stateCompression, stateVersion)
	dst = binary.AppendUvarint(dst, uint64(len(c.spec)))
	dst = append(dst, c.spec...)
	dst = binary.AppendUvarint(dst, uint64(len(c.residual)))
	for _, v := range c.residual {
		dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(v))
	}
	if c.ps != nil {
		dst = compression.AppendState(dst, c.ps)
	}
	return dst
}

// LoadState replaces the state with one AppendState wrote for the same
// spec. On error (wrapping compression.ErrState) the state is unchanged
// unless the PowerSGD part was the one that failed.
func (c *Compression) LoadState(b []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: compressed all-reduce: %s", compression.ErrState, fmt.Sprintf(format, a...))
	}
	if len(b) < 2 || b[0] != stateCompression || b[1] != stateVersion {
		return bad("not a compression state")
	}
	b = b[2:]
	l, k := binary.Uvarint(b)
	if k <= 0 || l > uint64(len(b)-k) {
		return bad("truncated spec")
	}
	if spec := string(b[k : k+int(l)]); spec != c.spec {
		return bad("state of %q, runner compresses with %q", spec, c.spec)
	}
	b = b[k+int(l):]
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)-k)/4 {
		return bad("truncated residual")
	}
	b = b[k:]
	var res []float32
	if n > 0 {
		res = make([]float32, n)
		for i := range res {
			res[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
	}
	b = b[4*n:]
	if c.ps != nil {
		if err := compression.LoadState(c.ps, b); err != nil {
			return err
		}
		c.raw = nil
		if c.layoutN > 0 {
			c.layoutN = 0
			for _, s := range c.ps.Layout() {
				c.layoutN += s.Rows * s.Cols
			}
		}
	} else if len(b) != 0 {
		return bad("%d trailing bytes", len(b))
	}
	c.residual = res
	return nil
}

// check reports whether a round of d values can run with chunks of C values.
func (c *Compression) check(d, C int) error {
	if c.ps != nil && c.layoutN > 0 && c.layoutN != d {
		return fmt.Errorf("%w: PowerSGD layout covers %d values, vector has %d", ErrBadInput, c.layoutN, d)
	}
	if numChunks((maxEncoded(d)+3)/4, C) > maxPassChunks {
		return fmt.Errorf("%w: %d values in chunks of %d make too many compressed chunks", ErrBadInput, d, C)
	}
	return nil
}

// commit makes the attempt that just succeeded the new state.
func (c *Compression) commit() {
	if c.ef {
		c.residual, c.pending = c.pending, c.residual
	}
	if c.ps != nil {
		c.ps.SetWarmStart(c.qSum)
	}
}

// ranks sizes the per-rank buffers for a group of n.
func (c *Compression) ranks(n int) {
	for len(c.enc) < n {
		c.enc = append(c.enc, nil)
		c.encW = append(c.encW, nil)
		c.inW = append(c.inW, nil)
		c.inB = append(c.inB, nil)
		c.gW = append(c.gW, nil)
		c.gB = append(c.gB, nil)
		c.decs = append(c.decs, compression.Decoder{})
	}
}

// rawMask returns, for PowerSGD, which values of a vector of d travel raw.
func (c *Compression) rawMask(d int) []bool {
	if len(c.raw) == d {
		return c.raw
	}
	c.ps.PLen(d) // fixes the layout
	c.raw = make([]bool, d)
	off := 0
	for _, s := range c.ps.Layout() {
		one := compression.PowerSGD{Rank: c.ps.Rank}
		if one.SetLayout([]compression.Shape{s}) == nil && one.QLen(s.Rows*s.Cols) == 0 {
			for i := off; i < off+s.Rows*s.Cols; i++ {
				c.raw[i] = true
			}
		}
		off += s.Rows * s.Cols
	}
	return c.raw
}

// cpass is one compressed all-reduce of a vector of d values.
type cpass struct {
	pass uint32
	d    int
	// encode appends to dst the encoding of our contribution's values
	// [lo, hi), part j of the pass.
	encode func(dst []byte, j, lo, hi int) []byte
	out    []float32 // the sum, len d
}

func (p *cpass) chunk(c uint32) uint32 { return p.pass<<passShift | c }

// compressed runs the data phase of a compressed all-reduce.
func (a *attempt) compressed() {
	c := a.r.comp
	d := len(a.src)
	c.ranks(a.n)
	coef := float32(1)
	if _, mean := a.r.cfg.Rule.(rule.Mean); mean {
		coef = float32(a.weight)
	}
	c.v = grow(c.v, d)
	if c.ef {
		if len(c.residual) != d {
			c.residual = make([]float32, d)
		}
		c.pending = grow(c.pending, d)
		for i, x := range a.src {
			c.v[i] = coef*x + c.residual[i]
		}
	} else {
		for i, x := range a.src {
			c.v[i] = coef * x
		}
	}
	if rule.FirstNonFinite(c.v) >= 0 {
		a.setFault(faultOverflow)
		return
	}
	if c.ps != nil {
		a.powerSGD()
		return
	}
	p := &cpass{d: d, out: a.dst, encode: func(dst []byte, j, lo, hi int) []byte {
		if c.rk != nil {
			// Every peer encodes part j of this round with the same step,
			// so their random indices coincide and sums stay sparse.
			c.rk.SetStep(a.g.round<<16 ^ uint64(j))
		}
		v := c.v[lo:hi]
		out := c.leaf.Encode(dst, v)
		if c.ef {
			e := c.pending[lo:hi]
			if err := c.dec.Decode(e, out); err != nil {
				panic(fmt.Sprintf("aggregate: %s cannot decode its own output: %v", c.spec, err))
			}
			for i := range e {
				e[i] = v[i] - e[i]
			}
		}
		return out
	}}
	if !a.runPass(p) {
		return
	}
	a.finishMean(a.dst)
}

// powerSGD runs PowerSGD's two dense passes.
func (a *attempt) powerSGD() {
	c := a.r.comp
	d := len(a.src)
	raw := c.rawMask(d)
	c.pLocal = c.ps.Project(c.pLocal, c.v)
	dense := func(x *[]float32) func(dst []byte, j, lo, hi int) []byte {
		return func(dst []byte, j, lo, hi int) []byte { return compression.FP32{}.Encode(dst, (*x)[lo:hi]) }
	}
	c.pSum = grow(c.pSum, len(c.pLocal))
	if !a.runPass(&cpass{pass: 0, d: len(c.pLocal), out: c.pSum, encode: dense(&c.pLocal)}) {
		return
	}
	c.qLocal = c.ps.Backproject(c.qLocal, c.v, c.pSum) // pSum → P̂ in place, alike on every peer
	c.qSum = grow(c.qSum, len(c.qLocal))
	if !a.runPass(&cpass{pass: 1, d: len(c.qLocal), out: c.qSum, encode: dense(&c.qLocal)}) {
		return
	}
	c.ps.Reconstruct(a.dst, c.pSum, c.qSum)
	if rule.FirstNonFinite(a.dst) >= 0 {
		a.setFault(faultOverflow)
		return
	}
	if c.ef {
		c.ps.Reconstruct(c.pending, c.pSum, c.qLocal)
		for i := range c.pending {
			if raw[i] {
				c.pending[i] = 0
			} else {
				c.pending[i] = c.v[i] - c.pending[i]
			}
		}
	}
	a.finishMean(a.dst)
}

// finishMean divides a sum by the total weight for Mean.
func (a *attempt) finishMean(x []float32) {
	if _, mean := a.r.cfg.Rule.(rule.Mean); !mean || a.bad.Load() {
		return
	}
	for i, v := range x {
		x[i] = float32(float64(v) / a.total)
	}
}

func grow(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}

// runPass runs one pass with the attempt's algorithm and reports whether it
// completed.
func (a *attempt) runPass(p *cpass) bool {
	if a.bad.Load() {
		return false
	}
	if a.algo == Tree {
		a.cTree(p)
	} else {
		a.cButterfly(p)
	}
	return !a.bad.Load() && a.lanes.Load() == 0
}

// sendMsg sends a header and the packed bytes w (of nbytes) to rank j.
func (a *attempt) sendMsg(j int, s Step, p *cpass, weight float64, w []float32, nbytes int, mult int) bool {
	var hw [cheaderLen]float32
	cheader{cfg: a.cfg, d: uint64(p.d), weight: weight, nbytes: uint64(nbytes)}.encode(hw[:])
	if !a.send(j, s, p.chunk(0), hw[:], mult) {
		return false
	}
	C := a.r.cfg.ChunkElems
	for k := range numChunks(len(w), C) {
		lo, hi := chunkRange(0, len(w), C, k)
		if !a.send(j, s, p.chunk(uint32(k+1)), w[lo:hi], mult) {
			return false
		}
	}
	return true
}

// recvMsg receives a message from rank j for a part of size values: its
// header, then its bytes into *wb and *bb (grown as needed, at most the
// longest encoding of size values). It returns the header and the bytes.
func (a *attempt) recvMsg(j int, s Step, p *cpass, size int, wb *[]float32, bb *[]byte, mult int, k kind) (cheader, []byte, bool) {
	var hw [cheaderLen]float32
	if !a.recv(j, s, p.chunk(0), hw[:], mult, k) {
		return cheader{}, nil, false
	}
	h, err := decodeCHeader(hw[:])
	switch {
	case err != nil:
		a.accuse(j, kindBadValue)
		return h, nil, false
	case h.cfg != a.cfg:
		a.accuse(j, kindConfig)
		return h, nil, false
	case h.d != uint64(p.d):
		a.accuse(j, kindBadLength)
		return h, nil, false
	case h.nbytes == 0 || h.nbytes > uint64(maxEncoded(size)):
		a.accuse(j, kindBadValue)
		return h, nil, false
	}
	nw := int(h.nbytes+3) / 4
	*wb = grow(*wb, nw)
	w := *wb
	C := a.r.cfg.ChunkElems
	chunk := func(i int) []float32 { lo, hi := chunkRange(0, nw, C, i); return w[lo:hi] }
	if !a.recvLane(j, s, p.chunk(1), numChunks(nw, C), chunk, mult, k, false, nil) {
		return h, nil, false
	}
	*bb = unpackWords(*bb, w, int(h.nbytes))
	return h, *bb, true
}

// add decodes one contribution to a hop's sum, blaming rank j (its sender)
// for bytes that do not decode or decode to NaN/±Inf.
func (a *attempt) add(j int, b []byte, size int) bool {
	c := a.r.comp
	c.scratch = grow(c.scratch, size)
	if err := c.dec.Decode(c.scratch, b); err != nil {
		a.accuse(j, kindBadValue)
		return false
	}
	if rule.FirstNonFinite(c.scratch) >= 0 {
		a.accuse(j, kindBadValue)
		return false
	}
	var err error
	if id, _ := compression.PeekID(b); compression.IsSparse(id) {
		err = c.comb.Add(b)
	} else {
		err = c.comb.AddVector(c.scratch)
	}
	if err != nil {
		a.accuse(j, kindBadValue)
		return false
	}
	return true
}

// decodeInto decodes a hop's result from rank j (the owner or parent; j =
// a.rank for our own) into out, blaming j for bad bytes or values.
func (a *attempt) decodeInto(j int, dec *compression.Decoder, out []float32, b []byte) bool {
	if err := dec.Decode(out, b); err != nil || rule.FirstNonFinite(out) >= 0 {
		if j == a.rank {
			a.setFault(faultOverflow)
		} else {
			a.accuse(j, kindBadValue)
		}
		return false
	}
	return true
}

// cButterfly is the butterfly for one compressed pass: every peer sends its
// encoded part of shard j to j's owner, the owner decodes and sums the n
// parts and sends the encoded sum to every peer, and every peer decodes the
// owners' bytes into the pass's output.
func (a *attempt) cButterfly(p *cpass) {
	c := a.r.comp
	n, me := a.n, a.rank
	for j := range n {
		off, size := shardRange(p.d, n, j)
		c.enc[j] = p.encode(c.enc[j], j, off, off+size)
		if j != me {
			c.encW[j] = packWords(c.encW[j], c.enc[j])
		}
	}
	ownOff, ownSize := shardRange(p.d, n, me)
	weights := make([]float64, n)
	weights[me] = a.weight
	arrived := make(chan struct{}, n)
	ready := make(chan struct{})

	var wg sync.WaitGroup
	a.lanes.Store(int64(4*(n-1) + 1))
	for j := range n {
		if j == me {
			continue
		}
		wg.Go(func() { // scatterTo
			if a.sendMsg(j, StepScatter, p, a.weight, c.encW[j], len(c.enc[j]), 1) {
				a.laneDone()
			}
		})
		wg.Go(func() { // scatterFrom
			h, b, ok := a.recvMsg(j, StepScatter, p, ownSize, &c.inW[j], &c.inB[j], 1, kindStall)
			if !ok {
				return
			}
			c.inB[j] = b
			weights[j] = h.weight
			arrived <- struct{}{}
			a.laneDone()
		})
		wg.Go(func() { // gatherTo
			if !a.wait(ready) {
				return
			}
			if a.sendMsg(j, StepGather, p, a.total, c.outW, len(c.out), 2) {
				a.laneDone()
			}
		})
		wg.Go(func() { // gatherFrom
			off, size := shardRange(p.d, n, j)
			_, b, ok := a.recvMsg(j, StepGather, p, size, &c.gW[j], &c.gB[j], 2, kindTimeout)
			if ok && a.decodeInto(j, &c.decs[j], p.out[off:off+size], b) {
				a.laneDone()
			}
		})
	}
	wg.Go(func() { // reduce our shard
		for range n - 1 {
			if !a.wait(arrived) {
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
		c.comb.Reset(ownSize)
		for j := range n {
			b := c.enc[me]
			if j != me {
				b = c.inB[j]
			}
			if !a.add(j, b, ownSize) {
				return
			}
		}
		c.out = c.comb.Encode(c.out)
		if !a.decodeInto(me, &c.decs[me], p.out[ownOff:ownOff+ownSize], c.out) {
			return
		}
		c.outW = packWords(c.outW, c.out)
		close(ready)
		a.laneDone()
	})
	wg.Wait()
}

// cTree is the tree for one compressed pass: each node sums its own
// encoded contribution and its children's encoded partial sums and sends the
// encoded sum up; the root's encoded sum flows down unchanged and every node
// decodes it.
func (a *attempt) cTree(p *cpass) {
	c := a.r.comp
	n, me := a.n, a.rank
	var kids []int
	for _, k := range []int{2*me + 1, 2*me + 2} {
		if k < n {
			kids = append(kids, k)
		}
	}
	c.enc[me] = p.encode(c.enc[me], 0, 0, p.d)
	kidW := make([]float64, len(kids))
	arrived := make(chan struct{}, len(kids))
	ready := make(chan struct{}) // closed once the result's bytes are in c.outW

	var wg sync.WaitGroup
	lanes := 2*len(kids) + 1
	if me > 0 {
		lanes++
		wg.Go(func() { // downFrom
			parent := (me - 1) / 2
			h, b, ok := a.recvMsg(parent, StepDown, p, p.d, &c.fwdW, &c.fwdB, a.downMult(me), kindTimeout)
			if !ok {
				return
			}
			a.total = h.weight
			if !a.decodeInto(parent, &c.decs[me], p.out, b) {
				return
			}
			c.out, c.outW = b, c.fwdW[:(len(b)+3)/4] // forward the parent's bytes
			close(ready)
			a.laneDone()
		})
	}
	a.lanes.Store(int64(lanes))
	for i, k := range kids {
		wg.Go(func() { // upFrom
			h := treeHeight(k, n)
			mult, why := 1+h, kindTimeout
			if h == 0 {
				why = kindStall
			}
			hd, b, ok := a.recvMsg(k, StepUp, p, p.d, &c.inW[k], &c.inB[k], mult, why)
			if !ok {
				return
			}
			c.inB[k] = b
			kidW[i] = hd.weight
			arrived <- struct{}{}
			a.laneDone()
		})
		wg.Go(func() { // downTo
			if !a.wait(ready) {
				return
			}
			if a.sendMsg(k, StepDown, p, a.total, c.outW, len(c.out), a.maxMult()) {
				a.laneDone()
			}
		})
	}
	wg.Go(func() { // combine
		for range kids {
			if !a.wait(arrived) {
				return
			}
		}
		sub := a.weight
		for _, w := range kidW {
			sub += w
		}
		c.comb.Reset(p.d)
		if !a.add(me, c.enc[me], p.d) {
			return
		}
		for _, k := range kids {
			if !a.add(k, c.inB[k], p.d) {
				return
			}
		}
		if me != 0 {
			c.enc[me] = c.comb.Encode(c.enc[me])
			c.encW[me] = packWords(c.encW[me], c.enc[me])
			if a.sendMsg((me-1)/2, StepUp, p, sub, c.encW[me], len(c.enc[me]), a.maxMult()) {
				a.laneDone()
			}
			return
		}
		a.total = sub
		if _, mean := a.r.cfg.Rule.(rule.Mean); mean && !(sub > 0 && isFinite(sub)) {
			a.setFault(faultZeroWeight)
			return
		}
		c.out = c.comb.Encode(c.out)
		if !a.decodeInto(me, &c.decs[me], p.out, c.out) {
			return
		}
		c.outW = packWords(c.outW, c.out)
		close(ready)
		a.laneDone()
	})
	wg.Wait()
}
