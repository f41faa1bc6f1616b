package nn

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/starling-ml/starling/device"
)

func randInput(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	return x
}

// gradCheck compares the analytic gradient of the mean cross-entropy with
// central finite differences, for up to perTensor coordinates of every
// parameter tensor, on n samples of normal inputs and random labels.
//
// Tolerance: the model computes in float32. With step h, rounding error in
// the loss (≈1e-7·|L|, |L| ≈ 2) contributes ≈ 1e-7/h = 1e-4 to a difference
// quotient and truncation error O(h²·|third derivative|) ≈ 1e-6 at h = 1e-3, so
// |analytic − numeric| ≤ 1e-3 + 1e-2·|numeric| leaves an order of magnitude
// of margin. ReLU and max-pool kinks crossed by ±h break any such bound (at
// h = 1e-2 one max-pool window switched); the fixed seeds keep every
// pre-activation further than h from them, and a failure names the
// coordinate.
func gradCheck(t *testing.T, m *Model, n int, perTensor int, seed uint64) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 1))
	x := randInput(r, n*m.Input.Size())
	gradCheckXY(t, m, x, randTargets(r, m, n), perTensor, r)
}

// randTargets returns targets for n samples of m.
func randTargets(r *rand.Rand, m *Model, n int) []int32 {
	y := make([]int32, n*m.targets)
	for i := range y {
		y[i] = int32(r.IntN(m.Classes))
	}
	return y
}

// gradCheckXY is gradCheck on a given batch. A model with stochastic
// layers is checked in training mode with the step held fixed, so every
// evaluation of the loss draws the same dropout masks.
func gradCheckXY(t *testing.T, m *Model, x []float32, y []int32, perTensor int, r *rand.Rand) {
	t.Helper()
	n := len(y) / m.targets
	step := m.Step()
	m.ForwardBackward(x, y)
	analytic := append([]float32(nil), m.Grads...)
	loss := func() float64 { l, _ := m.Evaluate(x, y, n); return l }
	if len(m.stoch) > 0 {
		loss = func() float64 { m.SetStep(step); l, _ := m.ForwardBackward(x, y); return l }
	}
	const h = 1e-3
	checked := 0
	for _, v := range m.views {
		idx := r.Perm(v.Len)
		if len(idx) > perTensor {
			idx = idx[:perTensor]
		}
		for _, k := range idx {
			i := v.Offset + k
			orig := m.Params[i]
			m.Params[i] = orig + h
			lp := loss()
			m.Params[i] = orig - h
			lm := loss()
			m.Params[i] = orig
			num := (lp - lm) / (2 * h)
			a := float64(analytic[i])
			if math.Abs(a-num) > 1e-3+1e-2*math.Abs(num) {
				t.Fatalf("%s: %s[%d]: analytic %.6g, numeric %.6g", m.Arch, v.Name, k, a, num)
			}
			checked++
		}
	}
	if checked == 0 {
		t.Fatal("no parameters checked")
	}
}

// viewNames lists a model's parameter names (with their shapes, if asked)
// separated by spaces.
func viewNames(m *Model, shapes bool) string {
	var b strings.Builder
	for i, v := range m.Views() {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(v.Name)
		if shapes {
			fmt.Fprint(&b, v.Shape)
		}
	}
	return b.String()
}

func mustBuild(t *testing.T, in Shape, classes int, mods ...Layer) *Model {
	t.Helper()
	m, err := sequential("test", in, classes, mods, 3, nil)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestGradDense(t *testing.T) {
	gradCheck(t, mustBuild(t, Shape{7}, 3, &Dense{In: 7, Out: 3}), 5, 30, 1)
}

func TestGradDenseReLUFused(t *testing.T) {
	m := mustBuild(t, Shape{6}, 4, &Dense{In: 6, Out: 9}, &ReLU{}, &Dense{In: 9, Out: 5}, &ReLU{}, &Dense{In: 5, Out: 4})
	if len(m.Layers()) != 3 || !m.Layers()[0].(*Dense).ReLU {
		t.Fatal("ReLU after Linear was not fused")
	}
	gradCheck(t, m, 4, 40, 2)
}

func TestGradStandaloneReLUAndFlatten(t *testing.T) {
	// ReLU after MaxPool cannot fuse; Flatten permutes to channels-first.
	m := mustBuild(t, Shape{4, 4, 2},
		3,
		&Conv2D{In: 2, Out: 3, K: 3, Pad: 1}, &MaxPool2D{K: 2}, &ReLU{}, &Flatten{}, &Dense{In: 12, Out: 3})
	gradCheck(t, m, 3, 40, 3)
}

func TestGradConvStack(t *testing.T) {
	m := mustBuild(t, Shape{7, 6, 2}, 3,
		&Conv2D{In: 2, Out: 3, K: 3, Pad: 1}, &ReLU{},
		&Conv2D{In: 3, Out: 4, K: 3, Stride: 2}, &ReLU{},
		&Flatten{}, &Dense{In: 3 * 2 * 4, Out: 3})
	gradCheck(t, m, 2, 40, 4)
}

func TestGradModels(t *testing.T) {
	lr, _ := NewLogReg(784, 10, 1)
	mlp, _ := New("mlp", 1)
	cnn, err := NewCNN(8, 8, 1, 10, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []*Model{lr, mlp, cnn} {
		t.Run(m.Arch, func(t *testing.T) { gradCheck(t, m, 3, 15, 5) })
	}
}

func TestArchitectures(t *testing.T) {
	cases := map[string]int{
		"logreg":         7850,
		"mlp":            784*200 + 200 + 200*200 + 200 + 200*10 + 10, // FedAvg 2NN: 199,210
		"mlp:784-128-10": 784*128 + 128 + 128*10 + 10,
		"cnn":            1663370, // as reported by McMahan et al. 2017
	}
	for arch, want := range cases {
		m, err := New(arch, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(m.Params) != want {
			t.Errorf("%s: %d parameters, want %d", arch, len(m.Params), want)
		}
	}
	cnn, _ := New("cnn", 0)
	want := "0.weight[32 1 5 5] 0.bias[32] 3.weight[64 32 5 5] 3.bias[64] 7.weight[512 3136] 7.bias[512] 9.weight[10 512] 9.bias[10]"
	if got := viewNames(cnn, true); got != want {
		t.Errorf("CNN names %s, want torch.nn.Sequential's %s", got, want)
	}
	for _, bad := range []string{"resnet", "mlp:784-x-10", "mlp:100-10", "cnn:5"} {
		if _, err := New(bad, 0); !errors.Is(err, ErrArch) {
			t.Errorf("%q: err = %v, want ErrArch", bad, err)
		}
	}
}

func TestInitDeterministic(t *testing.T) {
	a, _ := New("mlp", 7)
	b, _ := New("mlp", 7)
	c, _ := New("mlp", 8)
	if !equalF(a.Params, b.Params) || equalF(a.Params, c.Params) {
		t.Fatal("init must depend on the seed alone")
	}
	bound := float32(1 / math.Sqrt(784))
	for _, v := range a.Param(a.Views()[0]) {
		if v < -bound || v >= bound {
			t.Fatalf("first layer weight %v outside ±1/√784", v)
		}
	}
}

func equalF(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestFlattenChannelsFirst(t *testing.T) {
	f := &Flatten{}
	if _, err := f.Setup(Shape{2, 3, 4}); err != nil {
		t.Fatal(err)
	}
	x := make([]float32, 2*3*4)
	for h := 0; h < 2; h++ {
		for w := 0; w < 3; w++ {
			for c := 0; c < 4; c++ {
				x[(h*3+w)*4+c] = float32(100*c + 10*h + w)
			}
		}
	}
	y := f.Forward(device.Default(), x, 1)
	for c := 0; c < 4; c++ {
		for h := 0; h < 2; h++ {
			for w := 0; w < 3; w++ {
				if y[c*6+h*3+w] != float32(100*c+10*h+w) {
					t.Fatalf("flatten order at c=%d h=%d w=%d", c, h, w)
				}
			}
		}
	}
}

func TestSchedules(t *testing.T) {
	s, err := ParseSchedule("warmup:10+cosine", 1, 110)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.LR(0); math.Abs(float64(got)-0.1) > 1e-6 {
		t.Fatalf("warmup start %v", got)
	}
	if got := s.LR(10); got != 1 {
		t.Fatalf("after warmup %v", got)
	}
	if got := s.LR(60); math.Abs(float64(got)-0.5) > 1e-6 {
		t.Fatalf("cosine midpoint %v", got)
	}
	if got := s.LR(1000); got != 0 {
		t.Fatalf("cosine end %v", got)
	}
	st, _ := ParseSchedule("step:5,0.5", 2, 100)
	if st.LR(4) != 2 || st.LR(5) != 1 || st.LR(12) != 0.5 {
		t.Fatal("step decay")
	}
	if c, _ := ParseSchedule("constant", 0.3, 9); c.LR(1e6) != 0.3 {
		t.Fatal("constant")
	}
	if LinearScaling(0.1, 256, 1024) != 0.4 {
		t.Fatal("linear scaling")
	}
	for _, bad := range []string{"exp", "step:0,1", "warmup:x+cosine", "warmup:5"} {
		if _, err := ParseSchedule(bad, 1, 10); err == nil {
			t.Errorf("%q: want error", bad)
		}
	}
}

func TestClipGlobalNorm(t *testing.T) {
	be := device.Default()
	g := []float32{3, 4}
	if n := ClipGlobalNorm(be, g, 1); n != 5 || math.Abs(float64(g[0])-0.6) > 1e-5 || math.Abs(float64(g[1])-0.8) > 1e-5 {
		t.Fatalf("norm %v grads %v", n, g)
	}
	g = []float32{0.3, 0.4}
	ClipGlobalNorm(be, g, 1)
	if g[0] != 0.3 {
		t.Fatal("clipped below the bound")
	}
	g = []float32{float32(math.NaN()), 1}
	if n := ClipGlobalNorm(be, g, 1); !math.IsNaN(n) || g[1] != 1 {
		t.Fatal("NaN norm must be reported and leave grads alone")
	}
}

// TestOptimizersDescend checks every optimiser reduces the loss of a small
// model on a fixed batch.
func TestOptimizersDescend(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	x := randInput(r, 32*20)
	y := make([]int32, 32)
	for i := range y {
		y[i] = int32(i % 4)
	}
	for _, name := range []string{"sgd", "momentum", "nesterov", "adam", "adamw"} {
		m, _ := NewMLP([]int{20, 16, 4}, 1)
		opt, err := NewOptimizer(name, 1e-4)
		if err != nil {
			t.Fatal(err)
		}
		lr := float32(0.1)
		if name == "adam" || name == "adamw" {
			lr = 0.01
		}
		first, _ := m.ForwardBackward(x, y)
		var last float64
		for i := 0; i < 100; i++ {
			opt.Step(m.Params, m.Grads, lr)
			last, _ = m.ForwardBackward(x, y)
		}
		if !(last < first*0.6) {
			t.Errorf("%s: loss %v → %v", name, first, last)
		}
		steps, st := opt.State()
		if steps != 100 {
			t.Errorf("%s: %d steps recorded", name, steps)
		}
		o2, _ := NewOptimizer(name, 1e-4)
		if err := o2.SetState(steps, st); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := NewOptimizer("lbfgs", 0); !errors.Is(err, ErrOptimizer) {
		t.Fatal("unknown optimizer: want ErrOptimizer")
	}
}
