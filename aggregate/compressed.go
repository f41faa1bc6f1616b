package aggregate

import (
	"encoding/binary"
	"fmt"
	"math"
	"sync"

	"github.com/starling-ml/starling/aggregate/rule"
	"github.com/starling-ml/starling/compression"
	"github.com/starling-ml/starling/device"
)

// Compressed all-reduce (Config.Compress): the plain butterfly and tree,
// with a codec hook on their messages (see pass). This file holds the hook
// (encode our part, sum the parts at a reducing hop, decode a result) and
// the per-peer state it keeps between rounds (Compression).

// packWords stores b in ⌈len(b)/4⌉ words of dst (grown as needed), four
// bytes a word, little-endian, the last word zero-padded.
func packWords(dst []float32, b []byte) []float32 {
	n := words(len(b))
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

	// per-rank messages, reused across rounds (see butterflyMsgs, treeMsgs)
	parts []msg                 // our encoded part of each shard (tree: parts[me], whole)
	in    []msg                 // a contribution received from each rank
	res   []msg                 // a result received from each rank
	out   msg                   // our hop's sum, encoded
	decs  []compression.Decoder // decodes each rank's result
}

// newCompression builds the state for spec.
func newCompression(spec compression.Spec) (*Compression, error) {
	c0 := spec.New()
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
		var err error
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
	if numChunks(words(compression.MaxEncodedLenAny(d)), C) > maxPassChunks {
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
	for len(c.parts) < n {
		c.parts = append(c.parts, msg{})
		c.in = append(c.in, msg{})
		c.res = append(c.res, msg{})
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

// compressed runs the data phase of a compressed all-reduce: our
// contribution v = w·x + residual (w: our weight for Mean, else 1), encoded
// per part of one pass, or PowerSGD's two dense passes.
func (a *attempt) compressed() {
	c := a.r.comp
	d := len(a.src)
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
	p := a.codedPass(0, d, a.dst, func(dst []byte, j, lo, hi int) []byte {
		if c.rk != nil {
			// Every peer encodes part j of this round with the same step,
			// so their random indices coincide and sums stay sparse.
			c.rk.SetStep(a.g.round<<16 ^ uint64(j))
		}
		v := c.v[lo:hi]
		out := c.leaf.Encode(dst, v)
		if c.ef {
			// The residual e' = v − decode(encode(v)), committed with the
			// round, so that a re-run attempt encodes from the same state.
			e := c.pending[lo:hi]
			if err := c.dec.Decode(e, out); err != nil {
				panic(fmt.Sprintf("aggregate: %s cannot decode its own output: %v", c.spec, err))
			}
			for i := range e {
				e[i] = v[i] - e[i]
			}
		}
		return out
	})
	if !a.runPass(p) {
		return
	}
	a.finishMean(a.dst)
}

// powerSGD runs PowerSGD's two dense float32 passes: P = Σ M_i·Q, then
// Q = Σ M_iᵀ·P̂ (see compression.PowerSGD). The result is P̂·Qᵀ, and every
// peer keeps Q as its next warm start (committed with the round). With
// error feedback, peer i keeps e_i = M_i − P̂·Q_iᵀ on the compressed
// tensors; raw tensors (biases) travel exactly.
func (a *attempt) powerSGD() {
	c := a.r.comp
	d := len(a.src)
	raw := c.rawMask(d)
	c.pLocal = c.ps.Project(c.pLocal, c.v)
	dense := func(x *[]float32) func(dst []byte, j, lo, hi int) []byte {
		return func(dst []byte, j, lo, hi int) []byte { return compression.FP32{}.Encode(dst, (*x)[lo:hi]) }
	}
	c.pSum = grow(c.pSum, len(c.pLocal))
	if !a.runPass(a.codedPass(0, len(c.pLocal), c.pSum, dense(&c.pLocal))) {
		return
	}
	c.qLocal = c.ps.Backproject(c.qLocal, c.v, c.pSum) // pSum → P̂ in place, alike on every peer
	c.qSum = grow(c.qSum, len(c.qLocal))
	if !a.runPass(a.codedPass(1, len(c.qLocal), c.qSum, dense(&c.qLocal))) {
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

// finishMean divides a sum by the total weight for Mean; a quotient that
// overflows is a group fault.
func (a *attempt) finishMean(x []float32) {
	if _, mean := a.r.cfg.Rule.(rule.Mean); !mean || a.bad.Load() {
		return
	}
	if !device.DivFinite(x, a.total) {
		a.setFault(faultOverflow)
	}
}

// encodePart encodes our contribution's values [lo, hi), part j of p, into
// m, and packs it into words when it is to be sent.
func (a *attempt) encodePart(p *pass, m *msg, j, lo, hi int, send bool) {
	m.b = p.encode(m.b, j, lo, hi)
	if send {
		m.w = packWords(m.w, m.b)
	}
}

// sumAtHop is a reducing hop of a compressed pass: it decodes the parts of
// size values that meet there, in[j] from rank j for each j of from (in
// that order), blames the sender of bytes that do not decode or decode to
// NaN/±Inf, sums them with the Combiner (sparse ones merged exactly) and
// encodes the sum into out for the next hop.
func (a *attempt) sumAtHop(size int, from []int, in []*msg, out *msg) bool {
	c := a.r.comp
	c.comb.Reset(size)
	for _, j := range from {
		if !a.add(j, in[j].b, size) {
			return false
		}
	}
	out.b = c.comb.Encode(out.b)
	out.w = packWords(out.w, out.b)
	return true
}

// add adds one contribution to a hop's sum, blaming rank j (its sender)
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
func (a *attempt) decodeInto(j int, out []float32, b []byte) bool {
	if err := a.r.comp.decs[j].Decode(out, b); err != nil || rule.FirstNonFinite(out) >= 0 {
		if j == a.rank {
			a.setFault(faultOverflow)
		} else {
			a.accuse(j, kindBadValue)
		}
		return false
	}
	return true
}
