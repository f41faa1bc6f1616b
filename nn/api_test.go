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
	want := "0.weight 0.bias 1.0.weight 1.0.bias 1.2.weight 1.2.bias 2.weight 2.bias"
	if got := viewNames(m, false); got != want {
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
	shared := &Dense{In: 4, Out: 4}
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
		{NewSequential(shared, shared), Shape{4}, nil, []string{`Linear "1" appears twice`}},
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

func TestGradLayerNorm(t *testing.T) {
	m := mustModel(t, NewSequential(&Dense{In: 5, Out: 6}, &LayerNorm{Dim: 6}, &Dense{In: 6, Out: 3}), Shape{2, 5}, NextTokenCrossEntropy{})
	gradCheck(t, m, 3, 30, 15)
}

func TestGradEmbedding(t *testing.T) {
	const vocab, T, D = 7, 5, 6
	m := mustModel(t, NewNamedSequential(
		Child{"wte", &Embedding{Num: vocab, Dim: D}},
		Child{"wpe", &PositionEmbedding{T: T + 2, Dim: D}}, // a table longer than the input
		Child{"head", &Dense{In: D, Out: vocab}},
	), Shape{T}, NextTokenCrossEntropy{})
	r := rand.New(rand.NewPCG(16, 1))
	n := 4
	x := randTokens(r, n*T, vocab)
	x[0], x[1] = 2, 2 // a repeated id: its gradient rows add up
	gradCheckXY(t, m, x, randTargets(r, m, n), 40, r)
}

func TestGradAttention(t *testing.T) {
	m := mustModel(t, NewNamedSequential(
		Child{"in", &Dense{In: 3, Out: 8}},
		Child{"attn", &CausalSelfAttention{Dim: 8, Heads: 2}},
		Child{"out", &Dense{In: 8, Out: 5}},
	), Shape{6, 3}, NextTokenCrossEntropy{})
	want := "in.weight[8 3] in.bias[8] attn.c_attn.weight[24 8] attn.c_attn.bias[24] attn.c_proj.weight[8 8] attn.c_proj.bias[8] out.weight[5 8] out.bias[5]"
	if got := viewNames(m, true); got != want {
		t.Fatalf("names %s, want %s", got, want)
	}
	gradCheck(t, m, 3, 40, 17)
}

func TestGradDropout(t *testing.T) {
	drop := &Dropout{P: 0.5}
	m := mustModel(t, NewSequential(&Dense{In: 6, Out: 10}, drop, &Dense{In: 10, Out: 3}), Shape{6}, nil)
	m.SetStep(7)
	gradCheck(t, m, 4, 40, 18)

	r := rand.New(rand.NewPCG(19, 1))
	x := randInput(r, 4*6)
	masks := func(step uint64) string {
		m.SetStep(step)
		m.ForwardBackward(x, []int32{0, 1, 2, 0})
		return fmt.Sprint(drop.mask)
	}
	a, b, c := masks(3), masks(3), masks(4)
	if a != b || a == c {
		t.Fatal("a step's dropout mask must depend on the step alone")
	}
	if !strings.Contains(a, "0 ") || !strings.Contains(a, "2 ") {
		t.Fatalf("mask %s: want zeros and 1/(1−p) = 2", a)
	}
	// Evaluation is the identity.
	m.Forward(x, 4)
	if y := drop.Forward(device.Default(), x[:10], 1); &y[0] != &x[0] {
		t.Fatal("dropout at evaluation must pass its input through")
	}
}

func TestTransformerShapeErrors(t *testing.T) {
	for _, c := range []struct {
		root Layer
		in   Shape
		want string
	}{
		{&CausalSelfAttention{Dim: 6, Heads: 4}, Shape{3, 6}, "heads must divide"},
		{&CausalSelfAttention{Dim: 6, Heads: 2}, Shape{3, 4}, "[T, 6] input, got [3 4]"},
		{NewSequential(&Embedding{Num: 5, Dim: 2}, &PositionEmbedding{T: 3, Dim: 2}), Shape{4}, "[t ≤ 3, 2] input, got [4 2]"},
		{&LayerNorm{Dim: 4}, Shape{2, 3}, "LayerNorm(4) needs input [..., 4], got [2 3]"},
		{&Dropout{P: 1}, Shape{2}, "0 ≤ p < 1"},
	} {
		_, err := NewModel(c.root, c.in, NextTokenCrossEntropy{}, 1)
		if !errors.Is(err, ErrShape) || !strings.Contains(fmt.Sprint(err), c.want) {
			t.Errorf("err = %v, want ErrShape naming %q", err, c.want)
		}
	}
}
