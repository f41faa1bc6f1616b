package compression

import (
	"bytes"
	"errors"
	"math"
	"testing"
)

// efRun feeds T vectors x_t = g + noise_t through c and returns the running
// sums of the inputs and of the decoded vectors (in float64), the largest
// ‖x_t‖₂ and ‖x_t‖_∞, and the largest ‖v_t‖_∞ (v = x + e).
type efRun struct {
	sumX, sumD     []float64
	maxX, maxXInf  float64
	maxVInf        float64
	minContraction float64 // min over steps of 1 − ‖e_{t+1}‖²/‖v_t‖²
}

func runEF(t *testing.T, c Codec, n, steps int, check func(v, e []float32)) efRun {
	t.Helper()
	g := gradLike(n, 11)
	run := efRun{sumX: make([]float64, n), sumD: make([]float64, n), minContraction: 1}
	x := make([]float32, n)
	d := make([]float32, n)
	v := make([]float32, n)
	var buf []byte
	ef, _ := c.(*ErrorFeedback)
	for s := 0; s < steps; s++ {
		noise := gradLike(n, uint64(100+s))
		for i := range x {
			x[i] = g[i] + 0.5*noise[i]
		}
		if ef != nil && ef.Residual() != nil {
			for i := range v {
				v[i] = x[i] + ef.Residual()[i]
			}
		} else {
			copy(v, x)
		}
		buf = c.Encode(buf, x)
		mustDecode(t, c, d, buf)
		var xi float64
		for i := range x {
			run.sumX[i] += float64(x[i])
			run.sumD[i] += float64(d[i])
			xi = math.Max(xi, math.Abs(float64(x[i])))
			run.maxVInf = math.Max(run.maxVInf, math.Abs(float64(v[i])))
		}
		run.maxX = math.Max(run.maxX, norm2(x))
		run.maxXInf = math.Max(run.maxXInf, xi)
		if ef != nil {
			e := ef.Residual()
			if vv := sumSq(v); vv > 0 {
				run.minContraction = math.Min(run.minContraction, 1-sumSq(e)/vv)
			}
			if check != nil {
				check(v, e)
			}
		}
	}
	return run
}

// gap returns ‖Σx − Σdecoded‖₂.
func (r efRun) gap() float64 {
	var s float64
	for i := range r.sumX {
		d := r.sumX[i] - r.sumD[i]
		s += d * d
	}
	return math.Sqrt(s)
}

// contractionBound is the bound on the residual of error feedback with a
// δ-contraction (‖C(v) − v‖² ≤ (1−δ)‖v‖²): ‖e‖ ≤ √(1−δ)/(1−√(1−δ))·max‖x‖.
func contractionBound(delta, maxX float64) float64 {
	q := math.Sqrt(1 - delta)
	return q / (1 - q) * maxX
}

func TestErrorFeedbackTracksRunningSum(t *testing.T) {
	const n, steps = 4096, 200
	cases := []struct {
		name  string
		codec Codec
		// bound returns the stated bound on ‖Σx − Σdecoded‖₂ = ‖e_T‖₂.
		bound func(r efRun) float64
		// check runs after every step with v = x + e_before and e_after.
		check func(t *testing.T, v, e []float32)
	}{
		{
			name:  "topk:0.01",
			codec: &TopK{Frac: 0.01},
			// Top-k keeps at least k/n of the energy: δ = k/n.
			bound: func(r efRun) float64 { return contractionBound(41.0/n, r.maxX) },
			check: func(t *testing.T, v, e []float32) {
				if got, max := sumSq(e), (1-41.0/n)*sumSq(v)*(1+1e-6); got > max {
					t.Fatalf("top-k step is no δ-contraction: ‖e‖² %g > %g", got, max)
				}
			},
		},
		{
			name:  "sign:1024",
			codec: Sign{},
			// Per block, ‖v−C(v)‖² = ‖v‖² − ‖v‖₁²/d; δ is the smallest
			// such ratio seen, measured over the run.
			bound: func(r efRun) float64 { return contractionBound(r.minContraction, r.maxX) * (1 + 1e-5) },
			check: func(t *testing.T, v, e []float32) {
				want := sumSq(v)
				for lo := 0; lo < len(v); lo += DefaultSignBlock {
					var l1 float64
					for _, u := range v[lo : lo+DefaultSignBlock] {
						l1 += math.Abs(float64(u))
					}
					want -= l1 * l1 / DefaultSignBlock
				}
				if got := sumSq(e); math.Abs(got-want) > 1e-4*sumSq(v)+1e-30 {
					t.Fatalf("sign residual energy %g, want ‖v‖² − Σ‖v_b‖₁²/d = %g", got, want)
				}
			},
		},
		{
			name:  "int8:256",
			codec: Int8{},
			// Each residual value is at most absmax/254 of its block:
			// ‖e‖_∞ ≤ (‖x‖_∞ + ‖e‖_∞)/254 ⇒ ‖e‖_∞ ≤ ‖x‖_∞/253, so
			// ‖e‖₂ ≤ √n·max‖x‖_∞/253.
			bound: func(r efRun) float64 { return math.Sqrt(n) * r.maxXInf / 253 * (1 + 1e-5) },
		},
		{
			name:  "fp16",
			codec: FP16{},
			bound: func(r efRun) float64 { return math.Sqrt(n) * (r.maxVInf*0x1p-11 + 0x1p-25) },
		},
		{
			name:  "randk:0.01",
			codec: &RandK{Frac: 0.01, Seed: 1},
			// Random-k is a δ = k/n contraction only in expectation;
			// E‖e‖² ≤ (1−δ)/δ²·max‖x‖², and we allow a factor 2.
			bound: func(r efRun) float64 { return 2 * math.Sqrt(1-41.0/n) / (41.0 / n) * r.maxX },
		},
		{
			name:  "powersgd:rank=4",
			codec: &PowerSGD{Rank: 4},
			// PowerSGD has no contraction guarantee; on this data the
			// residual stays below 5·max‖x‖ (an empirical bound).
			bound: func(r efRun) float64 { return 5 * r.maxX },
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ef := NewErrorFeedback(tc.codec)
			var check func(v, e []float32)
			if tc.check != nil {
				check = func(v, e []float32) { tc.check(t, v, e) }
			}
			r := runEF(t, ef, n, steps, check)
			// Telescoping: Σx − Σdecoded = e_T, up to float32 rounding of
			// the residual updates.
			e := ef.Residual()
			var worst float64
			for i := range e {
				worst = math.Max(worst, math.Abs(r.sumX[i]-r.sumD[i]-float64(e[i])))
			}
			if tol := steps * 0x1p-22 * r.maxVInf; worst > tol {
				t.Fatalf("Σx − Σdecoded differs from the residual by %g > %g", worst, tol)
			}
			if gap, b := r.gap(), tc.bound(r); gap > b {
				t.Fatalf("‖Σx − Σdecoded‖ = %g > bound %g", gap, b)
			} else {
				t.Logf("‖Σx − Σdecoded‖ = %.3g (bound %.3g), ‖Σx‖ = %.3g", gap, b, norm2f64(r.sumX))
			}
		})
	}
}

func norm2f64(x []float64) float64 {
	var s float64
	for _, v := range x {
		s += v * v
	}
	return math.Sqrt(s)
}

// Without error feedback top-k never sends the small coordinates of the
// steady gradient, so the running sum drifts linearly; with it, it does not.
func TestErrorFeedbackVersusNone(t *testing.T) {
	const n, steps = 4096, 200
	with := runEF(t, NewErrorFeedback(&TopK{Frac: 0.01}), n, steps, nil)
	without := runEF(t, &TopK{Frac: 0.01}, n, steps, nil)
	t.Logf("‖Σx − Σdecoded‖ after %d steps: %.3g with error feedback, %.3g without (‖Σx‖ %.3g)",
		steps, with.gap(), without.gap(), norm2f64(with.sumX))
	if without.gap() < 5*with.gap() {
		t.Fatalf("error feedback gap %g is not 5× below the plain gap %g", with.gap(), without.gap())
	}
	// And the plain gap grows linearly: twice the steps, about twice the gap.
	longer := runEF(t, &TopK{Frac: 0.01}, n, 2*steps, nil)
	if r := longer.gap() / without.gap(); r < 1.8 {
		t.Fatalf("plain top-k gap grew only %.2f× over twice the steps", r)
	}
}

// A checkpointed ErrorFeedback resumes bit-exactly, with inner state too.
func TestErrorFeedbackState(t *testing.T) {
	for _, spec := range []string{"topk:0.01,ef", "sign:ef", "randk:0.05,seed=9,ef", "powersgd:rank=2,ef", "int8:ef"} {
		a, err := Parse(spec)
		if err != nil {
			t.Fatal(err)
		}
		x := gradLike(2000, 1)
		var buf []byte
		for s := 0; s < 3; s++ {
			buf = a.Encode(buf, x)
		}
		st := AppendState(nil, a)
		b, _ := Parse(spec)
		if err := LoadState(b, st); err != nil {
			t.Fatalf("%s: %v", spec, err)
		}
		y := gradLike(2000, 2)
		if ea, eb := a.Encode(nil, y), b.Encode(nil, y); !bytes.Equal(ea, eb) {
			t.Fatalf("%s: restored codec encodes differently", spec)
		}
		if err := LoadState(b, st[:len(st)-1]); !errors.Is(err, ErrState) {
			t.Fatalf("%s: truncated state: %v", spec, err)
		}
	}
	// Stateless codecs have an empty state.
	if st := AppendState(nil, FP16{}); len(st) != 0 {
		t.Fatalf("fp16 state %v", st)
	}
	if err := LoadState(FP16{}, []byte{1}); !errors.Is(err, ErrState) {
		t.Fatalf("state for a stateless codec: %v", err)
	}
	var ps PowerSGD
	if err := ps.LoadState([]byte{statePowerSGD, 0, 1, 0, 5}); !errors.Is(err, ErrState) {
		t.Fatalf("zero-row shape: %v", err)
	}
}
