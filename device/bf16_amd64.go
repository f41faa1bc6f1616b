//go:build amd64 && !purego

package device

import "golang.org/x/sys/cpu"

//go:noescape
func bf16EncodeAVX2(dst *uint16, src *float32, n int)

//go:noescape
func bf16DecodeAVX2(dst *float32, src *uint16, n int)

var haveBF16AVX2 = cpu.X86.HasAVX2

// encodeBF16Vec converts the longest multiple of 16 values with AVX2 and
// returns how many it did (bit for bit BF16Bits: TestBF16VecMatchesScalar).
func encodeBF16Vec(dst []uint16, src []float32) int {
	n := len(src) &^ 15
	if !haveBF16AVX2 || n == 0 {
		return 0
	}
	_ = dst[n-1]
	bf16EncodeAVX2(&dst[0], &src[0], n)
	return n
}

func decodeBF16Vec(dst []float32, src []uint16) int {
	n := len(src) &^ 15
	if !haveBF16AVX2 || n == 0 {
		return 0
	}
	_ = dst[n-1]
	bf16DecodeAVX2(&dst[0], &src[0], n)
	return n
}
