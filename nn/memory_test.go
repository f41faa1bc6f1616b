package nn

import (
	"math/rand/v2"
	"testing"

	"github.com/starling-ml/starling/device"
	"github.com/starling-ml/starling/device/devicetest"
)

// TestTensorsLiveInBackendMemory: on a backend with memory of its own,
// every buffer a model hands a kernel (parameters, gradients, optimiser
// state, activations, scratch, the staged batch and targets) comes from
// the backend, the optimiser syncs after each step for the host's reads,
// and training computes exactly what it computes on the backend alone.
func TestTensorsLiveInBackendMemory(t *testing.T) {
	for _, c := range []struct {
		name  string
		build func(opts ...Option) (*Model, error)
		input func(r *rand.Rand, n int, m *Model) []float32
	}{
		{"mlp", func(o ...Option) (*Model, error) { return New("mlp:784-16-10", 3, o...) }, nil},
		{"cnn", func(o ...Option) (*Model, error) { return New("cnn", 3, o...) }, nil},
		{"charlm", func(o ...Option) (*Model, error) {
			return NewCharLM(CharLMConfig{Vocab: 11, Context: 6, Dim: 8, Heads: 2, Layers: 2, MLPRatio: 2, Dropout: 0.1}, 5, o...)
		}, func(r *rand.Rand, n int, _ *Model) []float32 { return randTokens(r, n*6, 11) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			inner := device.NewFast()
			tr := devicetest.NewTracked(inner)
			run := func(be device.Backend) (*Model, float64) {
				m, err := c.build(WithBackend(be))
				if err != nil {
					t.Fatal(err)
				}
				opt := NewAdam(AdamConfig{Decoupled: true, WeightDecay: 0.1}, WithBackend(be))
				r := rand.New(rand.NewPCG(7, 1))
				var loss float64
				for range 3 {
					const n = 2
					x := randInput(r, n*m.Input.Size())
					if c.input != nil {
						x = c.input(r, n, m)
					}
					loss, _ = m.ForwardBackward(x, randTargets(r, m, n))
					ClipGlobalNorm(be, m.Grads, 1)
					opt.Step(m.Params, m.Grads, 1e-3)
				}
				x := randInput(r, 4*m.Input.Size())
				if c.input != nil {
					x = c.input(r, 4, m)
				}
				l, _ := m.Evaluate(x, randTargets(r, m, 4), 2)
				return m, loss + l
			}
			ref, refLoss := run(inner)
			m, loss := run(tr)
			if v := tr.Violations(); len(v) > 0 {
				t.Fatalf("%d kernel calls were handed host memory, first: %v", len(v), v)
			}
			if tr.Calls() == 0 || tr.Syncs() < 3 {
				t.Fatalf("%d kernel calls, %d syncs: the tracked backend was not used", tr.Calls(), tr.Syncs())
			}
			if loss != refLoss || !equalF(m.Params, ref.Params) {
				t.Fatalf("loss %v vs %v alone, same parameters %v", loss, refLoss, equalF(m.Params, ref.Params))
			}
		})
	}
}

// TestStagesLiveInBackendMemory: a pipeline stage stages the activations
// and gradients it receives from its neighbours into the backend's memory.
func TestStagesLiveInBackendMemory(t *testing.T) {
	tr := devicetest.NewTracked(device.NewFast())
	m, err := New("mlp:784-16-16-10", 3, WithBackend(tr))
	if err != nil {
		t.Fatal(err)
	}
	stages, err := m.Stages(2)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(8, 1))
	const n = 3
	a := randInput(r, n*m.Input.Size())
	for _, s := range stages {
		// What a stage receives from its neighbour is a host copy.
		a = s.Forward(append([]float32(nil), a...), n, true, 0)
	}
	_, _, dy := stages[1].Loss(a, randTargets(r, m, n), 1)
	stages[0].Backward(append([]float32(nil), stages[1].Backward(dy, n)...), n)
	if v := tr.Violations(); len(v) > 0 || tr.Calls() == 0 {
		t.Fatalf("%d calls; handed host memory: %v", tr.Calls(), v)
	}
}
