package nn

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestParsePrecision(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Precision
	}{{"", FP32}, {"fp32", FP32}, {"bf16", BF16}} {
		if got, err := ParsePrecision(c.in); err != nil || got != c.want {
			t.Errorf("ParsePrecision(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
		if c.in != "" && c.want.String() != c.in {
			t.Errorf("%v.String() = %q", c.want, c.want.String())
		}
	}
	if _, err := ParsePrecision("fp16"); err == nil {
		t.Error("ParsePrecision(fp16): no error")
	}
	if _, err := New("mlp", 1, WithPrecision(Precision(7))); err == nil {
		t.Error("New with Precision(7): no error")
	}
}

// gradCheckBF16 checks a BF16 model's gradient against central finite
// differences of the same model in FP32 (the true gradient: differences
// of a BF16 loss would only see the bfloat16 steps of the weights), for
// up to perTensor coordinates of every tensor, and the whole gradient
// against the FP32 one in norm.
//
// Tolerance: each GEMM operand the BF16 model reads is rounded with a
// relative error of at most 2⁻⁹ ≈ 0.2 %; through a few layers, forward
// and backward, the gradient moves by a few tenths of a percent in norm
// (0.10–0.19 % measured here), with single coordinates near zero off by
// more relative to themselves. The bound, 2 % in norm and 5e-3 + 5 % per
// coordinate, is loose against that and tight against a wrong gradient
// (a missing term or transposition is off by O(100 %)).
func gradCheckBF16(t *testing.T, build func(Precision) *Model, x []float32, y []int32, perTensor int, r *rand.Rand) {
	t.Helper()
	m32, m16 := build(FP32), build(BF16)
	if m16.Precision() != BF16 {
		t.Fatal("model not in BF16")
	}
	copy(m16.Params, m32.Params)
	n := len(y) / m32.targets
	m32.ForwardBackward(x, y)
	m16.ForwardBackward(x, y)
	var d2, n2 float64
	for i, g := range m32.Grads {
		d := float64(m16.Grads[i] - g)
		d2 += d * d
		n2 += float64(g) * float64(g)
	}
	rel := math.Sqrt(d2 / n2)
	t.Logf("%s: |g_bf16 − g_fp32| / |g_fp32| = %.2e", m32.Arch, rel)
	if rel > 2e-2 || rel == 0 {
		t.Fatalf("%s: BF16 gradient off the FP32 one by %.3g in norm", m32.Arch, rel)
	}
	loss := func() float64 { l, _ := m32.Evaluate(x, y, n); return l }
	const h = 1e-3
	for _, v := range m32.views {
		idx := r.Perm(v.Len)
		if len(idx) > perTensor {
			idx = idx[:perTensor]
		}
		for _, k := range idx {
			i := v.Offset + k
			orig := m32.Params[i]
			m32.Params[i] = orig + h
			lp := loss()
			m32.Params[i] = orig - h
			lm := loss()
			m32.Params[i] = orig
			num := (lp - lm) / (2 * h)
			if a := float64(m16.Grads[i]); math.Abs(a-num) > 5e-3+5e-2*math.Abs(num) {
				t.Fatalf("%s: %s[%d]: BF16 analytic %.6g, numeric %.6g", m32.Arch, v.Name, k, a, num)
			}
		}
	}
}

func TestGradBF16(t *testing.T) {
	r := rand.New(rand.NewPCG(30, 1))
	seq := func(in Shape, classes int, mods func() []Layer) func(Precision) *Model {
		return func(p Precision) *Model {
			m, err := sequential("test", in, classes, mods(), 3, []Option{WithPrecision(p)})
			if err != nil {
				t.Fatal(err)
			}
			return m
		}
	}
	t.Run("dense", func(t *testing.T) {
		b := seq(Shape{7}, 3, func() []Layer { return []Layer{&Dense{In: 7, Out: 5, ReLU: true}, &Dense{In: 5, Out: 3}} })
		m := b(FP32)
		gradCheckBF16(t, b, randInput(r, 5*7), randTargets(r, m, 5), 30, r)
	})
	t.Run("conv", func(t *testing.T) {
		b := seq(Shape{7, 6, 2}, 3, func() []Layer {
			return []Layer{&Conv2D{In: 2, Out: 3, K: 3, Pad: 1}, &ReLU{},
				&Conv2D{In: 3, Out: 4, K: 3, Stride: 2}, &ReLU{},
				&Flatten{}, &Dense{In: 3 * 2 * 4, Out: 3}}
		})
		m := b(FP32)
		gradCheckBF16(t, b, randInput(r, 2*m.Input.Size()), randTargets(r, m, 2), 30, r)
	})
	t.Run("charlm", func(t *testing.T) {
		b := func(p Precision) *Model {
			m, err := NewCharLM(CharLMConfig{Vocab: 11, Context: 6, Dim: 8, Heads: 2, Layers: 2, MLPRatio: 2}, 5, WithPrecision(p))
			if err != nil {
				t.Fatal(err)
			}
			return m
		}
		m := b(FP32)
		gradCheckBF16(t, b, randTokens(r, 3*6, 11), randTargets(r, m, 3), 12, r)
	})
}

// TestTrainBF16 trains the same MLP from the same start in FP32 and BF16
// on a teacher's labels and compares held-out accuracy: BF16 must learn
// (≥ 85 %) and end within 3 points of FP32.
func TestTrainBF16(t *testing.T) {
	const d, classes, train, test = 20, 4, 2048, 1024
	r := rand.New(rand.NewPCG(31, 1))
	teacher := randInput(r, d*classes)
	label := func(x []float32) int32 {
		best, arg := float32(math.Inf(-1)), 0
		for c := 0; c < classes; c++ {
			var s float32
			for j := 0; j < d; j++ {
				s += x[j] * teacher[c*d+j]
			}
			if s > best {
				best, arg = s, c
			}
		}
		return int32(arg)
	}
	data := func(n int) ([]float32, []int32) {
		x := randInput(r, n*d)
		y := make([]int32, n)
		for i := range y {
			y[i] = label(x[i*d : (i+1)*d])
		}
		return x, y
	}
	xtr, ytr := data(train)
	xte, yte := data(test)
	acc := map[Precision]float64{}
	for _, p := range []Precision{FP32, BF16} {
		m, err := sequential("teacher", Shape{d}, classes, []Layer{
			&Dense{In: d, Out: 64, ReLU: true}, &Dense{In: 64, Out: 64, ReLU: true}, &Dense{In: 64, Out: classes},
		}, 7, []Option{WithPrecision(p)})
		if err != nil {
			t.Fatal(err)
		}
		opt := NewSGD(SGDConfig{Momentum: 0.9}, WithBackend(m.Backend()))
		const batch = 64
		for epoch := 0; epoch < 8; epoch++ {
			for s := 0; s < train; s += batch {
				m.ForwardBackward(xtr[s*d:(s+batch)*d], ytr[s:s+batch])
				opt.Step(m.Params, m.Grads, 0.05)
			}
		}
		_, acc[p] = m.Evaluate(xte, yte, 256)
	}
	t.Logf("held-out accuracy: fp32 %.4f, bf16 %.4f", acc[FP32], acc[BF16])
	if acc[BF16] < 0.85 || math.Abs(acc[BF16]-acc[FP32]) > 0.03 {
		t.Fatalf("held-out accuracy: fp32 %.4f, bf16 %.4f", acc[FP32], acc[BF16])
	}
}
