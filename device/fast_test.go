package device_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/starling-ml/starling/device"
	"github.com/starling-ml/starling/device/devicetest"
)

func TestFastConformance(t *testing.T) {
	for _, isa := range device.SupportedISAs() {
		t.Run(isa, func(t *testing.T) { devicetest.Run(t, device.NewFastISA(isa)) })
	}
}

// refGemm is a float64 reference GEMM that materialises op(A) and op(B)
// first, so it is fast enough to check large shapes.
func refGemm(tA, tB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) []float32 {
	opA := make([]float64, m*k)
	for i := 0; i < m; i++ {
		for p := 0; p < k; p++ {
			if tA {
				opA[i*k+p] = float64(a[p*lda+i])
			} else {
				opA[i*k+p] = float64(a[i*lda+p])
			}
		}
	}
	opB := make([]float64, k*n)
	for p := 0; p < k; p++ {
		for j := 0; j < n; j++ {
			if tB {
				opB[p*n+j] = float64(b[j*ldb+p])
			} else {
				opB[p*n+j] = float64(b[p*ldb+j])
			}
		}
	}
	out := append([]float32(nil), c...)
	row := make([]float64, n)
	for i := 0; i < m; i++ {
		clear(row)
		for p := 0; p < k; p++ {
			av := opA[i*k+p]
			for j, bv := range opB[p*n : p*n+n] {
				row[j] += av * bv
			}
		}
		for j, s := range row {
			v := float64(alpha) * s
			if beta != 0 {
				v += float64(beta) * float64(c[i*ldc+j])
			}
			out[i*ldc+j] = float32(v)
		}
	}
	return out
}

// TestGemmDifferential compares every GEMM implementation with a float64
// reference over random shapes, transposes, strides, alpha and beta,
// including shapes that cross each cache-block boundary (kc = 256 deep,
// mc = 128 rows, nc = 1024 columns) and the multi-goroutine split. The
// tolerance is 1.6e-6·(k·|alpha| + |beta| + 1) absolute for inputs in
// [-1, 1): a few float32 ulps per accumulated term, as in
// devicetest.CheckGemm. C's padding columns must stay untouched and, with
// beta = 0, the NaNs in C must not propagate.
func TestGemmDifferential(t *testing.T) {
	var bes []device.Backend
	for _, isa := range device.SupportedISAs() {
		bes = append(bes, device.NewFastISA(isa))
	}
	r := rand.New(rand.NewPCG(21, 22))
	iters := 300
	if testing.Short() {
		iters = 80
	}
	for it := 0; it < iters; it++ {
		m, n, k := 1+r.IntN(90), 1+r.IntN(90), 1+r.IntN(300)
		switch it % 10 {
		case 1:
			m, n, k = 129+r.IntN(200), 1+r.IntN(80), 1+r.IntN(80)
		case 2:
			m, n, k = 1+r.IntN(40), 1000+r.IntN(200), 1+r.IntN(40)
		case 3:
			m, n, k = 1+r.IntN(40), 1+r.IntN(40), 257+r.IntN(400)
		case 4:
			m, n, k = 100+r.IntN(60), 100+r.IntN(60), 100+r.IntN(60) // split across goroutines
		case 5:
			m, n, k = 20+r.IntN(30), 20+r.IntN(40), 1500+r.IntN(1500) // split along k
		}
		tA, tB := r.IntN(2) == 1, r.IntN(2) == 1
		alpha := []float32{1, -1, 0.5, 3}[r.IntN(4)]
		beta := []float32{0, 1, -0.25, 2}[r.IntN(4)]
		ar, ac, br, bc := m, k, k, n
		if tA {
			ar, ac = k, m
		}
		if tB {
			br, bc = n, k
		}
		lda, ldb, ldc := ac+r.IntN(3), bc+r.IntN(3), n+r.IntN(3)
		a := devicetest.RandSlice(r, (ar-1)*lda+ac)
		b := devicetest.RandSlice(r, (br-1)*ldb+bc)
		c := devicetest.RandSlice(r, m*ldc)
		if beta == 0 {
			for i := range c {
				c[i] = float32(math.NaN())
			}
		}
		want := refGemm(tA, tB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
		tol := 1.6e-6 * (float64(k)*math.Abs(float64(alpha)) + math.Abs(float64(beta)) + 1)
		for _, be := range bes {
			got := append([]float32(nil), c...)
			be.Gemm(tA, tB, m, n, k, alpha, a, lda, b, ldb, beta, got, ldc)
			for i := 0; i < m; i++ {
				for j := 0; j < ldc; j++ {
					g, w := got[i*ldc+j], want[i*ldc+j]
					if j >= n {
						if g != w && !(g != g && w != w) {
							t.Fatalf("%s: wrote C padding at [%d,%d]", be.Name(), i, j)
						}
						continue
					}
					if d := math.Abs(float64(g - w)); !(d <= tol) {
						t.Fatalf("%s tA=%v tB=%v m=%d n=%d k=%d lda=%d ldb=%d ldc=%d alpha=%v beta=%v: C[%d,%d] = %v, want %v (tol %.3g)",
							be.Name(), tA, tB, m, n, k, lda, ldb, ldc, alpha, beta, i, j, g, w, tol)
					}
				}
			}
		}
	}
}
