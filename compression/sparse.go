package compression

import "math"

// Sparse sends every nonzero value of a vector and its index, in top-k's
// layout, and nothing else: it is lossless, and as small as top-k for a
// vector that is already sparse. It is the transport of optimisers that
// choose their own coefficients (DeMo picks the largest DCT coefficients
// of each block of its momentum), where top-k, which chooses by itself
// per shard of the all-reduce, would drop some of them or send zeros.
// Negative zero counts as zero. Any TopK decodes its bytes and the other
// way round (the layout is one; only the id byte differs).
type Sparse struct{}

var _ Codec = Sparse{}

// ID implements Codec.
func (Sparse) ID() ID { return IDSparse }

// Name implements Codec.
func (Sparse) Name() string { return "sparse" }

// Encode implements Codec.
func (Sparse) Encode(dst []byte, src []float32) []byte {
	k := 0
	for _, v := range src {
		if math.Float32bits(v)&0x7fffffff != 0 {
			k++
		}
	}
	// Every nonzero magnitude is at least 1 in its bits: thr 1, no ties.
	out := emitSparse(dst, src, nil, k, 1, 0, nil)
	out[0] = byte(IDSparse)
	return out
}

// Decode implements Codec.
func (Sparse) Decode(dst []float32, src []byte) error { return decodeSparse(dst, src, false) }

func (Sparse) decodeAdd(acc []float32, src []byte) error { return decodeSparse(acc, src, true) }
