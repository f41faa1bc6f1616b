package device

// NewFastPackedB returns the AVX-512 backend with B always packed (no
// in-place B kernels), for benchmarking that choice.
func NewFastPackedB() *Fast {
	f := newFast("avx512")
	g := *f.gemm
	g.kStepB, g.kRowB = nil, nil
	f.gemm = &g
	return f
}
