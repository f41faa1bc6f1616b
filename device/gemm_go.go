package device

import "unsafe"

// gemmGo4x4 is the portable micro-kernel (step layout only) (4×4 tile, 16 accumulators): the
// fallback for CPUs without AVX2/FMA and for -tags purego. It honours the
// column mask, so it needs no scratch tile at the edges.
func gemmGo4x4(kc int, a, b, c *float32, lda, _, ldc int, alpha, beta float32, rows int, mask uint64) {
	ap := unsafe.Slice(a, (kc-1)*lda+4)
	bp := unsafe.Slice(b, kc*4)
	var c00, c01, c02, c03, c10, c11, c12, c13 float32
	var c20, c21, c22, c23, c30, c31, c32, c33 float32
	if lda != 4 {
		panic("device: gemmGo4x4 needs a packed A panel")
	}
	ap = ap[:4*kc]
	bp = bp[:4*kc]
	for len(ap) >= 4 && len(bp) >= 4 {
		b0, b1, b2, b3 := bp[0], bp[1], bp[2], bp[3]
		a0, a1, a2, a3 := ap[0], ap[1], ap[2], ap[3]
		c00 += a0 * b0
		c01 += a0 * b1
		c02 += a0 * b2
		c03 += a0 * b3
		c10 += a1 * b0
		c11 += a1 * b1
		c12 += a1 * b2
		c13 += a1 * b3
		c20 += a2 * b0
		c21 += a2 * b1
		c22 += a2 * b2
		c23 += a2 * b3
		c30 += a3 * b0
		c31 += a3 * b1
		c32 += a3 * b2
		c33 += a3 * b3
		ap, bp = ap[4:], bp[4:]
	}
	acc := [4][4]float32{
		{c00, c01, c02, c03},
		{c10, c11, c12, c13},
		{c20, c21, c22, c23},
		{c30, c31, c32, c33},
	}
	cols := 4
	for cols > 0 && mask&(1<<(cols-1)) == 0 {
		cols--
	}
	cs := unsafe.Slice(c, (rows-1)*ldc+cols)
	for i := 0; i < rows; i++ {
		row := cs[i*ldc : i*ldc+cols]
		if beta == 0 {
			for j := range row {
				row[j] = alpha * acc[i][j]
			}
			continue
		}
		for j := range row {
			row[j] = alpha*acc[i][j] + beta*row[j]
		}
	}
}
