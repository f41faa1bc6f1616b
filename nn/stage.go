package nn

import (
	"errors"
	"fmt"
	"math"

	"github.com/starling-ml/starling/device"
)

// ErrStages reports a split of a model into pipeline stages that cannot
// be made: more stages than the model has units, or bounds out of order.
var ErrStages = errors.New("nn: bad pipeline split")

// Units returns the layers a pipeline may cut between: the model's root
// with every Sequential flattened into its (fused) children, in the order
// Forward runs them. For the CharLM that is wte, wpe, each block's two
// residual branches, ln_f and lm_head; for an MLP its Dense layers.
func (m *Model) Units() []Layer {
	var us []unit
	us = flatten(m.root, m.Input, us)
	out := make([]Layer, len(us))
	for i, u := range us {
		out[i] = u.l
	}
	return out
}

// unit is one of Units with the per-sample shape of its input.
type unit struct {
	l  Layer
	in Shape
}

func flatten(l Layer, in Shape, out []unit) []unit {
	s, ok := l.(*Sequential)
	if !ok {
		return append(out, unit{l, in})
	}
	for i, c := range s.run {
		out = flatten(c, s.ins[i], out)
	}
	return out
}

// unitCost is the cost Stages balances: a unit's forward FLOPs per
// sample, plus one so that units without GEMMs (LayerNorm, embeddings)
// still count.
func unitCost(l Layer) float64 {
	f := 1.0
	for _, nd := range walk(l, "", nil) {
		if fl, ok := nd.l.(flopser); ok {
			f += fl.flops()
		}
	}
	return f
}

// Partition splits len(cost) units into k contiguous non-empty parts with
// the least maximum part cost (ties: the earliest cut that achieves it)
// and returns the k+1 bounds: part i is units [b[i], b[i+1]). It is pure.
func Partition(cost []float64, k int) ([]int, error) {
	n := len(cost)
	if k < 1 || k > n {
		return nil, fmt.Errorf("%w: %d stages for a model of %d layers (want 1 to %d)", ErrStages, k, n, n)
	}
	pre := make([]float64, n+1)
	for i, c := range cost {
		pre[i+1] = pre[i] + c
	}
	// best[j][i]: least max cost of units [0, i) in j parts; cut[j][i]
	// where the last part starts.
	best := make([][]float64, k+1)
	cut := make([][]int, k+1)
	for j := range best {
		best[j] = make([]float64, n+1)
		cut[j] = make([]int, n+1)
		for i := range best[j] {
			best[j][i] = math.Inf(1)
		}
	}
	best[0][0] = 0
	for j := 1; j <= k; j++ {
		for i := j; i <= n; i++ {
			for s := j - 1; s < i; s++ {
				c := max(best[j-1][s], pre[i]-pre[s])
				if c < best[j][i] {
					best[j][i], cut[j][i] = c, s
				}
			}
		}
	}
	b := make([]int, k+1)
	b[k] = n
	for j := k; j > 0; j-- {
		b[j-1] = cut[j][b[j]]
	}
	return b, nil
}

// Stage is a contiguous run of a model's units that one pipeline peer
// computes: its own slices of the model's Params and Grads, a Forward
// from an input activation to an output one, and a Backward from the
// output's gradient to the input's. The first stage reads the model's
// input; the last one's output is the logits, which Loss scores. A stage
// keeps one micro-batch's activations (those of its latest Forward): to
// run Backward for another micro-batch, run Forward on its input again.
// Not safe for concurrent use; stages of one model may run concurrently
// (their layers and parameter slices are disjoint) except that Loss uses
// the model's loss buffer.
type Stage struct {
	// Index is the stage's place in the pipeline, Count the stages.
	Index, Count int
	// Lo and Hi bound the stage's units in Model.Units.
	Lo, Hi int
	// In and Out are the per-sample shapes of the input and output
	// activations.
	In, Out Shape
	// Params and Grads alias the model's vectors: [Offset, Offset+len).
	Params, Grads []float32
	Offset        int

	m      *Model
	in, dy []float32 // the activations received, in the backend's memory (device.Stage)
	layers []Layer
	stoch  []stochastic
	probs  []float32
}

// Stages splits the model into k stages of about equal forward FLOPs.
// Errors wrap ErrStages (k larger than the model's units, or below 1).
func (m *Model) Stages(k int) ([]*Stage, error) {
	units := m.Units()
	cost := make([]float64, len(units))
	for i, u := range units {
		cost[i] = unitCost(u)
	}
	b, err := Partition(cost, k)
	if err != nil {
		return nil, fmt.Errorf("%w (%s)", err, m.Arch)
	}
	return m.StagesAt(b)
}

// StagesAt splits the model at the given unit bounds (0 = b[0] < b[1] <
// … < b[k] = len(Units())).
func (m *Model) StagesAt(b []int) ([]*Stage, error) {
	units := flatten(m.root, m.Input, nil)
	if len(b) < 2 || b[0] != 0 || b[len(b)-1] != len(units) {
		return nil, fmt.Errorf("%w: bounds %v must run from 0 to %d", ErrStages, b, len(units))
	}
	k := len(b) - 1
	stages := make([]*Stage, k)
	off := 0
	for i := range k {
		if b[i+1] <= b[i] {
			return nil, fmt.Errorf("%w: bounds %v are not increasing", ErrStages, b)
		}
		st := &Stage{Index: i, Count: k, Lo: b[i], Hi: b[i+1], In: units[b[i]].in, Out: m.Output, Offset: off, m: m}
		if b[i+1] < len(units) {
			st.Out = units[b[i+1]].in
		}
		size := 0
		for _, u := range units[b[i]:b[i+1]] {
			st.layers = append(st.layers, u.l)
			for _, nd := range walk(u.l, "", nil) {
				for _, p := range nd.specs {
					size += Shape(p.Shape).Size()
				}
				for _, s := range m.stoch {
					if l, ok := nd.l.(Stochastic); ok && l == s.l {
						st.stoch = append(st.stoch, s)
					}
				}
			}
		}
		st.Params, st.Grads = m.Params[off:off+size], m.Grads[off:off+size]
		off += size
		stages[i] = st
	}
	if off != len(m.Params) {
		return nil, fmt.Errorf("%w: %s: the units hold %d parameters, the model %d", ErrStages, m.Arch, off, len(m.Params))
	}
	return stages, nil
}

// First reports whether the stage reads the model's input.
func (s *Stage) First() bool { return s.Index == 0 }

// Last reports whether the stage computes the logits.
func (s *Stage) Last() bool { return s.Index == s.Count-1 }

// Model returns the model the stage is part of.
func (s *Stage) Model() *Model { return s.m }

// Forward runs n samples x (n×In.Size() values) through the stage and
// returns its output (n×Out.Size()), owned by the stage and valid until
// the next Forward. In training, stochastic layers draw from a seed
// derived from draw (say, the step and micro-batch), so that running the
// same micro-batch again repeats its randomness.
func (s *Stage) Forward(x []float32, n int, training bool, draw uint64) []float32 {
	if len(x) < n*s.In.Size() {
		panic(fmt.Sprintf("nn: Stage.Forward: %d values for %d samples of %d", len(x), n, s.In.Size()))
	}
	for _, st := range s.stoch {
		st.l.SetTraining(training, device.Hash64(st.seed, draw))
	}
	x = device.Stage(s.m.be, &s.in, x[:n*s.In.Size()])
	for _, l := range s.layers {
		x = l.Forward(s.m.be, x, n)
	}
	return x
}

// Backward takes the gradient dy of the latest Forward's output (it may be
// overwritten) and writes the stage's parameter gradients into Grads
// (overwriting them); it returns the gradient of the input, owned by the
// stage, or nil for the first stage.
func (s *Stage) Backward(dy []float32, n int) []float32 {
	dy = device.Stage(s.m.be, &s.dy, dy)
	for i := len(s.layers) - 1; i >= 0; i-- {
		dy = s.layers[i].Backward(s.m.be, dy, n, i > 0 || !s.First())
	}
	if s.First() {
		return nil
	}
	return dy[:n*s.In.Size()]
}

// Loss scores the last stage's output logits against targets y and
// returns the mean loss, the correct predictions, and the gradient of
// scale × the mean loss with respect to the logits (owned by the stage,
// valid until the next Loss). It panics on a target outside [0, Classes).
func (s *Stage) Loss(logits []float32, y []int32, scale float32) (loss float64, correct int, dlogits []float32) {
	m := s.m
	m.samples(y)
	s.probs = grow(m.be, s.probs, len(y)*m.Classes)
	loss, correct = m.loss.Loss(m.be, s.probs, logits, device.StageInt32(m.be, &m.targetBuf, y), m.Classes)
	if scale != 1 {
		m.be.Scale(scale, s.probs)
	}
	return loss, correct, s.probs
}

// Targets returns the number of targets per sample.
func (m *Model) Targets() int { return m.targets }
