package device

import "fmt"

// Mat is a GEMM operand: a row-major matrix with leading dimension LD
// whose values are float32s in F or, when F is nil, bfloat16s in H.
type Mat struct {
	F  []float32
	H  []uint16
	LD int
}

// F32 is a float32 operand.
func F32(x []float32, ld int) Mat { return Mat{F: x, LD: ld} }

// BF16 is a bfloat16 operand.
func BF16(x []uint16, ld int) Mat { return Mat{H: x, LD: ld} }

// Blocks of a mixed GEMM: a bfloat16 operand is widened at least mixedKC
// steps of k (and mixedMC rows of A, at most mixedNC columns of B) at a
// time into float32 scratch, the packing step of the GEMM, and be.Gemm
// multiplies the blocks, accumulating in float32 into C. Where a
// bfloat16 block is narrow (few columns of B, or a short k), its other
// side grows until it holds mixedBlock values, so that no sub-GEMM is too
// small to pay for its call (a convolution's weight gradient over a batch
// of 1×5×5 patches is 25 columns wide and 50,176 steps deep). The scratch
// stays at most about 1 MiB, and each value of a bfloat16 operand is
// widened once (B's once per block of rows of A: n·k·m/384 against
// 2·m·n·k FLOPs).
const (
	mixedKC    = 256
	mixedMC    = 384
	mixedNC    = 1024
	mixedBlock = 1 << 16
)

type mixedBuf struct{ a, b []float32 }

var mixedBufs = make(freeList[mixedBuf], 64)

// GemmMixed is be.Gemm for operands stored as float32 or bfloat16: C
// (float32) = alpha·op(A)·op(B) + beta·C with every product and sum in
// float32, so a bfloat16 operand costs only its rounding, not the
// accumulation's precision. With two float32 operands it is be.Gemm. It
// panics, as Gemm, on slices too short for the shapes.
func GemmMixed(be Backend, tA, tB bool, m, n, k int, alpha float32, a, b Mat, beta float32, c []float32, ldc int) {
	if a.H == nil && b.H == nil {
		be.Gemm(tA, tB, m, n, k, alpha, a.F, a.LD, b.F, b.LD, beta, c, ldc)
		return
	}
	if m < 0 || n < 0 || k < 0 {
		panic(fmt.Sprintf("device: GemmMixed: negative dimension m=%d n=%d k=%d", m, n, k))
	}
	if m == 0 || n == 0 || k == 0 || alpha == 0 {
		// Nothing to widen: Gemm scales C (its operands are not read).
		be.Gemm(tA, tB, m, n, 0, alpha, nil, max(a.LD, 1), nil, max(b.LD, 1), beta, c, ldc)
		return
	}
	checkMixed("a", a, tA, m, k)
	checkMixed("b", b, tB, k, n)
	mb, nb, kc := m, n, min(k, mixedKC)
	width := 1 // the widest bfloat16 block, across k
	if a.H != nil {
		mb = min(m, max(mixedMC, mixedBlock/kc))
		width = max(width, mb)
	}
	if b.H != nil {
		nb = min(n, mixedNC)
		width = max(width, nb)
	}
	kc = min(k, max(kc, mixedBlock/width))
	buf := mixedBufs.get()
	defer mixedBufs.put(buf)
	for i0 := 0; i0 < m; i0 += mb {
		mi := min(mb, m-i0)
		for j0 := 0; j0 < n; j0 += nb {
			nj := min(nb, n-j0)
			cij := c[i0*ldc+j0:]
			for p0 := 0; p0 < k; p0 += kc {
				kp := min(kc, k-p0)
				ab, lda := block(&buf.a, a, tA, i0, mi, p0, kp)
				bb, ldb := block(&buf.b, b, !tB, j0, nj, p0, kp)
				bt := float32(1)
				if p0 == 0 {
					bt = beta
				}
				be.Gemm(tA, tB, mi, nj, kp, alpha, ab, lda, bb, ldb, bt, cij, ldc)
			}
		}
	}
}

// block returns the part of operand x that a sub-GEMM reads: op(x) rows
// [r0, r0+rows) and steps [p0, p0+kp) of the k axis, where stepsMajor says
// x stores the k axis along its rows (Aᵀ, or B as it is). A float32
// operand is sliced in place; a bfloat16 one is widened into *scratch,
// packed with the same orientation.
func block(scratch *[]float32, x Mat, stepsMajor bool, r0, rows, p0, kp int) ([]float32, int) {
	if x.H == nil {
		if stepsMajor {
			return x.F[p0*x.LD+r0:], x.LD
		}
		return x.F[r0*x.LD+p0:], x.LD
	}
	*scratch = grow(*scratch, rows*kp)
	s := *scratch
	if stepsMajor {
		for p := 0; p < kp; p++ {
			off := (p0+p)*x.LD + r0
			DecodeBF16(s[p*rows:(p+1)*rows], x.H[off:off+rows])
		}
		return s, rows
	}
	for r := 0; r < rows; r++ {
		off := (r0+r)*x.LD + p0
		DecodeBF16(s[r*kp:(r+1)*kp], x.H[off:off+kp])
	}
	return s, kp
}

// checkMixed panics when operand x is too short for op(x) of rows×cols
// (trans: x stores cols×rows).
func checkMixed(what string, x Mat, trans bool, rows, cols int) {
	if trans {
		rows, cols = cols, rows
	}
	n := len(x.F)
	if x.F == nil {
		n = len(x.H)
	}
	if x.LD < cols {
		panic(fmt.Sprintf("device: GemmMixed: leading dimension of %s is %d, want ≥ %d", what, x.LD, cols))
	}
	if want := (rows-1)*x.LD + cols; n < want {
		panic(fmt.Sprintf("device: GemmMixed: len(%s) = %d, want ≥ %d", what, n, want))
	}
}
