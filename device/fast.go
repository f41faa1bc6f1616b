package device

// Fast is the SIMD CPU backend: a packed, register-blocked GEMM with
// AVX-512 or AVX2/FMA micro-kernels chosen at run time and split across
// GOMAXPROCS goroutines, and vectorised elementwise kernels. On CPUs without
// AVX2/FMA, and with -tags purego, it runs portable Go kernels.
//
// A Fast is safe for concurrent use; it holds no per-call state.
type Fast struct {
	CPU // kernels Fast does not override

	isa  string
	gemm *gemmImpl
}

var _ Backend = (*Fast)(nil)

// NewFast returns the fast backend for the best instruction set this CPU
// supports ("avx512", "avx2" or "go").
func NewFast() *Fast { return newFast(bestISA()) }

func newFast(isa string) *Fast {
	g := gemmFor(isa)
	if g == nil {
		panic("device: unsupported ISA " + isa)
	}
	return &Fast{isa: isa, gemm: g}
}

// Name implements Backend: "cpu/avx512", "cpu/avx2" or "cpu/go".
func (f *Fast) Name() string { return "cpu/" + f.isa }

// ISA reports the instruction set the kernels use: "avx512", "avx2" or "go".
func (f *Fast) ISA() string { return f.isa }

// Gemm implements Backend.
func (f *Fast) Gemm(tA, tB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	f.gemm.gemm(tA, tB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

var goGemm = &gemmImpl{
	name: "go4x4", mr: 4, nr: 4, masked: true, kStep: gemmGo4x4, packAll: true,
	kc: 256, mc: 64, nc: 512, parFlops: 1 << 21,
}
