//go:build amd64 && !purego

package device

//go:generate go run gen_kernels.go

// Micro-kernels generated into gemm_amd64.s; see gen_kernels.go and
// microKernel for the contract.

//go:noescape
func gemmAVX512Step8x32(kc int, a, b, c *float32, lda, ldb, ldc int, alpha, beta float32, rows int, mask uint64)

//go:noescape
func gemmAVX512Row8x32(kc int, a, b, c *float32, lda, ldb, ldc int, alpha, beta float32, rows int, mask uint64)

//go:noescape
func gemmAVX512StepB8x32(kc int, a, b, c *float32, lda, ldb, ldc int, alpha, beta float32, rows int, mask uint64)

//go:noescape
func gemmAVX512RowB8x32(kc int, a, b, c *float32, lda, ldb, ldc int, alpha, beta float32, rows int, mask uint64)

//go:noescape
func gemmAVX2Step6x16(kc int, a, b, c *float32, lda, ldb, ldc int, alpha, beta float32, rows int, mask uint64)

//go:noescape
func gemmAVX2Row6x16(kc int, a, b, c *float32, lda, ldb, ldc int, alpha, beta float32, rows int, mask uint64)

//go:noescape
func gemmAVX512Step16x16(kc int, a, b, c *float32, lda, ldb, ldc int, alpha, beta float32, rows int, mask uint64)

//go:noescape
func gemmAVX512Row16x16(kc int, a, b, c *float32, lda, ldb, ldc int, alpha, beta float32, rows int, mask uint64)

//go:noescape
func gemmAVX512StepB16x16(kc int, a, b, c *float32, lda, ldb, ldc int, alpha, beta float32, rows int, mask uint64)

//go:noescape
func gemmAVX512RowB16x16(kc int, a, b, c *float32, lda, ldb, ldc int, alpha, beta float32, rows int, mask uint64)

// transpose16AVX512 transposes blocks consecutive 16×16 blocks:
// d[p·w + r] = src[r·ld + p] for r < 16, p < 16·blocks.
//
//go:noescape
func transpose16AVX512(d, src *float32, ld, w, blocks int)
