//go:build amd64 && !purego

package compression

import "golang.org/x/sys/cpu"

// AVX2 (+F16C) kernels in kernels_amd64.s. They index through raw pointers
// and process a multiple of 16 values; the wrappers below check lengths and
// leave the tail to the pure-Go loops. Every kernel gives bit-for-bit the
// pure-Go result (TestKernelsMatchPureGo).

//go:noescape
func f16EncodeAVX2(dst *byte, src *float32, n int)

//go:noescape
func f16DecodeAVX2(dst *float32, src *byte, n int)

//go:noescape
func absmaxAVX2(src *float32, n int) uint32

//go:noescape
func quantiseAVX2(dst *byte, src *float32, n int, inv float32)

//go:noescape
func dequantiseAVX2(dst *float32, src *byte, n int, scale float32)

//go:noescape
func fp4PackAVX2(dst *byte, src *float32, n int, inv float32)

// haveAVX2 reports whether the kernels run on this CPU.
var haveAVX2 = cpu.X86.HasAVX2 && cpu.X86.HasF16C

func init() {
	if !haveAVX2 {
		return
	}
	encodeF16 = encodeF16AVX2
	decodeF16 = decodeF16AVX2
	absmaxBits = absmaxBitsAVX2
	quantise = quantiseAVX2Go
	dequantise = dequantiseAVX2Go
	packFP4Pairs = packFP4PairsAVX2
}

// packFP4PairsAVX2 is packFP4PairsGo, 32 values a step.
func packFP4PairsAVX2(p []byte, y []float32, inv float32) {
	y = y[:2*len(p)]
	n := len(y) &^ 31
	if n > 0 {
		fp4PackAVX2(&p[0], &y[0], n, inv)
	}
	packFP4PairsGo(p[n/2:], y[n:], inv)
}

func encodeF16AVX2(out []byte, src []float32) {
	out = out[:2*len(src)]
	n := len(src) &^ 15
	if n > 0 {
		f16EncodeAVX2(&out[0], &src[0], n)
	}
	encodeF16Go(out[2*n:], src[n:])
}

func decodeF16AVX2(dst []float32, p []byte) {
	p = p[:2*len(dst)]
	n := len(dst) &^ 15
	if n > 0 {
		f16DecodeAVX2(&dst[0], &p[0], n)
	}
	decodeF16Go(dst[n:], p[2*n:])
}

func absmaxBitsAVX2(x []float32) uint32 {
	n := len(x) &^ 15
	var m uint32
	if n > 0 {
		m = absmaxAVX2(&x[0], n)
	}
	return max(m, absmaxBitsGo(x[n:]))
}

func quantiseAVX2Go(q []byte, x []float32, inv float32) {
	q = q[:len(x)]
	n := len(x) &^ 31
	if n > 0 {
		quantiseAVX2(&q[0], &x[0], n, inv)
	}
	quantiseGo(q[n:], x[n:], inv)
}

func dequantiseAVX2Go(x []float32, q []byte, s float32) {
	q = q[:len(x)]
	n := len(x) &^ 15
	if n > 0 {
		dequantiseAVX2(&x[0], &q[0], n, s)
	}
	dequantiseGo(x[n:], q[n:], s)
}
