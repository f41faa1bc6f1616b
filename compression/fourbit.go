package compression

import (
	"fmt"
	"math"
)

// DefaultFourBitBlock is the block size FP4 and Int4 use when Block is 0:
// 64 values share one float32 scale, 4.5 bits a value in all (7.1× fewer
// bytes than fp32).
const DefaultFourBitBlock = 64

// FP4 quantises each block of Block consecutive values to 4-bit floats
// E2M1 (sign, 2 exponent bits, 1 mantissa bit: ±{0, ½, 1, 1½, 2, 3, 4, 6})
// scaled by the block's absmax/6, rounding to nearest (ties away from
// zero). The largest value of a block decodes exactly; every value's error
// is at most absmax/6 (the step between 4 and 6, halved, in units of the
// scale), and at most a quarter of the scale below 2·scale. A block of
// zeros decodes to zeros; a block holding an Inf or NaN decodes to NaNs.
// This is the 4-bit outer-gradient format of Streaming DiLoCo (Douillard
// et al. 2025), with an fp32 scale per block in place of a shared one.
//
// Wire: header, uvarint block, ⌈n/block⌉ float32 scales (absmax/6), then
// ⌈n/2⌉ bytes of codes, value 2i in the low nibble of byte i. Any FP4
// decodes any FP4 encoding. FP4 has no state and is safe for concurrent use.
type FP4 struct {
	// Block is the number of values per scale; 0 means DefaultFourBitBlock.
	Block int
}

// Int4 quantises each block of Block consecutive values to the integers
// −7…7 with the block's absmax as scale: q = round(x·7/absmax) (ties to
// even), x̂ = q·absmax/7, so every value's error is at most absmax/14 plus
// float32 rounding. Zeros and non-finite blocks are as for FP4.
//
// Wire: header, uvarint block, ⌈n/block⌉ float32 scales (absmax/7), then
// ⌈n/2⌉ bytes of two's-complement nibbles, value 2i in the low nibble of
// byte i. Any Int4 decodes any Int4 encoding. Int4 has no state and is safe
// for concurrent use.
type Int4 struct {
	// Block is the number of values per scale; 0 means DefaultFourBitBlock.
	Block int
}

var (
	_ Codec = FP4{}
	_ Codec = Int4{}
)

func fourBitBlock(b int) int {
	if b <= 0 {
		return DefaultFourBitBlock
	}
	return b
}

// ID implements Codec.
func (FP4) ID() ID { return IDFP4 }

// ID implements Codec.
func (Int4) ID() ID { return IDInt4 }

// Name implements Codec.
func (c FP4) Name() string { return nameOf(c) }

// Name implements Codec.
func (c Int4) Name() string { return nameOf(c) }

func (c FP4) spec() string  { return fmt.Sprintf("fp4:block=%d", fourBitBlock(c.Block)) }
func (c Int4) spec() string { return fmt.Sprintf("int4:block=%d", fourBitBlock(c.Block)) }

// fp4Values are the E2M1 magnitudes by code; code|8 is the negative.
var fp4Values = [8]float32{0, 0.5, 1, 1.5, 2, 3, 4, 6}

// fp4Code maps ⌊4·|x|/scale⌋ (0…24, and up to 31 for the rounding of
// the product) to the nearest E2M1 code: the midpoints between the
// magnitudes (¼, ¾, 1¼, 1¾, 2½, 3½, 5) are all multiples of ¼, so the
// floor of 4·|x|/scale decides.
var fp4Code = func() (t [32]byte) {
	mids := [7]int{1, 3, 5, 7, 10, 14, 20} // 4·midpoint
	for k := range t {
		for _, m := range mids {
			if k >= m {
				t[k]++
			}
		}
	}
	return t
}()

// fourBitMax is the largest code magnitude of each codec: the block's
// absmax maps to it.
const (
	fp4Max  = 6
	int4Max = 7
)

// Encode implements Codec.
func (c FP4) Encode(dst []byte, src []float32) []byte {
	return encodeFourBit(dst, src, IDFP4, fourBitBlock(c.Block))
}

// Encode implements Codec.
func (c Int4) Encode(dst []byte, src []float32) []byte {
	return encodeFourBit(dst, src, IDInt4, fourBitBlock(c.Block))
}

func encodeFourBit(dst []byte, src []float32, id ID, block int) []byte {
	n := len(src)
	nb := (n + block - 1) / block
	out, scales, q := blockLayout(dst, id, n, block, (n+1)/2)
	top := float32(int4Max)
	if id == IDFP4 {
		top = fp4Max
	}
	for b := 0; b < nb; b++ {
		lo, hi := b*block, min((b+1)*block, n)
		x := src[lo:hi]
		mx := absmaxBits(x)
		absmax := math.Float32frombits(mx)
		if mx >= 0x7f800000 {
			// Inf or NaN: a NaN scale and zero codes decode to NaNs.
			putFloat(scales, b, float32(math.NaN()))
			packNibbles(q, lo, x, func(float32) byte { return 0 })
			continue
		}
		putFloat(scales, b, scaleFor(absmax, top))
		// inv maps absmax to the top code (FP4: to 4·6, the table's index).
		inv64 := float64(top) / float64(absmax)
		if id == IDFP4 {
			inv64 *= 4
		}
		if mx == 0 {
			inv64 = 0
		}
		inv := float32(inv64)
		if math.IsInf(float64(inv), 0) {
			// absmax so small that the float32 reciprocal overflows:
			// quantise this (rare) block in float64.
			if id == IDFP4 {
				packNibbles(q, lo, x, func(v float32) byte { return fp4Encode64(v, inv64) })
			} else {
				packNibbles(q, lo, x, func(v float32) byte { return byte(int8(math.RoundToEven(float64(v)*inv64))) & 15 })
			}
			continue
		}
		if id == IDFP4 {
			packFP4(q, lo, x, inv)
		} else {
			packInt4(q, lo, x, inv)
		}
	}
	return out
}

// fp4Encode returns the E2M1 code of v·inv/4 (inv is 4/scale, and
// |v|·inv ≤ 24 up to rounding, so the index stays below 32).
func fp4Encode(v, inv float32) byte {
	b := math.Float32bits(v)
	y := math.Float32frombits(b&0x7fffffff) * inv
	return fp4Code[uint32(y)&31] | byte(b>>28)&8
}

func fp4Encode64(v float32, inv float64) byte {
	y := math.Abs(float64(v)) * inv
	k := min(int(y), 24)
	return fp4Code[k] | byte(math.Float32bits(v)>>28)&8
}

// int4Encode returns round(v·inv) (ties to even) as a nibble, for
// |v·inv| ≤ 7: adding 1.5·2²³ leaves the rounded value in the low
// mantissa bits (as Int8's quantise does).
func int4Encode(v, inv float32) byte {
	t := float32(v*inv) + 12582912
	return byte(int32(math.Float32bits(t))-0x4b400000) & 15
}

// packNibbles writes code(x[i]) into the nibble of value lo+i of q. The
// byte of an even value is written whole (its high nibble zero), so blocks
// must be packed in order.
func packNibbles(q []byte, lo int, x []float32, code func(float32) byte) {
	for i, v := range x {
		j := lo + i
		if j&1 == 0 {
			q[j>>1] = code(v)
		} else {
			q[j>>1] |= code(v) << 4
		}
	}
}

// packFP4 and packInt4 are packNibbles with the code inlined, two values a
// byte.
func packFP4(q []byte, lo int, x []float32, inv float32) {
	i := 0
	if lo&1 == 1 && len(x) > 0 {
		q[lo>>1] |= fp4Encode(x[0], inv) << 4
		i = 1
	}
	p := q[(lo+i)>>1:]
	x = x[i:]
	m := len(x) / 2
	packFP4Pairs(p[:m], x[:2*m], inv)
	if len(x)&1 == 1 {
		q[(lo+i+2*m)>>1] = fp4Encode(x[2*m], inv)
	}
}

// packFP4Pairs sets p[j] to the codes of y[2j] and y[2j+1] (len(y) =
// 2·len(p)); an AVX2 kernel where the CPU has one.
var packFP4Pairs = packFP4PairsGo

func packFP4PairsGo(p []byte, y []float32, inv float32) {
	y = y[:2*len(p)]
	for j := range p {
		p[j] = fp4Encode(y[2*j], inv) | fp4Encode(y[2*j+1], inv)<<4
	}
}

func packInt4(q []byte, lo int, x []float32, inv float32) {
	i := 0
	if lo&1 == 1 && len(x) > 0 {
		q[lo>>1] |= int4Encode(x[0], inv) << 4
		i = 1
	}
	p := q[(lo+i)>>1:]
	x = x[i:]
	m := len(x) / 2
	p, y := p[:m], x[:2*m]
	for j := range p {
		p[j] = int4Encode(y[2*j], inv) | int4Encode(y[2*j+1], inv)<<4
	}
	if len(x)&1 == 1 {
		q[(lo+i+2*m)>>1] = int4Encode(x[2*m], inv)
	}
}

// Decode implements Codec.
func (FP4) Decode(dst []float32, src []byte) error { return decodeFourBit(dst, src, IDFP4, false) }

// Decode implements Codec.
func (Int4) Decode(dst []float32, src []byte) error { return decodeFourBit(dst, src, IDInt4, false) }

func (FP4) decodeAdd(acc []float32, src []byte) error { return decodeFourBit(acc, src, IDFP4, true) }

func (Int4) decodeAdd(acc []float32, src []byte) error {
	return decodeFourBit(acc, src, IDInt4, true)
}

// fourBitLUT returns the 16 values the codes of id decode to at scale s.
func fourBitLUT(lut *[16]float32, id ID, s float32) {
	for c := range lut {
		var v float32
		if id == IDFP4 {
			v = fp4Values[c&7]
			if c&8 != 0 {
				v = -v
			}
		} else {
			v = float32(int8(byte(c)<<4) >> 4)
		}
		lut[c] = v * s
	}
}

func decodeFourBit(dst []float32, src []byte, id ID, add bool) error {
	r, err := readHeader(src, id, len(dst))
	if err != nil {
		return err
	}
	bl := r.uvarint()
	if r.err == nil && bl == 0 {
		r.fail("4-bit block of 0 values")
	}
	n := uint64(len(dst))
	if bl > n {
		bl = max(n, 1) // one block (and no overflow below)
	}
	nb := (n + bl - 1) / max(bl, 1)
	scales := r.bytes(4 * nb)
	q := r.bytes((n + 1) / 2)
	if err := r.end(); err != nil {
		return err
	}
	block := int(bl)
	var lut [16]float32
	for b := 0; b*block < len(dst); b++ {
		lo, hi := b*block, min((b+1)*block, len(dst))
		fourBitLUT(&lut, id, getFloat(scales, b))
		x := dst[lo:hi]
		if add {
			for i := range x {
				j := lo + i
				x[i] += lut[q[j>>1]>>(4*(j&1))&15]
			}
			continue
		}
		for i := range x {
			j := lo + i
			x[i] = lut[q[j>>1]>>(4*(j&1))&15]
		}
	}
	return nil
}
