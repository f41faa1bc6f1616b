package compression

import (
	"fmt"
)

// adder is implemented by every codec of this package: decodeAdd adds the
// decoded vector to acc without a scratch vector (O(k) for sparse codecs).
type adder interface {
	decodeAdd(acc []float32, src []byte) error
}

// PeekID returns the codec id that starts src, the IDEntropy flag included.
func PeekID(src []byte) (ID, error) {
	if len(src) == 0 {
		return 0, fmt.Errorf("%w: empty", ErrCorrupt)
	}
	id := ID(src[0])
	if !Known(id) {
		return 0, fmt.Errorf("%w: %d", ErrUnknownCodec, id)
	}
	return id, nil
}

// Decoder decodes the bytes of any codec of this package, reading the codec
// from the id that starts them, and sums them: the receiving side of a hop.
// The zero value is ready to use. A Decoder holds scratch for entropy-wrapped
// bytes and is not safe for concurrent use.
type Decoder struct {
	ent Entropy
}

// unwrap returns the plain encoding in src and its id.
func (d *Decoder) unwrap(src []byte, n int) (ID, []byte, error) {
	id, err := PeekID(src)
	if err != nil {
		return 0, nil, err
	}
	if id&IDEntropy == 0 {
		return id, src, nil
	}
	id &^= IDEntropy
	p, err := d.ent.unwrap(src, id, n)
	return id, p, err
}

// Decode fills dst (whose length is the vector length) from src.
func (d *Decoder) Decode(dst []float32, src []byte) error {
	id, p, err := d.unwrap(src, len(dst))
	if err != nil {
		return err
	}
	return decoders[id].Decode(dst, p)
}

// DecodeAdd adds the vector encoded in src to acc (whose length is the vector
// length). On error acc may be partly updated.
func (d *Decoder) DecodeAdd(acc []float32, src []byte) error {
	id, p, err := d.unwrap(src, len(acc))
	if err != nil {
		return err
	}
	return decoders[id].(adder).decodeAdd(acc, p)
}

// IsSparse reports whether id's encodings are sparse vectors (top-k or
// random-k layout) that MergeSparse sums without densifying.
func IsSparse(id ID) bool {
	d := desc(id)
	return d != nil && d.Sparse
}

// MergeSparse writes into dst (as Encode does) an encoding of a + b, where a
// and b are top-k or random-k encodings (not entropy-wrapped) of vectors of
// n values. The sum is exact: each output value is va+vb, va or vb.
//
// The result is in the top-k layout holding the union of the indices, except
// that two random-k encodings with the same seed and k (peers that drew the
// same indices) sum in the random-k layout, and that a union whose sparse
// encoding would not be smaller than dense float32 is written densified as
// an FP32 encoding. Use Decoder (or Combiner) on the result. dst must not
// overlap a or b.
func MergeSparse(dst []byte, a, b []byte, n int) ([]byte, error) {
	var ia, ib sparseIter
	if err := ia.init(a, n); err != nil {
		return nil, fmt.Errorf("merge: first operand: %w", err)
	}
	if err := ib.init(b, n); err != nil {
		return nil, fmt.Errorf("merge: second operand: %w", err)
	}
	if ia.rk.k != 0 && ib.rk.k != 0 && ia.rk.seed == ib.rk.seed && ia.k == ib.k {
		out := resize(dst, len(a))
		copy(out, a[:len(a)-len(ia.vals)])
		vals := out[len(a)-len(ia.vals):]
		for j := 0; j < ia.k; j++ {
			putFloat(vals, j, getFloat(ia.vals, j)+getFloat(ib.vals, j))
		}
		return out, nil
	}

	// Pass 1: size the union.
	u, idxBytes := 0, 0
	next := 0
	err := mergeWalk(&ia, &ib, func(i int, _ float32) {
		idxBytes += uvarintLen(uint64(i - next))
		next = i + 1
		u++
	})
	if err != nil {
		return nil, err
	}
	sparseLen := headerLen(n) + uvarintLen(uint64(u)) + 4*u + idxBytes
	if denseLen := headerLen(n) + 4*n; sparseLen >= denseLen {
		out := resize(dst, denseLen)
		off := putHeader(out, IDFP32, n)
		vals := out[off:]
		clear(vals)
		ia.init(a, n)
		ib.init(b, n)
		err := mergeWalk(&ia, &ib, func(i int, v float32) { putFloat(vals, i, v) })
		return out, err
	}

	// Pass 2: write it.
	out := resize(dst, sparseLen)
	off := putHeader(out, IDTopK, n)
	off += putUvarint(out[off:], uint64(u))
	vals := out[off : off+4*u]
	pos := off + 4*u
	j, next := 0, 0
	ia.init(a, n)
	ib.init(b, n)
	err = mergeWalk(&ia, &ib, func(i int, v float32) {
		putFloat(vals, j, v)
		pos += putUvarint(out[pos:], uint64(i-next))
		next = i + 1
		j++
	})
	return out, err
}

// mergeWalk calls f for every index of the union of a and b in order, with
// the sum of their values there.
func mergeWalk(a, b *sparseIter, f func(i int, v float32)) error {
	i, va, oka := a.next()
	j, vb, okb := b.next()
	for oka || okb {
		switch {
		case oka && (!okb || i < j):
			f(i, va)
			i, va, oka = a.next()
		case okb && (!oka || j < i):
			f(j, vb)
			j, vb, okb = b.next()
		default:
			f(i, va+vb)
			i, va, oka = a.next()
			j, vb, okb = b.next()
		}
	}
	if a.err != nil {
		return fmt.Errorf("merge: first operand: %w", a.err)
	}
	if b.err != nil {
		return fmt.Errorf("merge: second operand: %w", b.err)
	}
	return nil
}

// HopCodec returns the codec with which a hop of an all-reduce re-encodes a
// partial sum of vectors that leaf encoded: Desc.Hop of leaf's codec (the
// dense codecs and the 4-bit ones themselves, Sign Int8, the others FP32). Error feedback is
// not carried over (a hop has no residual of its own); the entropy stage is.
func HopCodec(leaf Codec) Codec {
	var mode EntropyMode
	if e, ok := leaf.(*Entropy); ok {
		leaf, mode = e.inner, e.mode
	}
	if e, ok := leaf.(*ErrorFeedback); ok {
		leaf = e.inner
	}
	hop := leaf
	if d := desc(leaf.ID()); d != nil && d.Hop != d.ID {
		hop = decoders[d.Hop]
	}
	if mode != EntropyStored {
		hop, _ = NewEntropy(hop, mode)
	}
	return hop
}

// Combiner sums the encoded contributions that meet at one hop of a tree or
// butterfly all-reduce and re-encodes the partial sum for the next hop:
//
//	cb := compression.NewCombiner(leaf)  // leaf: the codec peers encode with
//	cb.Reset(n)
//	cb.Add(own)                          // own vector's bytes, or AddVector(x)
//	for _, b := range fromChildren { cb.Add(b) }
//	up := cb.Encode(up)                  // bytes for the parent / the gather
//
// Sparse contributions (top-k, random-k) are merged exactly with MergeSparse
// and forwarded sparse until the union stops paying, then densified; dense
// ones are decoded and summed in float32 and re-encoded with HopCodec(leaf).
// A Combiner is not safe for concurrent use; reuse it across rounds to avoid
// allocating.
type Combiner struct {
	hop   Codec
	dec   Decoder
	n     int
	dense bool      // acc holds the sum
	acc   []float32 // dense partial sum
	sp    []byte    // sparse partial sum (empty: nothing added yet)
	tmp   []byte
	ent   *Entropy // wraps sparse output when leaf was entropy-wrapped
}

// NewCombiner returns a Combiner for contributions encoded with leaf.
func NewCombiner(leaf Codec) *Combiner {
	cb := &Combiner{hop: HopCodec(leaf)}
	if e, ok := leaf.(*Entropy); ok {
		cb.ent, _ = NewEntropy(FP32{}, e.mode)
	}
	return cb
}

// Reset starts a new partial sum of vectors of n values.
func (cb *Combiner) Reset(n int) {
	cb.n, cb.dense, cb.sp = n, false, cb.sp[:0]
}

// Add adds one encoded contribution (any codec of this package).
func (cb *Combiner) Add(src []byte) error {
	id, p, err := cb.dec.unwrap(src, cb.n)
	if err != nil {
		return err
	}
	if !cb.dense && IsSparse(id) {
		if len(cb.sp) == 0 {
			// Validate before adopting it.
			var it sparseIter
			if err := it.init(p, cb.n); err != nil {
				return err
			}
			for {
				if _, _, ok := it.next(); !ok {
					break
				}
			}
			if it.err != nil {
				return it.err
			}
			cb.sp = append(cb.sp[:0], p...)
			return nil
		}
		out, err := MergeSparse(cb.tmp, cb.sp, p, cb.n)
		if err != nil {
			return err
		}
		cb.tmp, cb.sp = cb.sp, out
		if ID(out[0]) == IDFP32 {
			return cb.densify()
		}
		return nil
	}
	if err := cb.densify(); err != nil {
		return err
	}
	return decoders[id].(adder).decodeAdd(cb.acc, p)
}

// AddVector adds a plain vector (of the length given to Reset), e.g. the
// hop's own contribution, which then is not encoded once more.
func (cb *Combiner) AddVector(x []float32) error {
	if len(x) != cb.n {
		return fmt.Errorf("%w: vector of %d, combiner of %d", ErrLength, len(x), cb.n)
	}
	if err := cb.densify(); err != nil {
		return err
	}
	for i, v := range x {
		cb.acc[i] += v
	}
	return nil
}

// densify moves the partial sum into the dense accumulator.
func (cb *Combiner) densify() error {
	if cb.dense {
		return nil
	}
	cb.acc = resizeF(cb.acc, cb.n)
	clear(cb.acc)
	cb.dense = true
	if len(cb.sp) == 0 {
		return nil
	}
	err := decoders[cb.sp[0]].(adder).decodeAdd(cb.acc, cb.sp)
	cb.sp = cb.sp[:0]
	return err
}

// Dense reports whether the partial sum has been densified.
func (cb *Combiner) Dense() bool { return cb.dense }

// Encode writes the partial sum's encoding into dst (as Codec.Encode does):
// the merged sparse bytes while sparse, else HopCodec(leaf) of the sum.
func (cb *Combiner) Encode(dst []byte) []byte {
	if !cb.dense && len(cb.sp) > 0 {
		if cb.ent != nil {
			return cb.ent.wrapID(dst, cb.sp, ID(cb.sp[0]))
		}
		return append(dst[:0], cb.sp...)
	}
	cb.densify()
	return cb.hop.Encode(dst, cb.acc)
}

// Sum writes the partial sum into dst (the vector length), exactly as a
// receiver of Encode's bytes would decode it only when the hop codec is
// exact; use it at the root of a tree for the root's own result.
func (cb *Combiner) Sum(dst []float32) error {
	if len(dst) != cb.n {
		return fmt.Errorf("%w: vector of %d, combiner of %d", ErrLength, len(dst), cb.n)
	}
	if !cb.dense && len(cb.sp) > 0 {
		return cb.dec.Decode(dst, cb.sp)
	}
	if err := cb.densify(); err != nil {
		return err
	}
	copy(dst, cb.acc)
	return nil
}
