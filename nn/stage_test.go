package nn

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestPartition(t *testing.T) {
	for _, tc := range []struct {
		cost []float64
		k    int
		want []int
	}{
		{[]float64{1, 1, 1, 1}, 2, []int{0, 2, 4}},
		{[]float64{1, 1, 1, 1}, 4, []int{0, 1, 2, 3, 4}},
		{[]float64{1, 1, 1, 1}, 1, []int{0, 4}},
		{[]float64{10, 1, 1, 1}, 2, []int{0, 1, 4}},
		{[]float64{1, 1, 1, 9}, 2, []int{0, 3, 4}},
		{[]float64{1, 2, 3, 4, 5, 6}, 3, []int{0, 3, 5, 6}},
		{[]float64{1, 25, 33, 25, 33, 2}, 2, []int{0, 3, 6}},
	} {
		got, err := Partition(tc.cost, tc.k)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("Partition(%v, %d) = %v, %v; want %v", tc.cost, tc.k, got, err, tc.want)
		}
	}
	for _, k := range []int{0, 5} {
		if _, err := Partition([]float64{1, 1, 1, 1}, k); !errors.Is(err, ErrStages) {
			t.Errorf("Partition(4 units, %d) = %v, want ErrStages", k, err)
		}
	}
}

func TestStagesTooMany(t *testing.T) {
	m, err := NewMLP([]int{6, 5, 4, 3}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(m.Units()); n != 3 {
		t.Fatalf("MLP units = %d, want 3 (ReLUs fused)", n)
	}
	_, err = m.Stages(4)
	if !errors.Is(err, ErrStages) {
		t.Fatalf("Stages(4) of a 3-layer MLP = %v, want ErrStages", err)
	}
	t.Log(err)
}

func TestCharLMUnits(t *testing.T) {
	m := tinyCharLM(t, 0)
	var kinds []string
	for _, u := range m.Units() {
		kinds = append(kinds, u.Kind())
	}
	want := []string{"Embedding", "PositionEmbedding", "Residual", "Residual", "Residual", "Residual", "LayerNorm", "Linear"}
	if !slices.Equal(kinds, want) {
		t.Fatalf("units %v, want %v", kinds, want)
	}
}

// TestStagesMatchModel runs a batch through the stages one micro-batch at
// a time, accumulating gradients as a pipeline does, and checks the
// logits, the loss and every gradient against the whole model's.
func TestStagesMatchModel(t *testing.T) {
	build := map[string]func() (*Model, error){
		"mlp": func() (*Model, error) { return NewMLP([]int{7, 6, 5, 4}, 3) },
		"charlm": func() (*Model, error) {
			return NewCharLM(CharLMConfig{Vocab: 11, Context: 6, Dim: 8, Heads: 2, Layers: 2, MLPRatio: 2}, 5)
		},
	}
	for name, f := range build {
		for k := 1; k <= 3; k++ {
			for _, micro := range []int{1, 2, 4} {
				t.Run(fmt.Sprintf("%s/k=%d/m=%d", name, k, micro), func(t *testing.T) {
					checkStages(t, f, k, micro)
				})
			}
		}
	}
}

func checkStages(t *testing.T, build func() (*Model, error), k, micro int) {
	ref, err := build()
	if err != nil {
		t.Fatal(err)
	}
	m, err := build()
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(uint64(k), uint64(micro)))
	n := 5
	var x []float32
	if _, ok := m.loss.(NextTokenCrossEntropy); ok {
		x = randTokens(r, n*m.Input.Size(), m.Classes)
	} else {
		x = make([]float32, n*m.Input.Size())
		for i := range x {
			x[i] = float32(r.NormFloat64())
		}
	}
	y := randTargets(r, m, n)
	wantLoss, _ := ref.ForwardBackward(x, y)

	stages, err := m.Stages(k)
	if err != nil {
		t.Fatal(err)
	}
	if stages[0].In.Size() != m.Input.Size() || !slices.Equal(stages[k-1].Out, m.Output) {
		t.Fatalf("stage shapes %v … %v, model %v … %v", stages[0].In, stages[k-1].Out, m.Input, m.Output)
	}
	acc := make([]float32, len(m.Grads))
	var loss float64
	d, tg := m.Input.Size(), m.targets
	for mb := range micro {
		lo, hi := mb*n/micro, (mb+1)*n/micro
		if lo == hi {
			continue
		}
		nb := hi - lo
		a := x[lo*d : hi*d]
		for _, s := range stages {
			a = s.Forward(a, nb, true, 0)
		}
		l, _, dy := stages[k-1].Loss(a, y[lo*tg:hi*tg], float32(nb)/float32(n))
		loss += l * float64(nb) / float64(n)
		for i := k - 1; i >= 0; i-- {
			dy = stages[i].Backward(dy, nb)
		}
		if dy != nil {
			t.Fatal("the first stage returned an input gradient")
		}
		for i, g := range m.Grads {
			acc[i] += g
		}
	}
	if math.Abs(loss-wantLoss) > 1e-5 {
		t.Errorf("loss %v, whole model %v", loss, wantLoss)
	}
	for i := range acc {
		if d := math.Abs(float64(acc[i] - ref.Grads[i])); d > 1e-5 {
			t.Fatalf("grad %d (%s…): stages %v, whole model %v (diff %g)", i, viewOf(m, i), acc[i], ref.Grads[i], d)
		}
	}
}

func viewOf(m *Model, i int) string {
	for _, v := range m.Views() {
		if i >= v.Offset && i < v.Offset+v.Len {
			return v.Name
		}
	}
	return "?"
}
