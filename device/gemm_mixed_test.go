package device

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// TestGemmMixed: a bfloat16 operand gives what the float32 GEMM gives on
// its widened values, for every transposition, mixes of the two formats,
// and shapes that cross the block edges; C accumulates with beta.
func TestGemmMixed(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	rnd := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(r.NormFloat64())
		}
		return x
	}
	for _, be := range []Backend{Default(), NewCPU()} {
		for _, sh := range [][3]int{{3, 5, 7}, {mixedMC + 17, 33, mixedKC + 9}, {20, mixedNC + 5, 2*mixedKC + 1}, {5, 3, mixedBlock + 7}} {
			m, n, k := sh[0], sh[1], sh[2]
			for _, tA := range []bool{false, true} {
				for _, tB := range []bool{false, true} {
					for _, fmts := range [][2]bool{{true, false}, {false, true}, {true, true}} {
						name := fmt.Sprintf("%s/%dx%dx%d/tA=%v/tB=%v/bf16=%v", be.Name(), m, n, k, tA, tB, fmts)
						lda, ldb := k+3, n+2
						if tA {
							lda = m + 1
						}
						if tB {
							ldb = k + 4
						}
						rowsA, rowsB := m, k
						if tA {
							rowsA = k
						}
						if tB {
							rowsB = n
						}
						af, bf := rnd(rowsA*lda), rnd(rowsB*ldb)
						am, bm := F32(af, lda), F32(bf, ldb)
						if fmts[0] {
							h := make([]uint16, len(af))
							EncodeBF16(h, af)
							DecodeBF16(af, h) // the reference reads the rounded values
							am = BF16(h, lda)
						}
						if fmts[1] {
							h := make([]uint16, len(bf))
							EncodeBF16(h, bf)
							DecodeBF16(bf, h)
							bm = BF16(h, ldb)
						}
						ldc := n + 1
						c0 := rnd(m * ldc)
						want, got := append([]float32(nil), c0...), append([]float32(nil), c0...)
						be.Gemm(tA, tB, m, n, k, 0.5, af, lda, bf, ldb, 0.25, want, ldc)
						GemmMixed(be, tA, tB, m, n, k, 0.5, am, bm, 0.25, got, ldc)
						// The two may sum in another order (the pure-Go
						// backend splits k otherwise): float32 rounding
						// grows as √k times the terms' scale (|α·a·b| ≈ ½).
						sk := math.Sqrt(float64(k))
						for i := range want {
							w := math.Abs(float64(want[i]))
							tol := max(1e-4*(1+w), 8*0x1p-24*sk*(1+w+0.5*sk))
							if d := math.Abs(float64(got[i] - want[i])); d > tol {
								t.Fatalf("%s: c[%d] = %g, want %g", name, i, got[i], want[i])
							}
						}
					}
				}
			}
		}
	}
}

func TestGemmMixedShortOperand(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic for a bfloat16 operand too short for its shape")
		}
	}()
	GemmMixed(Default(), false, false, 4, 4, 4, 1, BF16(make([]uint16, 15), 4), F32(make([]float32, 16), 4), 0, make([]float32, 16), 4)
}
