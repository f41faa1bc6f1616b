package compression

import (
	"math"

	"github.com/starling-ml/starling/device"
)

// Scalar conversions between float32 and the 16-bit formats. The bulk loops in
// dense.go call these; they are written so the compiler inlines them.

// f16Max is the largest finite half: 65504.
const f16Max = 65504

// f32ToF16 converts the float32 bit pattern f to IEEE 754 binary16 with round
// to nearest even. Finite values beyond ±65504 saturate to ±65504 (as
// hivemind's fp16 codec clamps) rather than becoming infinities; ±Inf stays
// ±Inf and a NaN becomes a quiet NaN with the top payload bits, exactly as
// the F16C instruction VCVTPS2PH does, so the assembly and the pure-Go paths
// give the same bytes. After F. Giesen's float_to_half_fast3_rtne.
func f32ToF16(f uint32) uint16 {
	sign := uint16(f>>16) & 0x8000
	f &= 0x7fffffff
	if f >= 0x477ff000 { // ≥ 65520 rounds past 65504: saturate, Inf or NaN
		return sign | f16Special(f)
	}
	// Normal result: rebias the exponent by (15-127)<<23 and round the 13
	// dropped mantissa bits to nearest even.
	o := (f + 0xc8000fff + (f>>13)&1) >> 13
	// Below 2⁻¹⁴ the result is a half subnormal: adding 0.5 aligns the value
	// so that the FPU's own round to nearest even lands the subnormal
	// mantissa in the low bits. Both are computed; the select is a CMOV.
	s := math.Float32bits(math.Float32frombits(f)+0.5) - 0x3f000000
	if f < 0x38800000 {
		o = s
	}
	return sign | uint16(o)
}

// f16Special handles |x| ≥ 65520 (f is the magnitude's bit pattern).
func f16Special(f uint32) uint16 {
	switch {
	case f > 0x7f800000:
		return 0x7e00 | uint16(f>>13)&0x3ff
	case f == 0x7f800000:
		return 0x7c00
	}
	return 0x7bff
}

// f16ToF32 converts the binary16 h to float32 exactly; a NaN comes out
// quiet, as VCVTPH2PS makes it.
func f16ToF32(h uint16) float32 {
	o := uint32(h&0x7fff) << 13
	exp := o & 0x0f800000
	o += 0x38000000        // rebias (127-15)<<23
	if exp == 0x0f800000 { // Inf or NaN
		o += 0x38000000
		if o&0x007fffff != 0 {
			o |= 0x00400000
		}
	}
	// Zero or subnormal: renormalise through the FPU (computed always; the
	// select is a CMOV).
	s := math.Float32bits(math.Float32frombits(o+1<<23) - math.Float32frombits(113<<23))
	if exp == 0 {
		o = s
	}
	return math.Float32frombits(o | uint32(h&0x8000)<<16)
}

// f32ToBF16 and bf16ToF32 are device's conversions (one rounding rule for
// the codec and for mixed-precision training).
func f32ToBF16(f uint32) uint16 { return device.BF16Bits(f) }

func bf16ToF32(h uint16) float32 { return device.FromBF16(h) }
