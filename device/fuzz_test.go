package device_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/starling-ml/starling/device"
	"github.com/starling-ml/starling/device/devicetest"
)

// FuzzGemm drives the shape handling of every Fast GEMM with shapes, leading
// dimensions and slice lengths from the fuzzer. A call with consistent
// arguments must match the float64 reference (tolerance as in
// devicetest.CheckGemm) and leave everything outside C untouched; a call
// with inconsistent arguments (short slices, small leading dimensions) must
// panic before touching memory, never crash or write out of bounds.
func FuzzGemm(f *testing.F) {
	f.Add(false, false, 5, 7, 3, 0, 0, 0, 0, 0, uint64(1))
	f.Add(true, false, 33, 65, 17, 1, 2, 3, 1, 1, uint64(2))
	f.Add(false, true, 8, 32, 256, 0, 0, 0, 2, 2, uint64(3))
	f.Add(true, true, 13, 31, 300, 5, 1, 0, 3, 0, uint64(4))
	f.Add(false, false, 4, 4, 4, -1, 0, 0, 0, 0, uint64(5))   // lda too small
	f.Add(false, true, 9, 9, 9, 0, 0, 0, 0, 0, uint64(1<<40)) // short slice
	bes := []device.Backend{}
	for _, isa := range device.SupportedISAs() {
		bes = append(bes, device.NewFastISA(isa))
	}
	f.Fuzz(func(t *testing.T, tA, tB bool, m, n, k, padA, padB, padC, alphaSel, betaSel int, seed uint64) {
		m, n, k = clampDim(m, 70), clampDim(n, 70), clampDim(k, 300)
		padA, padB, padC = clampPad(padA), clampPad(padB), clampPad(padC)
		alpha := []float32{1, -1, 0.5, 0}[uint(alphaSel)%4]
		beta := []float32{0, 1, -0.5, 2}[uint(betaSel)%4]
		ar, ac := m, k
		if tA {
			ar, ac = k, m
		}
		br, bc := k, n
		if tB {
			br, bc = n, k
		}
		lda, ldb, ldc := max(ac+padA, 0), max(bc+padB, 0), max(n+padC, 0)
		r := rand.New(rand.NewPCG(seed, 7))
		size := func(rows, cols, ld int) int {
			if rows == 0 || cols == 0 {
				return 0
			}
			return (rows-1)*max(ld, cols) + cols
		}
		la, lb, lc := size(ar, ac, lda), size(br, bc, ldb), size(m, n, ldc)
		if seed>>40 != 0 { // shorten one operand by one element
			switch seed >> 40 % 3 {
			case 0:
				la = max(la-1, 0)
			case 1:
				lb = max(lb-1, 0)
			default:
				lc = max(lc-1, 0)
			}
		}
		// The contract: an operand with no rows or no columns needs nothing;
		// otherwise ld ≥ cols and len ≥ (rows−1)·ld + cols. With m or n
		// zero nothing is needed at all.
		ok := func(rows, cols, ld, l int) bool {
			return rows == 0 || cols == 0 || ld >= cols && l >= (rows-1)*ld+cols
		}
		valid := m == 0 || n == 0 || ok(ar, ac, lda, la) && ok(br, bc, ldb, lb) && ok(m, n, ldc, lc)
		a := devicetest.RandSlice(r, max(la, 0))
		b := devicetest.RandSlice(r, max(lb, 0))
		// c lives inside a guarded buffer to catch stray writes.
		buf := devicetest.RandSlice(r, max(lc, 0)+32)
		for i := max(lc, 0); i < len(buf); i++ {
			buf[i] = 777
		}
		c := buf[:max(lc, 0)]
		if beta == 0 {
			for i := range c {
				c[i] = float32(math.NaN())
			}
		}
		want := append([]float32(nil), c...)
		if valid && m > 0 && n > 0 {
			devicetest.NaiveGemm(tA, tB, m, n, k, alpha, a, lda, b, ldb, beta, want, ldc)
		}
		tol := 1.6e-6 * (float64(k)*math.Abs(float64(alpha)) + math.Abs(float64(beta)) + 1)
		for _, be := range bes {
			got := append([]float32(nil), buf...)
			panicked := func() (p bool) {
				defer func() { p = recover() != nil }()
				be.Gemm(tA, tB, m, n, k, alpha, a, lda, b, ldb, beta, got[:len(c)], ldc)
				return false
			}()
			for i := len(c); i < len(got); i++ {
				if got[i] != 777 {
					t.Fatalf("%s: wrote past C at %d", be.Name(), i)
				}
			}
			if !valid {
				if !panicked {
					t.Fatalf("%s: inconsistent shapes (tA=%v tB=%v m=%d n=%d k=%d lda=%d ldb=%d ldc=%d, lens %d %d %d) did not panic",
						be.Name(), tA, tB, m, n, k, lda, ldb, ldc, len(a), len(b), len(c))
				}
				continue
			}
			if panicked {
				t.Fatalf("%s: valid call panicked (tA=%v tB=%v m=%d n=%d k=%d lda=%d ldb=%d ldc=%d)", be.Name(), tA, tB, m, n, k, lda, ldb, ldc)
			}
			for i := 0; i < m; i++ {
				for j := 0; j < ldc && i*ldc+j < len(c); j++ {
					g, w := got[i*ldc+j], want[i*ldc+j]
					if j >= n { // padding: untouched
						if g != w && !(g != g && w != w) {
							t.Fatalf("%s: wrote C padding at [%d,%d]", be.Name(), i, j)
						}
						continue
					}
					if d := math.Abs(float64(g - w)); !(d <= tol) {
						t.Fatalf("%s tA=%v tB=%v m=%d n=%d k=%d: C[%d,%d] = %v, want %v", be.Name(), tA, tB, m, n, k, i, j, g, w)
					}
				}
			}
		}
	})
}

func clampDim(v, hi int) int {
	if v < 0 {
		v = -v
	}
	return v % (hi + 1)
}

// clampPad maps v into [-1, 3]: −1 makes a leading dimension too small.
func clampPad(v int) int { return (v%5+5)%5 - 1 }
