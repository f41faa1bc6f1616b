package compression

import (
	"fmt"
	"math"
)

// DefaultSignBlock is the block size Sign uses when Block is 0.
const DefaultSignBlock = 1024

// Sign sends one bit per value, its sign, and one float32 scale per block of
// Block values: the block's mean magnitude ‖x_b‖₁/|b|. A value decodes to
// ±scale. With one block spanning the whole vector this is the compressor of
// EF-SignSGD (Karimireddy et al., 2019: C(x) = ‖x‖₁/d · sign(x)); per block
// (the default, 1024 values) it tracks the very different magnitudes of the
// layers packed into one flat parameter vector, at 1/32 bit per value.
// Zero encodes as +scale (−0 as −scale). Sign is lossy without a useful
// per-value bound; use it with error feedback.
//
// Wire: header, uvarint block, ⌈n/block⌉ float32 scales, then ⌈n/8⌉ bytes of
// sign bits (bit i%8 of byte i/8 is set when value i is negative). Sign has
// no state and is safe for concurrent use.
type Sign struct {
	// Block is the number of values per scale; 0 means DefaultSignBlock and
	// a negative value means one block for the whole vector.
	Block int
}

var _ Codec = Sign{}

func (c Sign) block(n int) int {
	switch {
	case c.Block == 0:
		return DefaultSignBlock
	case c.Block < 0:
		return max(n, 1)
	}
	return c.Block
}

// ID implements Codec.
func (Sign) ID() ID { return IDSign }

// Name implements Codec.
func (c Sign) Name() string { return nameOf(c) }

func (c Sign) spec() string {
	if c.Block < 0 {
		return "sign:block=all"
	}
	return fmt.Sprintf("sign:block=%d", c.block(0))
}

// Encode implements Codec.
func (c Sign) Encode(dst []byte, src []float32) []byte {
	n, block := len(src), c.block(len(src))
	nb := (n + block - 1) / block
	h := headerLen(n)
	size := h + uvarintLen(uint64(block)) + 4*nb + (n+7)/8
	out := resize(dst, size)
	off := putHeader(out, IDSign, n)
	off += putUvarint(out[off:], uint64(block))
	scales := out[off : off+4*nb]
	for b := 0; b < nb; b++ {
		x := src[b*block : min((b+1)*block, n)]
		var s float64
		for _, v := range x {
			s += math.Abs(float64(v))
		}
		putFloat(scales, b, float32(s/float64(len(x))))
	}
	packSigns(out[off+4*nb:size], src)
	return out
}

// packSigns writes the sign bits of x, eight to a byte.
func packSigns(p []byte, x []float32) {
	p = p[:(len(x)+7)/8]
	i := 0
	for ; i+8 <= len(x); i += 8 {
		v := x[i : i+8 : i+8]
		p[i/8] = byte(math.Float32bits(v[0])>>31) |
			byte(math.Float32bits(v[1])>>31)<<1 |
			byte(math.Float32bits(v[2])>>31)<<2 |
			byte(math.Float32bits(v[3])>>31)<<3 |
			byte(math.Float32bits(v[4])>>31)<<4 |
			byte(math.Float32bits(v[5])>>31)<<5 |
			byte(math.Float32bits(v[6])>>31)<<6 |
			byte(math.Float32bits(v[7])>>31)<<7
	}
	if i < len(x) {
		var b byte
		for j := i; j < len(x); j++ {
			b |= byte(math.Float32bits(x[j])>>31) << (j - i)
		}
		p[i/8] = b
	}
}

// Decode implements Codec.
func (Sign) Decode(dst []float32, src []byte) error {
	return signDecode(dst, src, false)
}

func (Sign) decodeAdd(acc []float32, src []byte) error {
	return signDecode(acc, src, true)
}

func signDecode(dst []float32, src []byte, add bool) error {
	r, err := readHeader(src, IDSign, len(dst))
	if err != nil {
		return err
	}
	bl := r.uvarint()
	if r.err == nil && bl == 0 {
		r.fail("sign block of 0 values")
	}
	// A block longer than the vector is one block (and keeps the
	// arithmetic below from overflowing).
	if n := uint64(len(dst)); bl > n {
		bl = max(n, 1)
	}
	n := uint64(len(dst))
	nb := (n + bl - 1) / max(bl, 1)
	scales := r.bytes(4 * nb)
	bitsb := r.bytes((n + 7) / 8)
	if err := r.end(); err != nil {
		return err
	}
	block := int(bl)
	for b := 0; b*block < len(dst); b++ {
		lo, hi := b*block, min((b+1)*block, len(dst))
		pos := getFloat(scales, b)
		// The sign bit of the decoded float is the wire bit: flip it in.
		pb := math.Float32bits(pos)
		x := dst[lo:hi]
		for j := range x {
			i := lo + j
			s := math.Float32frombits(pb ^ uint32(bitsb[i>>3]>>(i&7)&1)<<31)
			if add {
				x[j] += s
			} else {
				x[j] = s
			}
		}
	}
	return nil
}
