package device

// Hooks for the external tests in package device_test (which can import
// devicetest without an import cycle).
var (
	NewFastISA    = newFast
	SupportedISAs = supportedISAs
)

// NewFastPackedB returns the AVX-512 backend with B always packed (no
// in-place B kernels), for benchmarking that choice.
func NewFastPackedB() *Fast {
	f := newFast("avx512")
	g := *f.gemm
	g.kStepB, g.kRowB = nil, nil
	f.gemm = &g
	return f
}
