package nn

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/starling-ml/starling/device"
)

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
	var names []string
	for _, v := range m.Views() {
		names = append(names, fmt.Sprintf("%s%v", v.Name, v.Shape))
	}
	want := "[in.weight[8 3] in.bias[8] attn.c_attn.weight[24 8] attn.c_attn.bias[24] attn.c_proj.weight[8 8] attn.c_proj.bias[8] out.weight[5 8] out.bias[5]]"
	if got := fmt.Sprint(names); got != want {
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
