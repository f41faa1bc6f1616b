package nn

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/starling-ml/starling/device"
)

func mustModel(t *testing.T, root Layer, in Shape, loss Loss) *Model {
	t.Helper()
	m, err := NewModel(root, in, loss, 3)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// randTokens returns n values that are token ids in [0, vocab).
func randTokens(r *rand.Rand, n, vocab int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.IntN(vocab))
	}
	return x
}

func TestGradSequenceDense(t *testing.T) {
	// Linear on the last axis of [T, D], then per-position classes.
	m := mustModel(t, NewSequential(&Dense{In: 5, Out: 7}, &GELU{}, &Dense{In: 7, Out: 4}), Shape{3, 5}, NextTokenCrossEntropy{})
	if fmt.Sprint(m.Output) != "[3 4]" || m.targets != 3 {
		t.Fatalf("output %v with %d targets, want [3 4] and 3", m.Output, m.targets)
	}
	gradCheck(t, m, 4, 30, 11)
}

func TestGradResidual(t *testing.T) {
	body := NewSequential(&Dense{In: 6, Out: 8}, &GELU{}, &Dense{In: 8, Out: 6})
	m := mustModel(t, NewSequential(&Dense{In: 5, Out: 6}, NewResidual(body), &Dense{In: 6, Out: 3}), Shape{5}, nil)
	var names []string
	for _, v := range m.Views() {
		names = append(names, v.Name)
	}
	want := "[0.weight 0.bias 1.0.weight 1.0.bias 1.2.weight 1.2.bias 2.weight 2.bias]"
	if got := fmt.Sprint(names); got != want {
		t.Fatalf("names %s, want %s", got, want)
	}
	gradCheck(t, m, 4, 30, 12)
}

func TestGradResidualFirst(t *testing.T) {
	// A Residual as the first layer still computes its body's gradients.
	m := mustModel(t, NewSequential(NewResidual(NewSequential(&Dense{In: 4, Out: 4}, &GELU{})), &Dense{In: 4, Out: 3}), Shape{4}, nil)
	gradCheck(t, m, 3, 20, 13)
}

func TestGradAvgPool(t *testing.T) {
	m := mustModel(t, NewSequential(&Conv2D{In: 2, Out: 3, K: 3, Pad: 1}, &AvgPool2D{K: 2}, &Flatten{}, &Dense{In: 2 * 3 * 3, Out: 3}), Shape{5, 6, 2}, nil)
	gradCheck(t, m, 3, 30, 14)
}

func TestShapeErrors(t *testing.T) {
	cases := []struct {
		root Layer
		in   Shape
		loss Loss
		want []string
	}{
		{NewSequential(&Dense{In: 5, Out: 3}), Shape{4}, nil, []string{"Linear(5, 3)", "[..., 5]", "[4]"}},
		{NewSequential(&Dense{In: 4, Out: 3}), Shape{2, 4}, nil, []string{"CrossEntropy", "[2 3]"}},
		{NewSequential(&Dense{In: 4, Out: 3}), Shape{4}, NextTokenCrossEntropy{}, []string{"[T, vocab]", "[3]"}},
		{NewResidual(&Dense{In: 4, Out: 3}), Shape{4}, nil, []string{"[4]", "[3]"}},
		{NewNamedSequential(Child{"a", &Dense{In: 4, Out: 4}}, Child{"a", &Dense{In: 4, Out: 3}}), Shape{4}, nil, []string{`"a.weight"`}},
	}
	for _, c := range cases {
		_, err := NewModel(c.root, c.in, c.loss, 1)
		if !errors.Is(err, ErrArch) {
			t.Errorf("err = %v, want ErrArch", err)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("err %q does not name %q", err, w)
			}
		}
	}
	if _, err := NewModel(NewSequential(&Dense{In: 5, Out: 3}), Shape{4}, nil, 1); !errors.Is(err, ErrShape) {
		t.Errorf("a shape mismatch must wrap ErrShape: %v", err)
	}
}

func TestWithBackend(t *testing.T) {
	be := device.NewCPU()
	m, err := New("mlp:784-16-10", 1, WithBackend(be))
	if err != nil {
		t.Fatal(err)
	}
	ref, _ := New("mlp:784-16-10", 1)
	if m.Backend() != device.Backend(be) || !equalF(m.Params, ref.Params) {
		t.Fatal("WithBackend must set the backend and keep the initial parameters")
	}
	opt, _ := NewOptimizer("adam", 0, WithBackend(m.Backend()))
	if opt.(*Adam).be != device.Backend(be) || NewSGD(SGDConfig{}, WithBackend(be)).be != device.Backend(be) {
		t.Fatal("optimisers must run on the backend they are given")
	}
	if NewSGD(SGDConfig{}).be != device.Default() {
		t.Fatal("an optimiser without WithBackend runs on device.Default()")
	}
}
