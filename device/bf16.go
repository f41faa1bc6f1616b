package device

import "math"

// bfloat16: float32's sign and exponent with the top 7 mantissa bits, so
// the same range with 8 significant bits (a relative rounding error of at
// most 2⁻⁹ for normal values). These are the one float32 ↔ bfloat16
// conversion of the module: the compression codec and mixed-precision
// training both call them.

// BF16Bits rounds the float32 bit pattern f to bfloat16, to nearest even.
// ±Inf stays ±Inf, a value that rounds past the largest finite bfloat16
// becomes ±Inf (as the hardware conversions do), and a NaN stays a quiet
// NaN with its sign and top payload bits.
func BF16Bits(f uint32) uint16 {
	if f&0x7fffffff > 0x7f800000 {
		return uint16(f>>16) | 0x40
	}
	return uint16((f + 0x7fff + (f>>16)&1) >> 16)
}

// ToBF16 rounds x to bfloat16, to nearest even (see BF16Bits).
func ToBF16(x float32) uint16 { return BF16Bits(math.Float32bits(x)) }

// FromBF16 returns the bfloat16 h as a float32, exactly.
func FromBF16(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// EncodeBF16 rounds src into dst (len(dst) ≥ len(src)).
func EncodeBF16(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	n := 0
	if len(src) >= 16 {
		n = encodeBF16Vec(dst, src)
	}
	for i := n; i < len(src); i++ {
		dst[i] = ToBF16(src[i])
	}
}

// DecodeBF16 widens src into dst (len(dst) ≥ len(src)), exactly.
func DecodeBF16(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	n := 0
	if len(src) >= 16 {
		n = decodeBF16Vec(dst, src)
	}
	for i := n; i < len(src); i++ {
		dst[i] = FromBF16(src[i])
	}
}

// RoundBF16 rounds every value of x to the nearest bfloat16 in place
// (each stays a float32): what a value stored as bfloat16 reads back as.
func RoundBF16(x []float32) {
	for i, v := range x {
		x[i] = FromBF16(ToBF16(v))
	}
}
