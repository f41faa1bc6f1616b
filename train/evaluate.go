package train

import (
	"math"

	"github.com/starling-ml/starling/data"
	"github.com/starling-ml/starling/nn"
)

// evalTargets is about how many targets one evaluation batch holds: 1000
// samples of a classifier (as before Datasets), 32 windows of 128 tokens.
const evalTargets = 4096

// EvalBatch returns the samples per batch Evaluate uses on ds: 1000 when a
// sample has one target, else as many samples as hold about 4096 targets
// (at least one), which keeps a language model's [T, vocab] logits and
// T×T attention scores to tens of megabytes.
func EvalBatch(ds data.Dataset) int {
	if t := ds.Targets(); t > 1 {
		return max(1, evalTargets/t)
	}
	return 1000
}

// Evaluate returns m's mean loss over every target of ds and its accuracy
// (the share of targets predicted: next-token accuracy for a language
// model), in evaluation mode, in batches of EvalBatch(ds). A *data.Set is
// evaluated in place, as Model.Evaluate does; other datasets are copied
// a batch at a time. An empty ds gives (0, 0).
func Evaluate(m *nn.Model, ds data.Dataset) (loss, acc float64) { return evaluate(m, ds, 0) }

// evaluate is Evaluate in batches of the given size (0: EvalBatch(ds)).
func evaluate(m *nn.Model, ds data.Dataset, batch int) (loss, acc float64) {
	if batch <= 0 {
		batch = EvalBatch(ds)
	}
	if s, ok := ds.(*data.Set); ok {
		return m.Evaluate(s.X, s.Y, batch)
	}
	n, dim, t := ds.Len(), data.InputSize(ds), ds.Targets()
	if n == 0 {
		return 0, 0
	}
	batch = min(batch, n)
	x, y, idx := make([]float32, batch*dim), make([]int32, batch*t), make([]int, batch)
	var sum float64
	correct := 0
	for s := 0; s < n; s += batch {
		k := min(batch, n-s)
		for j := range k {
			idx[j] = s + j
		}
		ds.Batch(idx[:k], x[:k*dim], y[:k*t])
		l, a := m.Evaluate(x[:k*dim], y[:k*t], k)
		sum += l * float64(k*t)
		correct += int(math.Round(a * float64(k*t)))
	}
	return sum / float64(n*t), float64(correct) / float64(n*t)
}

// BitsPerToken converts a mean cross-entropy in nats to bits: loss/ln 2,
// the bits per character of a byte- or character-level language model.
func BitsPerToken(loss float64) float64 { return loss / math.Ln2 }
