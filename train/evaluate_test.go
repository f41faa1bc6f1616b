package train

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/starling-ml/starling/data"
	"github.com/starling-ml/starling/nn"
)

// TestEvaluateDataset: a view of a Set, copied a batch at a time, scores
// what the Set scores in place.
func TestEvaluateDataset(t *testing.T) {
	_, te := mnist(t)
	set := te.Head(2500)
	m, err := nn.New("mlp:784-32-10", 3)
	if err != nil {
		t.Fatal(err)
	}
	wantLoss, wantAcc := Evaluate(m, set)
	idx := make([]int, set.Len())
	for i := range idx {
		idx[i] = i
	}
	loss, acc := Evaluate(m, data.Subset(set, idx))
	if math.Abs(loss-wantLoss) > 1e-9*wantLoss || acc != wantAcc {
		t.Fatalf("view: loss %v acc %v, set: loss %v acc %v", loss, acc, wantLoss, wantAcc)
	}
	if l, a := Evaluate(m, data.Head(data.Subset(set, idx), 0)); l != loss || a != acc {
		t.Fatalf("Head(view, 0) is the view: %v %v", l, a)
	}
}

// tinyText is a next-token dataset a small CharLM learns in a few dozen
// steps: a repeating sequence of 7 tokens.
func tinyText(t *testing.T, n, seq int) *data.Windows {
	t.Helper()
	tok := make([]int32, n)
	for i := range tok {
		tok[i] = int32([]int{1, 2, 3, 1, 4, 5, 6}[i%7])
	}
	w, err := data.NewWindows(tok, 8, seq, 0)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func tinyLM(seed uint64) (*nn.Model, error) {
	return nn.NewCharLM(nn.CharLMConfig{Vocab: 8, Context: 8, Dim: 16, Heads: 2, Layers: 1, MLPRatio: 2}, seed)
}

// TestLocalCharLM trains a tiny CharLM on windows for a step budget,
// evaluating a spread subset periodically: the summary reports tokens a
// second and bits per character, and the curve has every evaluation.
func TestLocalCharLM(t *testing.T) {
	tr, val := tinyText(t, 20000, 8), tinyText(t, 800, 8)
	cfg := LocalConfig{Steps: 60, Batch: 16, LR: 0.01, Optimizer: "adamw", Schedule: "warmup:5+cosine", ClipNorm: 1,
		Seed: 1, EvalEvery: 20, EvalSamples: 10}
	var evals int
	_, sum, err := Local(context.Background(), cfg, tr, val, func(p Progress) {
		if p.Evaluated {
			evals++
		}
	}, WithModel(tinyLM))
	if err != nil {
		t.Fatal(err)
	}
	if sum.Steps != 60 || evals != 3 || len(sum.Curve) != 4 || !sum.Curve[0].Subset || sum.Curve[3].Subset {
		t.Fatalf("steps %d, %d evaluations, curve %+v", sum.Steps, evals, sum.Curve)
	}
	if sum.TokensPerSec <= 0 || sum.TokensPerSec != sum.SamplesPerSec*8 {
		t.Errorf("tokens/s %v, samples/s %v", sum.TokensPerSec, sum.SamplesPerSec)
	}
	if want := sum.TestLoss / math.Ln2; sum.ValBitsPerChar != want || sum.Curve[3].BitsPerChar != want {
		t.Errorf("bits per char %v (curve %v), want %v", sum.ValBitsPerChar, sum.Curve[3].BitsPerChar, want)
	}
	// log2(6 tokens) ≈ 2.6 bits untrained; the sequence is deterministic
	// after two tokens.
	if sum.ValBitsPerChar > 1 {
		t.Errorf("validation %.3f bits per char after 60 steps", sum.ValBitsPerChar)
	}
}

// TestLocalModelMustFit: a model whose input or targets do not fit the
// data is refused before training.
func TestLocalModelMustFit(t *testing.T) {
	tr := tinyText(t, 400, 4) // windows of 4; the model takes 8
	cfg := LocalConfig{Steps: 1, Batch: 4, LR: 0.01, Optimizer: "adamw", Schedule: "constant"}
	if _, _, err := Local(context.Background(), cfg, tr, nil, nil, WithModel(tinyLM)); err == nil {
		t.Fatal("a CharLM of context 8 trained on windows of 4")
	}
	if _, err := NewWorker(DefaultWorkerConfig(), tr); err == nil {
		t.Fatal("an MNIST MLP trained on text windows")
	}
}

// TestHorizon: without a step bound, the horizon is the steps the
// duration holds at the pace so far.
func TestHorizon(t *testing.T) {
	h := horizon{duration: 10 * time.Second}
	if h.total() != unknownHorizon || h.estimate(19, time.Second) {
		t.Fatalf("before calibration: horizon %d", h.total())
	}
	if !h.estimate(20, time.Second) || h.total() != 200 {
		t.Fatalf("20 steps in 1 s of 10: horizon %d, want 200", h.total())
	}
	if !h.estimate(100, 2*time.Second) || h.total() != 500 {
		t.Fatalf("100 steps in 2 s: horizon %d, want 500", h.total())
	}
	if h.over(499, 9*time.Second) || !h.over(500, 9*time.Second) || !h.over(10, 10*time.Second) {
		t.Fatal("over: wrong bound")
	}
	fixed := horizon{steps: 50, duration: time.Second}
	if fixed.estimate(20, time.Millisecond) || fixed.total() != 50 || !fixed.over(3, time.Second) {
		t.Fatal("a step bound is the horizon; the duration still ends the run")
	}
}
