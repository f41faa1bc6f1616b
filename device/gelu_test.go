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
	var wt, we float64
	for _, v := range xs {
		if th := math.Tanh(float64(v)); th != 0 && math.Abs(float64(v)) < 1.5 {
			wt = max(wt, math.Abs(float64(tanh32(v))-th)/math.Abs(th))
		}
		a := v * 7
		we = max(we, math.Abs(float64(exp32(a))-math.Exp(float64(a)))/math.Exp(float64(a)))
	}
	t.Logf("worst relative errors: exp %.3g, tanh %.3g", we, wt)
	if we > 2e-7 || wt > 5e-7 {
		t.Fatalf("relative errors exp %.3g, tanh %.3g", we, wt)
	}
	for name, gelu := range geluImpls(t) {
		y, d, y2 := make([]float32, len(xs)), make([]float32, len(xs)), make([]float32, len(xs))
		gelu(y, d, xs)
		gelu(y2, nil, xs)
		var wy, wd float64
		for i, v := range xs {
			if y2[i] != y[i] {
				t.Fatalf("%s: GELU(%v) = %v without its derivative, %v with", name, v, y2[i], y[i])
			}
			z := float64(v)
			s := 1 / (1 + math.Exp(-2*geluC*(z+geluA*z*z*z)))
			if want := z * s; math.Abs(want) > 1e-7 {
				wy = max(wy, math.Abs(float64(y[i])-want)/math.Abs(want))
			}
			term := 2 * z * s * (1 - s) * geluC * (1 + 3*geluA*z*z)
			wd = max(wd, math.Abs(float64(d[i])-(s+term))/max(s+math.Abs(term), 1e-7))
		}
		t.Logf("%s: worst relative errors GELU %.3g, GELU' %.3g", name, wy, wd)
		if wy > 5e-6 || wd > 5e-6 {
			t.Fatalf("%s: relative errors GELU %.3g, GELU' %.3g", name, wy, wd)
		}
	}
}

// geluImpls returns the GELU kernels this CPU runs: the Go loops and,
// with AVX-512, the assembly.
func geluImpls(t *testing.T) map[string]func(y, d, x []float32) {
	impls := map[string]func(y, d, x []float32){"go": gelu32}
	if finiteVec {
		impls["avx512"] = func(y, d, x []float32) {
			var dp *float32
			if d != nil {
				dp = &d[0]
			}
			geluAVX512(&y[0], dp, &x[0], len(x))
		}
	} else {
		t.Log("no AVX-512 on this CPU: only the Go loops run")
	}
	return impls
}

// TestGELUEdges checks every kernel on every length up to 3 steps of 16
// (nothing past n is written) and on infinities, NaN and the extremes,
// where the assembly must agree with the Go loops.
func TestGELUEdges(t *testing.T) {
	special := []float32{float32(math.Inf(1)), float32(math.Inf(-1)), math.MaxFloat32, -math.MaxFloat32,
		1e20, -1e20, 200, -200, 45, -45, 0, float32(math.Copysign(0, -1)), math.SmallestNonzeroFloat32}
	nan := float32(math.NaN())
	for name, gelu := range geluImpls(t) {
		for n := 1; n <= 3*16+1; n++ {
			x := make([]float32, n)
			for i := range x {
				x[i] = float32(i%7) - 3.3
			}
			y, d := make([]float32, n+1), make([]float32, n+1)
			y[n], d[n] = 42, 43
			gelu(y[:n], d[:n], x)
			if y[n] != 42 || d[n] != 43 {
				t.Fatalf("%s, n=%d: wrote past the end", name, n)
			}
			wy, wd := make([]float32, n), make([]float32, n)
			gelu32(wy, wd, x)
			for i := range x {
				if rel(y[i], wy[i]) > 1e-5 || rel(d[i], wd[i]) > 1e-5 {
					t.Fatalf("%s, n=%d: GELU(%v) = %v, %v; Go loops %v, %v", name, n, x[i], y[i], d[i], wy[i], wd[i])
				}
			}
		}
		x := append(append([]float32(nil), special...), nan)
		y, d := make([]float32, len(x)), make([]float32, len(x))
		wy, wd := make([]float32, len(x)), make([]float32, len(x))
		gelu(y, d, x)
		gelu32(wy, wd, x)
		for i, v := range x {
			if v != v {
				if y[i] == y[i] || d[i] == d[i] {
					t.Fatalf("%s: GELU(NaN) = %v, %v", name, y[i], d[i])
				}
				continue
			}
			if rel(y[i], wy[i]) > 1e-5 || rel(d[i], wd[i]) > 1e-5 {
				t.Fatalf("%s: GELU(%v) = %v, %v; Go loops %v, %v", name, v, y[i], d[i], wy[i], wd[i])
			}
		}
	}
}

// rel is |a − b| relative to the larger, 0 when equal (infinities
// included), +Inf when one is NaN.
func rel(a, b float32) float64 {
	if a == b {
		return 0
	}
	x, y := float64(a), float64(b)
	if math.IsNaN(x) || math.IsNaN(y) || math.IsInf(x, 0) || math.IsInf(y, 0) {
		return math.Inf(1)
	}
	return math.Abs(x-y) / max(math.Abs(x), math.Abs(y))
}
