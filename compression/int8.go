package compression

import (
	"fmt"
	"math"
)

// DefaultInt8Block is the block size Int8 uses when Block is 0: 256 values
// share one float32 scale, 1.6 % overhead over the int8 payload.
const DefaultInt8Block = 256

// maxBlock bounds the block size Parse allows (decoders take any block: a
// block longer than the vector is one block).
const maxBlock = 1 << 24

// Int8 quantises each block of Block consecutive values to int8 with the
// block's absmax as scale: q = round(x·127/absmax), x̂ = q·absmax/127, so the
// absolute error of every value is at most absmax/254 (half a step) plus
// float32 rounding (a relative 2⁻²⁰ of absmax). A block of zeros decodes to
// zeros; a block holding an Inf or NaN decodes to NaNs.
//
// Wire: header, uvarint block, ⌈n/block⌉ float32 scales (absmax/127), then n
// int8 values. A decoder reads the block size from the bytes, so any Int8
// decodes any Int8 encoding. Int8 has no state and is safe for concurrent use.
type Int8 struct {
	// Block is the number of values per scale; 0 means DefaultInt8Block.
	Block int
}

var _ Codec = Int8{}

func (c Int8) block() int {
	if c.Block <= 0 {
		return DefaultInt8Block
	}
	return c.Block
}

// ID implements Codec.
func (Int8) ID() ID { return IDInt8 }

// Name implements Codec.
func (c Int8) Name() string { return nameOf(c) }

func (c Int8) spec() string { return fmt.Sprintf("int8:block=%d", c.block()) }

// Encode implements Codec.
func (c Int8) Encode(dst []byte, src []float32) []byte {
	n, block := len(src), c.block()
	nb := (n + block - 1) / block
	out, scales, q := blockLayout(dst, IDInt8, n, block, n)
	for b := 0; b < nb; b++ {
		lo, hi := b*block, min((b+1)*block, n)
		x := src[lo:hi]
		mx := absmaxBits(x)
		absmax := math.Float32frombits(mx)
		if mx >= 0x7f800000 {
			// Inf or NaN in the block: send a NaN scale and zeros, so the
			// whole block decodes to NaN on every machine.
			putFloat(scales, b, float32(math.NaN()))
			clear(q[lo:hi])
			continue
		}
		var inv float32
		if mx != 0 {
			inv = 127 / absmax
		}
		putFloat(scales, b, scaleFor(absmax, 127))
		if math.IsInf(float64(inv), 0) {
			// absmax below 127/MaxFloat32: the float32 reciprocal
			// overflows, so quantise this (rare) block in float64.
			quantise64(q[lo:hi], x, 127/float64(absmax))
			continue
		}
		quantise(q[lo:hi], x, inv)
	}
	return out
}

// scaleFor returns absmax/top rounded so that top·scale does not exceed
// absmax in float32: a block whose absmax is near MaxFloat32 then decodes
// its largest code to a finite value, not to Inf.
func scaleFor(absmax, top float32) float32 {
	s := absmax / top
	if s*top > absmax {
		s = math.Nextafter32(s, 0)
	}
	return s
}

// The bulk loops; kernels_amd64.go swaps in AVX2 versions.
var (
	absmaxBits = absmaxBitsGo
	quantise   = quantiseGo
	dequantise = dequantiseGo
)

// absmaxBitsGo returns the largest magnitude bit pattern (sign cleared) in
// x: the bits of max |x|, with NaN above Inf.
func absmaxBitsGo(x []float32) uint32 {
	var mx uint32
	for _, v := range x {
		m := math.Float32bits(v) & 0x7fffffff
		if m > mx {
			mx = m
		}
	}
	return mx
}

// quantiseGo writes round(x·inv) (round half to even) for |x·inv| ≤ 127.
func quantiseGo(q []byte, x []float32, inv float32) {
	q = q[:len(x)]
	for i, v := range x {
		// Adding 1.5·2²³ leaves round(v·inv) in the low mantissa bits. The
		// conversion keeps the compiler from fusing this into an FMA, which
		// would round differently from the assembly kernel.
		t := float32(v*inv) + 12582912
		q[i] = byte(int32(math.Float32bits(t)) - 0x4b400000)
	}
}

func quantise64(q []byte, x []float32, inv float64) {
	q = q[:len(x)]
	for i, v := range x {
		q[i] = byte(int8(math.RoundToEven(float64(v) * inv)))
	}
}

// Decode implements Codec.
func (Int8) Decode(dst []float32, src []byte) error {
	block, scales, q, err := int8Payload(dst, src)
	if err != nil {
		return err
	}
	for b := 0; b*block < len(dst); b++ {
		lo, hi := b*block, min((b+1)*block, len(dst))
		dequantise(dst[lo:hi], q[lo:hi], getFloat(scales, b))
	}
	return nil
}

// dequantiseGo writes float32(int8(q))·s.
func dequantiseGo(x []float32, q []byte, s float32) {
	q = q[:len(x)]
	for i := range x {
		x[i] = float32(int8(q[i])) * s
	}
}

func (Int8) decodeAdd(acc []float32, src []byte) error {
	block, scales, q, err := int8Payload(acc, src)
	if err != nil {
		return err
	}
	for b := 0; b*block < len(acc); b++ {
		lo, hi := b*block, min((b+1)*block, len(acc))
		s := getFloat(scales, b)
		x, qb := acc[lo:hi], q[lo:hi]
		qb = qb[:len(x)]
		for i := range x {
			x[i] += float32(float32(int8(qb[i])) * s) // no FMA: bit-exact everywhere
		}
	}
	return nil
}

func int8Payload(dst []float32, src []byte) (block int, scales, q []byte, err error) {
	r, err := readHeader(src, IDInt8, len(dst))
	if err != nil {
		return 0, nil, nil, err
	}
	bl := r.uvarint()
	if r.err == nil && bl == 0 {
		r.fail("int8 block of 0 values")
	}
	// A block longer than the vector is one block (and keeps the
	// arithmetic below from overflowing).
	if n := uint64(len(dst)); bl > n {
		bl = max(n, 1)
	}
	n := uint64(len(dst))
	nb := (n + bl - 1) / max(bl, 1)
	scales = r.bytes(4 * nb)
	q = r.bytes(n)
	if err := r.end(); err != nil {
		return 0, nil, nil, err
	}
	return int(bl), scales, q, nil
}

// blockLayout sizes dst for a blockwise codec's encoding of n values in
// blocks of block — header, block size, a float32 scale per block, then
// codeBytes of codes — writes the header and block size, and returns the
// encoding with its scale and code regions.
func blockLayout(dst []byte, id ID, n, block, codeBytes int) (out, scales, codes []byte) {
	nb := (n + block - 1) / block
	size := headerLen(n) + uvarintLen(uint64(block)) + 4*nb + codeBytes
	out = resize(dst, size)
	off := putHeader(out, id, n)
	off += putUvarint(out[off:], uint64(block))
	return out, out[off : off+4*nb], out[off+4*nb : size]
}
