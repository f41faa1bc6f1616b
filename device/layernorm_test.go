package device

import (
	"math/rand/v2"
	"testing"
)

// TestLayerNormAVX512 checks the AVX-512 LayerNorm kernels against the
// portable loops on every width in 8…136 that they take and 1–5 rows:
// y, mean, rstd and dx within 2e-6 relative (the float64 sums run in
// another order), dw and db accumulated onto non-zero starting values.
func TestLayerNormAVX512(t *testing.T) {
	if !finiteVec {
		t.Skip("no AVX-512 on this CPU: the portable loops run instead")
	}
	r := rand.New(rand.NewPCG(5, 6))
	fill := func(n int, mean, scale float64) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(mean + scale*r.NormFloat64())
		}
		return v
	}
	var cpu CPU
	for cols := 8; cols <= 136; cols += 8 {
		for rows := 1; rows <= 5; rows++ {
			n := rows * cols
			x, w, b, dy := fill(n, 0.5, 3), fill(cols, 1, 0.2), fill(cols, 0, 0.2), fill(n, 0, 1)
			y, wy := make([]float32, n+1), make([]float32, n+1)
			mean, rstd, wmean, wrstd := make([]float32, rows), make([]float32, rows), make([]float32, rows), make([]float32, rows)
			y[n] = 42
			layerNormAVX512(&y[0], &mean[0], &rstd[0], &x[0], &w[0], &b[0], rows, cols, 1e-5)
			cpu.LayerNorm(wy, wmean, wrstd, x, w, b, rows, cols, 1e-5)
			if y[n] != 42 {
				t.Fatalf("cols=%d rows=%d: LayerNorm wrote past the end", cols, rows)
			}
			for i := range rows {
				if rel(mean[i], wmean[i]) > 2e-6 || rel(rstd[i], wrstd[i]) > 2e-6 {
					t.Fatalf("cols=%d rows=%d: row %d mean, rstd %v, %v; want %v, %v", cols, rows, i, mean[i], rstd[i], wmean[i], wrstd[i])
				}
			}
			for i := range n {
				if rel(y[i], wy[i]) > 2e-6 && abs32(y[i]-wy[i]) > 1e-6 {
					t.Fatalf("cols=%d rows=%d: y[%d] = %v, want %v", cols, rows, i, y[i], wy[i])
				}
			}
			dx, wdx := make([]float32, n+1), make([]float32, n+1)
			dx[n] = 42
			dw, db := fill(cols, 0, 1), fill(cols, 0, 1)
			wdw, wdb := append([]float32(nil), dw...), append([]float32(nil), db...)
			layerNormBackwardAVX512(&dx[0], &dw[0], &db[0], &dy[0], &x[0], &wmean[0], &wrstd[0], &w[0], rows, cols)
			cpu.LayerNormBackward(wdx, wdw, wdb, dy, x, wmean, wrstd, w, rows, cols)
			if dx[n] != 42 {
				t.Fatalf("cols=%d rows=%d: LayerNormBackward wrote past the end", cols, rows)
			}
			for i := range n {
				if rel(dx[i], wdx[i]) > 2e-6 && abs32(dx[i]-wdx[i]) > 1e-6 {
					t.Fatalf("cols=%d rows=%d: dx[%d] = %v, want %v", cols, rows, i, dx[i], wdx[i])
				}
			}
			for j := range cols {
				if rel(dw[j], wdw[j]) > 2e-6 || db[j] != wdb[j] {
					t.Fatalf("cols=%d rows=%d: dw, db[%d] = %v, %v; want %v, %v", cols, rows, j, dw[j], db[j], wdw[j], wdb[j])
				}
			}
		}
	}
}

func abs32(v float32) float32 { return max(v, -v) }
