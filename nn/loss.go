package nn

import (
	"fmt"

	"github.com/starling-ml/starling/device"
)

// Loss turns a model's logits and integer targets into a scalar loss and
// its gradient.
type Loss interface {
	// Targets returns how many targets one sample whose output has shape
	// out carries, or an error wrapping ErrShape if the loss does not apply
	// to that shape.
	Targets(out Shape) (int, error)
	// Loss returns the mean loss over the targets y (len(y) rows of
	// classes logits each, every target in [0, classes)) and the number of
	// rows whose largest logit is the target, and writes dL/dlogits into
	// grad (which may alias logits).
	Loss(be device.Backend, grad, logits []float32, y []int32, classes int) (loss float64, correct int)
}

// CrossEntropy is the softmax cross-entropy of classification: one label
// per sample, over a model output of [classes] logits
// (torch.nn.CrossEntropyLoss with mean reduction).
type CrossEntropy struct{}

// Targets implements Loss.
func (CrossEntropy) Targets(out Shape) (int, error) {
	if len(out) != 1 {
		return 0, fmt.Errorf("%w: CrossEntropy needs [classes] logits per sample, got %v", ErrShape, out)
	}
	return 1, nil
}

// Loss implements Loss.
func (CrossEntropy) Loss(be device.Backend, grad, logits []float32, y []int32, classes int) (float64, int) {
	return be.SoftmaxXent(grad, logits, y, len(y), classes)
}

// NextTokenCrossEntropy is the softmax cross-entropy of sequence models: a
// model output of [T, vocab] logits per sample, one target per position,
// the mean over every position of every sample (what minGPT computes with
// F.cross_entropy over the flattened logits). Correct predictions count
// positions.
type NextTokenCrossEntropy struct{}

// Targets implements Loss.
func (NextTokenCrossEntropy) Targets(out Shape) (int, error) {
	if len(out) != 2 {
		return 0, fmt.Errorf("%w: NextTokenCrossEntropy needs [T, vocab] logits per sample, got %v", ErrShape, out)
	}
	return out[0], nil
}

// Loss implements Loss.
func (NextTokenCrossEntropy) Loss(be device.Backend, grad, logits []float32, y []int32, classes int) (float64, int) {
	return be.SoftmaxXent(grad, logits, y, len(y), classes)
}
