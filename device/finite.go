package device

import (
	"math"
	"unsafe"
)

// finiteVec reports whether AllFinite runs the AVX-512 kernel.
var finiteVec = bestISA() == "avx512"

// AllFinite reports whether no value of x is NaN or ±Inf. It is the check
// every received all-reduce chunk goes through, so it runs AVX-512 where the
// CPU has it (16 values per compare) and otherwise tests blocks of values on
// their bits, two per uint64: a value is NaN or ±Inf exactly when its
// exponent bits are all ones, and adding one to the exponent field then
// carries into the sign bit (about twice the speed of a compare per value).
func AllFinite(x []float32) bool {
	if len(x) == 0 {
		return true
	}
	if finiteVec {
		return !nonFiniteAVX512(&x[0], len(x))
	}
	return allFiniteGo(x)
}

func allFiniteGo(x []float32) bool {
	const (
		exp   = 0x7f8000007f800000
		one   = 0x0080000000800000
		carry = 0x8000000080000000
	)
	var acc uint64
	i := 0
	for ; i+8 <= len(x); i += 8 {
		w := (*[4]uint64)(unsafe.Pointer(&x[i]))
		acc |= (w[0]&exp + one) | (w[1]&exp + one) | (w[2]&exp + one) | (w[3]&exp + one)
	}
	for ; i < len(x); i++ {
		acc |= uint64(math.Float32bits(x[i]))&exp + one
	}
	return acc&carry == 0
}
