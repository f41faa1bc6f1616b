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

// AxpyFinite sets y = alpha·x + y on be and reports whether every value of
// y was finite before (in) and is after (out). On the fast AVX-512 backend
// it is one pass over y; on other backends be.Axpy between two AllFinite
// checks. It is the reduction step of an all-reduce, where y is a
// received partial sum whose bad values are the sender's fault and a
// non-finite result is an overflow.
func AxpyFinite(be Backend, alpha float32, x, y []float32) (in, out bool) {
	y = y[:len(x)]
	if f, ok := be.(*Fast); ok && f.vec {
		if len(x) == 0 {
			return true, true
		}
		bad := axpyFiniteAVX512(alpha, &x[0], &y[0], len(x))
		return bad&1 == 0, bad&2 == 0
	}
	in = AllFinite(y)
	be.Axpy(alpha, x, y)
	return in, AllFinite(y)
}

// DivFinite sets x[i] = float32(float64(x[i]) / d), the all-reduce's
// division of a completed weighted sum by the total weight, and reports
// whether every result is finite. It gives the bits of that expression
// written in Go, 16 values at a time with AVX-512 where the CPU has it.
func DivFinite(x []float32, d float64) (finite bool) {
	n, bad := 0, false
	if finiteVec && len(x) >= 16 {
		n = len(x) &^ 15
		bad = divFiniteAVX512(&x[0], d, n)
	}
	for i := n; i < len(x); i++ {
		x[i] = float32(float64(x[i]) / d)
	}
	return !bad && AllFinite(x[n:])
}

// AxpyToRuns reports whether AxpyTo runs here: where AxpyFinite on be
// would use the same kernel, so that both give the same bits.
func AxpyToRuns(be Backend) bool {
	f, ok := be.(*Fast)
	return ok && f.vec && finiteVec
}

// AxpyTo sets out = alpha·x + y with AxpyFinite's AVX-512 kernel and
// reports whether every value of out is finite. It is for the receiver of
// an all-reduce's partial sum, which adds its own contribution as the sum
// arrives; it panics where that kernel is missing (see AxpyToRuns).
func AxpyTo(alpha float32, x, y, out []float32) (finite bool) {
	if len(y) != len(x) || len(out) != len(x) {
		panic("device: AxpyTo lengths differ")
	}
	if len(x) == 0 {
		return true
	}
	return !axpyToFiniteAVX512(alpha, &x[0], &y[0], &out[0], len(x))
}
