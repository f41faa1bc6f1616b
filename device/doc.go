// Package device is Starling's compute backend: the small set of numeric
// kernels that nn/, compression/ and aggregate/ run on, behind one interface
// that a faster CPU kernel or a GPU backend can implement without any change
// to its callers.
//
// # Model
//
// Every tensor is a row-major []float32 owned by the caller. Kernels never
// allocate on the hot path, never retain their arguments after returning, and
// never do I/O. A Backend is safe for concurrent use by several goroutines as
// long as they do not write the same slices.
//
// Matrices follow BLAS conventions in row-major order: an m×n matrix A with
// leading dimension lda stores element (i, j) at a[i*lda+j].
//
//	be := device.Default()
//	// C (m×n) = A (m×k) · Bᵀ (n×k)
//	be.Gemm(false, true, m, n, k, 1, a, k, b, k, 0, c, n)
//
// Convolutions use channels-last (NHWC) activations and an im2col matrix whose
// rows are output pixels and whose columns run over (channel, ky, kx), so a
// convolution weight stored as F×(C·KH·KW) has PyTorch's [F, C, KH, KW] layout.
//
// Randomness is counter-based: RandNormal and RandUniform derive every value
// from (seed, index) alone, so results do not depend on the backend, on the
// number of threads, or on how a tensor is split.
package device
