package aggregate

import "github.com/starling-ml/starling/compression"

// A pass is one all-reduce of a vector over the butterfly or the tree. A
// plain round is one pass of its vector in float32 chunks. A compressed
// round (Config.Compress) is one pass, or PowerSGD's two, whose messages go
// through a codec hook (compressed.go): our contribution is encoded on the
// way out, a reducing hop decodes and sums what meets there and re-encodes
// the sum, and every peer decodes the owner's (root's) bytes on the way
// back. Lanes, watchdogs, blame and votes are the same for both; what
// differs is what a lane's chunks hold (values, or an encoding packed four
// bytes to a word behind a header that gives its length), and that a
// compressed message is reduced or passed on only once it is whole.
type pass struct {
	num   uint32    // pass number: the high bits of a compressed pass's chunk tags
	d     int       // vector length
	src   []float32 // plain: our contribution
	dst   []float32 // the result
	chunk int       // values (plain) or words (compressed) per chunk
	// encode, in a compressed pass, appends to dst the encoding of our
	// contribution's values [lo, hi), part j of the pass; nil in a plain
	// pass.
	encode func(dst []byte, j, lo, hi int) []byte
}

// passShift is where the pass number sits in a compressed chunk index.
const passShift = 24

// maxPassChunks bounds the data chunks of one compressed message.
const maxPassChunks = 1<<passShift - 1

// plainPass is the attempt's vector as one plain pass.
func (a *attempt) plainPass() *pass {
	return &pass{d: len(a.src), src: a.src, dst: a.dst, chunk: a.chunk}
}

// codedPass returns pass num of a compressed round (compressed.go): a
// vector of d values whose result goes to dst, our parts encoded by encode.
func (a *attempt) codedPass(num uint32, d int, dst []float32, encode func(dst []byte, j, lo, hi int) []byte) *pass {
	return &pass{num: num, d: d, dst: dst, chunk: a.r.cfg.ChunkElems, encode: encode}
}

func (p *pass) coded() bool { return p.encode != nil }

// framed reports whether lanes of step s open with a header: all but a
// plain pass's gather, whose receivers know the length and need no weight.
func (p *pass) framed(s Step) bool { return p.coded() || s != StepGather }

func (p *pass) headerLen() int {
	if p.coded() {
		return encHeaderLen
	}
	return headerLen
}

// tag returns the chunk index of data chunk k on a lane of step s; k = -1
// is the header.
func (p *pass) tag(s Step, k int) uint32 {
	if p.framed(s) {
		k++
	}
	return p.num<<passShift | uint32(k)
}

// maxChunks is the most data chunks a message of a part of size values
// may have.
func (p *pass) maxChunks(size int) int {
	if p.coded() {
		return numChunks(words(compression.MaxEncodedLenAny(size)), p.chunk)
	}
	return numChunks(size, p.chunk)
}

// runPass runs one pass with the attempt's algorithm and reports whether it
// completed.
func (a *attempt) runPass(p *pass) bool {
	if a.bad.Load() {
		return false
	}
	if a.algo == Tree {
		a.tree(p)
	} else {
		a.butterfly(p)
	}
	return !a.bad.Load() && a.lanes.Load() == 0
}

// msg is what one lane carries: values in a plain pass; in a compressed
// pass an encoding b, packed four bytes to a word into w.
type msg struct {
	w []float32
	b []byte
}

// sendMsg sends rank j the lane of step s that carries m, after its header
// (with weight) when the lane has one; data chunk k only after a token
// from ready when ready is not nil. Each send gets mult stall timeouts.
func (a *attempt) sendMsg(j int, s Step, p *pass, weight float64, m msg, ready <-chan struct{}, mult int) bool {
	if p.framed(s) {
		var buf [encHeaderLen]float32
		hw := buf[:p.headerLen()]
		header{cfg: a.cfg, d: uint64(p.d), weight: weight, nbytes: uint64(len(m.b))}.encode(hw)
		if !a.send(j, s, p.tag(s, -1), hw, mult) {
			return false
		}
	}
	for k := range numChunks(len(m.w), p.chunk) {
		if ready != nil && !a.wait(ready) {
			return false
		}
		lo, hi := chunkRange(0, len(m.w), p.chunk, k)
		if !a.send(j, s, p.tag(s, k), m.w[lo:hi], mult) {
			return false
		}
	}
	return true
}

// recvMsg receives into m rank j's lane of step s, which carries a part of
// size values: its header when the lane has one (checked; a compressed
// one must announce 1 to MaxEncodedLenAny(size) bytes), then its chunks,
// watched for mult stall timeouts and blaming k. A plain pass's caller
// sizes m.w; a compressed pass sizes m from the header and checks no
// values (the hook decodes them). It calls hdr after the header and
// done(k) after chunk k, in order, or for a compressed message both once
// it is whole; neither may block. It returns false when the data phase is
// over for any reason.
func (a *attempt) recvMsg(j int, s Step, p *pass, size int, m *msg, mult int, k kind, hdr func(header), done func(int)) bool {
	var h header
	if p.framed(s) {
		var ok bool
		if h, ok = a.recvHeader(j, s, p, mult, k); !ok {
			return false
		}
		switch {
		case !p.coded():
			announce(h, 0, hdr, nil)
		case h.nbytes == 0 || h.nbytes > uint64(compression.MaxEncodedLenAny(size)):
			a.accuse(j, kindBadValue)
			return false
		default:
			m.w = grow(m.w, words(int(h.nbytes)))
		}
	}
	count := numChunks(len(m.w), p.chunk)
	chunk := func(i int) []float32 { lo, hi := chunkRange(0, len(m.w), p.chunk, i); return m.w[lo:hi] }
	if !p.coded() {
		return a.recvLane(j, s, p.tag(s, 0), count, chunk, mult, k, every, nil, done)
	}
	if !a.recvLane(j, s, p.tag(s, 0), count, chunk, mult, k, nil, nil, nil) {
		return false
	}
	m.b = unpackWords(m.b, m.w, int(h.nbytes))
	announce(h, count, hdr, done)
	return true
}

// recvResult receives from rank j the lane of step s that carries the
// pass's result for values [off, off+size): in a plain pass straight into
// dst, in a compressed one into m, then decoded into dst, blaming j for
// bytes that do not decode or decode to NaN/±Inf. hdr and done are
// recvMsg's, but for a compressed message called only once it is decoded,
// so that nothing unchecked is passed on.
func (a *attempt) recvResult(j int, s Step, p *pass, off, size int, m *msg, mult int, k kind, hdr func(header), done func(int)) bool {
	out := p.dst[off : off+size]
	if !p.coded() {
		m.w = out
		return a.recvMsg(j, s, p, size, m, mult, k, hdr, done)
	}
	var h header
	if !a.recvMsg(j, s, p, size, m, mult, k, func(x header) { h = x }, nil) || !a.decodeInto(j, out, m.b) {
		return false
	}
	announce(h, numChunks(len(m.w), p.chunk), hdr, done)
	return true
}

// announce calls hdr(h), then done(k) for k < count, each unless nil.
func announce(h header, count int, hdr func(header), done func(int)) {
	if hdr != nil {
		hdr(h)
	}
	for k := range count {
		if done != nil {
			done(k)
		}
	}
}

// waitWhole takes from arrived a token for each chunk of m, whose header
// is in.
func (a *attempt) waitWhole(p *pass, m *msg, arrived <-chan struct{}) bool {
	for range numChunks(len(m.w), p.chunk) {
		if !a.wait(arrived) {
			return false
		}
	}
	return true
}

// signal puts n tokens on each channel of chs but nil ones (buffered, so
// that it never blocks).
func signal(n int, chs ...chan struct{}) {
	for _, ch := range chs {
		if ch == nil {
			continue
		}
		for range n {
			ch <- struct{}{}
		}
	}
}

// words returns how many words hold n bytes.
func words(n int) int { return (n + 3) / 4 }

// grow returns b resized to n values, reusing its array when it can.
func grow(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}
