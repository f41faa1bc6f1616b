package compression

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
)

// DefaultFrac is the fraction of values top-k and random-k keep when Frac is 0.
const DefaultFrac = 0.01

// kFor returns how many of n values a sparsifier keeping frac sends:
// round(frac·n), at least 1 when n > 0, at most n.
func kFor(n int, frac float64) int {
	if frac <= 0 {
		frac = DefaultFrac
	}
	k := int(frac*float64(n) + 0.5)
	return max(min(k, n), min(n, 1))
}

// formatFrac prints a fraction with as few digits as round-trip exactly.
func formatFrac(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// TopK keeps the k = round(Frac·n) values of largest magnitude and drops the
// rest. Ties at the threshold go to the lowest indices, so the selection is
// deterministic. NaN counts as larger than every number.
//
// Selection is a radix select on the magnitude bits: one histogram pass over
// the top 11 bits finds the bucket of the k-th largest, a second pass collects
// the indices at or above that bucket (usually a few k), and two small
// histogram passes over those (the next 11 and the last 9 bits) give the
// exact threshold; the chosen values are then emitted in index order. O(n)
// time, two passes over the input, no sort and no copy of it; scratch is
// 32 KiB plus 4 bytes per candidate (at most max(4k, 65536), else two more
// full passes replace the candidate list).
//
// Wire: header, uvarint k, k float32 values, then k uvarint index gaps (the
// first index, then idx[j]-idx[j-1]-1), indices strictly increasing. The same
// layout carries any sparse vector (MergeSparse writes it with k up to n), and
// any TopK decodes it whatever its own Frac.
//
// Encode uses scratch held in the TopK, so a TopK must not encode from two
// goroutines at once; Decode is safe for concurrent use.
type TopK struct {
	// Frac is the fraction of values kept, in (0, 1]; 0 means DefaultFrac.
	Frac float64

	hist [4][1 << 11]uint32
	cand []uint32 // indices of the selection's candidates
}

var _ Codec = (*TopK)(nil)

// ID implements Codec.
func (*TopK) ID() ID { return IDTopK }

// Name implements Codec.
func (c *TopK) Name() string { return nameOf(c) }

func (c *TopK) spec() string { return "topk:" + formatFrac(c.frac()) }

func (c *TopK) frac() float64 {
	if c.Frac <= 0 {
		return DefaultFrac
	}
	return c.Frac
}

// K returns the number of values TopK keeps of a vector of n.
func (c *TopK) K(n int) int { return kFor(n, c.frac()) }

// Encode implements Codec.
func (c *TopK) Encode(dst []byte, src []float32) []byte {
	out, _ := c.encode(dst, src, nil)
	return out
}

// encode writes the top-k encoding of src. With residual non-nil (the same
// slice as src, for error feedback) the sent values are zeroed in it.
func (c *TopK) encode(dst []byte, src []float32, residual []float32) ([]byte, int) {
	n := len(src)
	k := c.K(n)
	if k == 0 {
		return emitSparse(dst, src, nil, 0, math.MaxUint32, 0, residual), 0
	}
	b1, above := c.level1(src, k)
	// Usually few values lie in or above the threshold's level-1 bucket
	// (1/8 of an octave wide): collect their indices in one pass, then
	// finish the selection and the output on them alone. A heavily tied or
	// degenerate vector falls back to two more passes over everything.
	if cand := above + int(c.hist[0][b1]); cand <= max(4*k, 1<<16) {
		c.cand = collect(c.cand[:0], src, b1)
		thr, eq := c.refine(src, c.cand, b1, k-above)
		return emitSparse(dst, src, c.cand, k, thr, eq, residual), k
	}
	thr, eq := c.refine(src, nil, b1, k-above)
	return emitSparse(dst, src, nil, k, thr, eq, residual), k
}

// collect appends the indices of the values whose magnitude's top 11 bits
// are at least b1.
func collect(idx []uint32, x []float32, b1 uint32) []uint32 {
	lo := b1 << 20
	for i, v := range x {
		if math.Float32bits(v)&0x7fffffff >= lo {
			idx = append(idx, uint32(i))
		}
	}
	return idx
}

// emitSparse writes the sparse encoding of the k values of src (or of
// src[idx[…]] when idx is not nil) whose magnitude bits exceed thr, plus the
// first eq whose magnitude bits equal thr.
func emitSparse(dst []byte, src []float32, idx []uint32, k int, thr uint32, eq int, residual []float32) []byte {
	n := len(src)
	h := headerLen(n) + uvarintLen(uint64(k))
	voff := h
	ioff := voff + 4*k
	out := resize(dst, ioff+k*uvarintLen(uint64(n)))
	off := putHeader(out, IDTopK, n)
	putUvarint(out[off:], uint64(k))
	e := sparseEmitter{out: out, vals: out[voff:ioff], pos: ioff, k: k, residual: residual}
	if idx != nil {
		for _, i := range idx {
			v := src[i]
			m := math.Float32bits(v) & 0x7fffffff
			if m < thr || (m == thr && eq == 0) {
				continue
			}
			if m == thr {
				eq--
			}
			if !e.emit(int(i), v) {
				break
			}
		}
		return out[:e.pos]
	}
	for i, v := range src {
		m := math.Float32bits(v) & 0x7fffffff
		if m < thr || (m == thr && eq == 0) {
			continue
		}
		if m == thr {
			eq--
		}
		if !e.emit(i, v) {
			break
		}
	}
	return out[:e.pos]
}

// sparseEmitter writes values and index gaps of a sparse encoding.
type sparseEmitter struct {
	out, vals []byte
	pos, j, k int
	next      int // the index after the last one emitted
	residual  []float32
}

// emit writes (i, v), i greater than every index before; it reports whether
// there is room for more.
func (e *sparseEmitter) emit(i int, v float32) bool {
	putFloat(e.vals, e.j, v)
	gap := uint64(i - e.next)
	if gap < 0x80 {
		e.out[e.pos] = byte(gap)
		e.pos++
	} else {
		e.pos += binary.PutUvarint(e.out[e.pos:], gap)
	}
	e.next = i + 1
	e.j++
	if e.residual != nil {
		e.residual[i] = 0
	}
	return e.j < e.k
}

// level1 counts the top 11 bits of every magnitude (8 exponent bits and 3
// mantissa bits) into c.hist[0] and returns the bucket holding the k-th
// largest and how many values lie above that bucket. Four interleaved
// histograms keep runs of equal buckets from serialising on one counter.
func (c *TopK) level1(x []float32, k int) (b1 uint32, above int) {
	h := &c.hist
	clear(h[0][:])
	clear(h[1][:])
	clear(h[2][:])
	clear(h[3][:])
	i := 0
	for ; i+4 <= len(x); i += 4 {
		v := x[i : i+4 : i+4]
		h[0][(math.Float32bits(v[0])>>20)&0x7ff]++
		h[1][(math.Float32bits(v[1])>>20)&0x7ff]++
		h[2][(math.Float32bits(v[2])>>20)&0x7ff]++
		h[3][(math.Float32bits(v[3])>>20)&0x7ff]++
	}
	for ; i < len(x); i++ {
		h[0][(math.Float32bits(x[i])>>20)&0x7ff]++
	}
	for b := range h[0] {
		h[0][b] += h[1][b] + h[2][b] + h[3][b]
	}
	return pick(h[0][:], k)
}

// refine finds, among the values in level-1 bucket b1 (those of x, or of
// x[idx[…]] when idx is not nil), the need-th largest magnitude: the middle
// 11 and the low 9 bits in two histogram passes. It returns the magnitude
// bits thr of the k-th largest overall and how many values equal to thr
// belong to the top k.
func (c *TopK) refine(x []float32, idx []uint32, b1 uint32, need int) (thr uint32, eq int) {
	h := &c.hist[1]
	clear(h[:])
	if idx != nil {
		for _, i := range idx {
			if m := math.Float32bits(x[i]) & 0x7fffffff; m>>20 == b1 {
				h[(m>>9)&0x7ff]++
			}
		}
	} else {
		for _, v := range x {
			if m := math.Float32bits(v) & 0x7fffffff; m>>20 == b1 {
				h[(m>>9)&0x7ff]++
			}
		}
	}
	b2, above2 := pick(h[:], need)
	need -= above2

	clear(h[:512])
	pre := b1<<11 | b2
	if idx != nil {
		for _, i := range idx {
			if m := math.Float32bits(x[i]) & 0x7fffffff; m>>9 == pre {
				h[m&0x1ff]++
			}
		}
	} else {
		for _, v := range x {
			if m := math.Float32bits(v) & 0x7fffffff; m>>9 == pre {
				h[m&0x1ff]++
			}
		}
	}
	b3, above3 := pick(h[:512], need)
	return pre<<9 | b3, need - above3
}

// threshold returns the magnitude bits thr of the k-th largest magnitude in x
// and how many values with exactly that magnitude belong to the top k, by the
// full-scan path (used by tests as the reference for the candidate path).
func (c *TopK) threshold(x []float32, k int) (thr uint32, eq int) {
	if k == 0 {
		return math.MaxUint32, 0
	}
	b1, above := c.level1(x, k)
	return c.refine(x, nil, b1, k-above)
}

// pick walks the histogram from the top bucket down and returns the bucket
// holding the need-th largest value and how many values lie above it.
func pick(h []uint32, need int) (bucket uint32, above int) {
	for b := len(h) - 1; b >= 0; b-- {
		c := int(h[b])
		if above+c >= need {
			return uint32(b), above
		}
		above += c
	}
	return 0, above // unreachable when need ≤ the histogram's total
}

// Decode implements Codec.
func (*TopK) Decode(dst []float32, src []byte) error { return decodeSparse(dst, src, false) }

func (*TopK) decodeAdd(acc []float32, src []byte) error { return decodeSparse(acc, src, true) }

// decodeSparse decodes the sparse (top-k or random-k layout) vector in src
// into dst, or adds it to dst. On error dst may be partly updated.
func decodeSparse(dst []float32, src []byte, add bool) error {
	var it sparseIter
	if err := it.init(src, len(dst)); err != nil {
		return err
	}
	if !add {
		clear(dst)
	}
	for {
		i, v, ok := it.next()
		if !ok {
			break
		}
		if add {
			dst[i] += v
		} else {
			dst[i] = v
		}
	}
	return it.err
}

// sparseIter walks a sparse vector in the top-k or random-k layout in index
// order.
type sparseIter struct {
	n, k, j int
	vals    []byte
	err     error

	// top-k layout
	idx     []byte
	nextIdx int

	// random-k layout
	rk randkStrata
}

// init parses the header of a top-k or random-k encoding of a vector of n
// values.
func (it *sparseIter) init(src []byte, n int) error {
	*it = sparseIter{n: n}
	if len(src) == 0 {
		return fmt.Errorf("%w: empty", ErrCorrupt)
	}
	id := ID(src[0])
	if id != IDTopK && id != IDRandK && id != IDSparse {
		return fmt.Errorf("%w: id %d is not sparse", ErrCorrupt, id)
	}
	r, err := readHeader(src, id, n)
	if err != nil {
		return err
	}
	k := r.uvarint()
	if r.err == nil && k > uint64(n) {
		r.fail("k=%d > n=%d", k, n)
	}
	var seed uint64
	if id == IDRandK {
		seed = r.u64()
	}
	it.vals = r.bytes(4 * k)
	if r.err != nil {
		return r.err
	}
	it.k = int(k)
	if id == IDRandK {
		if err := r.end(); err != nil {
			return err
		}
		it.rk = newRandkStrata(n, it.k, seed)
		return nil
	}
	it.idx = r.b
	// Each gap takes at least one byte.
	if len(it.idx) < it.k {
		return fmt.Errorf("%w: %d index bytes for %d indices", ErrCorrupt, len(it.idx), it.k)
	}
	return nil
}

// next returns the next (index, value); ok is false at the end or on error
// (it.err set).
func (it *sparseIter) next() (i int, v float32, ok bool) {
	if it.j == it.k {
		if it.idx != nil && len(it.idx) != 0 && it.err == nil {
			it.err = fmt.Errorf("%w: %d trailing bytes", ErrCorrupt, len(it.idx))
		}
		return 0, 0, false
	}
	if it.rk.k != 0 {
		i = it.rk.index(it.j)
	} else {
		var gap uint64
		if b := it.idx[0]; b < 0x80 {
			gap = uint64(b)
			it.idx = it.idx[1:]
		} else {
			var w int
			gap, w = binary.Uvarint(it.idx)
			if w <= 0 || it.idx[w-1] == 0 { // error or overlong
				it.err = fmt.Errorf("%w: bad index varint", ErrCorrupt)
				return 0, 0, false
			}
			it.idx = it.idx[w:]
		}
		if gap >= uint64(it.n-it.nextIdx) {
			it.err = fmt.Errorf("%w: index past the end", ErrCorrupt)
			return 0, 0, false
		}
		i = it.nextIdx + int(gap)
		it.nextIdx = i + 1
		if len(it.idx) < it.k-it.j-1 {
			it.err = fmt.Errorf("%w: truncated indices", ErrCorrupt)
			return 0, 0, false
		}
	}
	v = getFloat(it.vals, it.j)
	it.j++
	return i, v, true
}
