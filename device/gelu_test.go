package device

import (
	"math"
	"testing"
)

// TestGELU32 sweeps the float32 GELU and its derivative over [−12, 12]
// against the float64 formulas: GELU within 5e-6 relative down to 1e-7
// (x > −5: the negative tail keeps its relative precision, where the tanh
// form's 1 + tanh(u) cancels; what is lost is u's float32 rounding, times
// 2|u| ≤ 20), GELU' within 5e-6 of the size of its terms, exp32 within
// 2e-7 relative and tanh32 (on |x| < 1.5, where GELU uses it) within 5e-7
// relative (a few ulps).
func TestGELU32(t *testing.T) {
	var xs []float32
	for i := -1200000; i <= 1200000; i++ {
		xs = append(xs, float32(i)*1e-5)
	}
	y, d, y2 := make([]float32, len(xs)), make([]float32, len(xs)), make([]float32, len(xs))
	gelu32(y, d, xs)
	gelu32(y2, nil, xs)
	var wy, wd, we, wt float64
	for i, v := range xs {
		if th := math.Tanh(float64(v)); th != 0 && math.Abs(float64(v)) < 1.5 {
			wt = max(wt, math.Abs(float64(tanh32(v))-th)/math.Abs(th))
		}
		if y2[i] != y[i] {
			t.Fatalf("GELU(%v) = %v without its derivative, %v with", v, y2[i], y[i])
		}
		z := float64(v)
		s := 1 / (1 + math.Exp(-2*geluC*(z+geluA*z*z*z)))
		if want := z * s; math.Abs(want) > 1e-7 {
			wy = max(wy, math.Abs(float64(y[i])-want)/math.Abs(want))
		}
		term := 2 * z * s * (1 - s) * geluC * (1 + 3*geluA*z*z)
		wd = max(wd, math.Abs(float64(d[i])-(s+term))/max(s+math.Abs(term), 1e-7))
		a := v * 7
		we = max(we, math.Abs(float64(exp32(a))-math.Exp(float64(a)))/math.Exp(float64(a)))
	}
	t.Logf("worst relative errors: GELU %.3g, GELU' %.3g, exp %.3g, tanh %.3g", wy, wd, we, wt)
	if wy > 5e-6 || wd > 5e-6 || we > 2e-7 || wt > 5e-7 {
		t.Fatalf("relative errors GELU %.3g, GELU' %.3g, exp %.3g, tanh %.3g", wy, wd, we, wt)
	}
}
