package train

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/starling-ml/starling/data"
	"github.com/starling-ml/starling/nn"
)

// ErrDiverged reports a loss or gradient that stopped being finite.
var ErrDiverged = errors.New("train: training diverged")

// LocalConfig configures single-peer training. Training ends at the first
// of its bounds: Epochs, Steps, Duration (at least one must be set).
type LocalConfig struct {
	Model       string  // nn.New architecture (logreg, mlp, mlp:784-128-10, cnn) unless WithModel
	Epochs      int     // passes over the training set (0: no bound)
	Steps       int     // optimiser steps (0: no bound)
	Batch       int     // samples per step
	LR          float32 // peak learning rate
	Optimizer   string  // sgd, momentum, nesterov, adam, adamw
	Schedule    string  // constant, step[:E,G], cosine, warmup:N+…
	WeightDecay float32 // L2 (or decoupled for adamw)
	ClipNorm    float64 // clip gradients to this global norm; 0 disables
	Seed        uint64  // model init and data order
	EvalBatch   int     // samples per evaluation batch (0: EvalBatch of the test set)
	// Duration ends training after that much wall-clock time (0: no
	// bound). With neither Epochs nor Steps, the schedule's horizon is the
	// number of steps the duration holds at the pace so far, estimated
	// after 20 steps and again every 100, so that a cosine ends with the
	// time; training also ends when it reaches that horizon.
	Duration time.Duration
	// EvalEvery evaluates on the test set every that many steps, on
	// EvalSamples of its samples spread evenly over it (0: only after each
	// epoch and at the end, on all of it).
	EvalEvery   int
	EvalSamples int
}

// DefaultLocalConfig returns settings that train FedAvg's 2NN MLP to about
// 98% MNIST test accuracy in 5 epochs.
func DefaultLocalConfig() LocalConfig {
	return LocalConfig{
		Model:     "mlp",
		Epochs:    5,
		Batch:     64,
		LR:        0.05,
		Optimizer: "momentum",
		Schedule:  "cosine",
		Seed:      1,
	}
}

// Validate reports settings that cannot work.
func (c LocalConfig) Validate() error {
	switch {
	case c.Epochs < 0 || c.Steps < 0 || c.Duration < 0:
		return fmt.Errorf("train: epochs, steps and duration must not be negative")
	case c.Epochs == 0 && c.Steps == 0 && c.Duration == 0:
		return fmt.Errorf("train: epochs must be positive, got %d, unless steps or a duration bound training", c.Epochs)
	case c.Batch <= 0:
		return fmt.Errorf("train: batch must be positive, got %d", c.Batch)
	case !(c.LR > 0) || math.IsInf(float64(c.LR), 0):
		return fmt.Errorf("train: learning rate must be positive and finite, got %v", c.LR)
	case c.WeightDecay < 0:
		return fmt.Errorf("train: weight decay must not be negative, got %v", c.WeightDecay)
	case c.ClipNorm < 0:
		return fmt.Errorf("train: clip norm must not be negative, got %v", c.ClipNorm)
	case c.EvalEvery < 0 || c.EvalSamples < 0 || c.EvalBatch < 0:
		return fmt.Errorf("train: evaluation period, samples and batch must not be negative")
	}
	return nil
}

// Progress is a snapshot of a running training loop.
type Progress struct {
	Epoch, Epochs int     // current epoch (from 1) and total (0: no bound)
	Step, Steps   int     // steps done and the schedule's horizon
	Loss          float64 // running mean training loss of the epoch
	StepLoss      float64 // this step's training loss (per target), on a step's Progress
	Accuracy      float64 // running training accuracy of the epoch
	SamplesPerSec float64 // since the start
	TokensPerSec  float64 // targets trained on per second (SamplesPerSec × targets per sample)
	LR            float32
	Elapsed       time.Duration
	EpochDone     bool    // set on the last step of an epoch, and at the end
	TestAccuracy  float64 // set with EpochDone or Evaluated when a test set is given
	// Evaluated is set on a periodic evaluation (EvalEvery), whose loss
	// and accuracy on the evaluation subset are TestLoss and TestAccuracy.
	Evaluated bool
	TestLoss  float64
}

// EvalPoint is one evaluation of a run on its test set (or the periodic
// subset of it).
type EvalPoint struct {
	Step     int     `json:"step"`
	Seconds  float64 `json:"seconds"`
	Loss     float64 `json:"loss"`
	Accuracy float64 `json:"accuracy"`
	// BitsPerChar is Loss/ln 2, for next-token models (targets per sample
	// above one).
	BitsPerChar float64 `json:"bits_per_char,omitempty"`
	// Subset is set when the point was measured on the periodic subset.
	Subset bool `json:"subset,omitempty"`
}

// Summary describes a finished training run; cmd/peer writes it as JSON.
type Summary struct {
	Model         string  `json:"model"`
	Params        int     `json:"params"`
	Optimizer     string  `json:"optimizer"`
	Schedule      string  `json:"schedule"`
	Backend       string  `json:"backend"`
	Epochs        int     `json:"epochs"`
	Steps         int     `json:"steps"`
	Batch         int     `json:"batch"`
	TrainLoss     float64 `json:"train_loss"`
	TrainAccuracy float64 `json:"train_accuracy"`
	TestLoss      float64 `json:"test_loss"`
	TestAccuracy  float64 `json:"test_accuracy"`
	SamplesPerSec float64 `json:"samples_per_sec"`
	WallS         float64 `json:"wall_s"`
	Seed          uint64  `json:"seed"`
	// For next-token models: tokens (targets) trained on per second, and
	// the final test (validation) loss in bits per token, which is bits
	// per character at byte or character level.
	TokensPerSec   float64 `json:"tokens_per_sec,omitempty"`
	ValBitsPerChar float64 `json:"val_bits_per_char,omitempty"`
	// Curve holds every evaluation, in order.
	Curve []EvalPoint `json:"curve,omitempty"`
}

// Local trains a model on trainSet and evaluates it on testSet (which may
// be nil) after every epoch, every EvalEvery steps and at the end. The
// model is nn.New(cfg.Model, cfg.Seed), or WithModel's. progress, if not
// nil, is called after every step and every evaluation and must not
// block. It returns the model with the summary.
func Local(ctx context.Context, cfg LocalConfig, trainSet, testSet data.Dataset, progress func(Progress), opts ...WorkerOption) (*nn.Model, *Summary, error) {
	if err := cfg.Validate(); err != nil {
		return nil, nil, err
	}
	if isNil(testSet) {
		testSet = nil
	}
	m, err := resolveWorker(cfg.Model, opts)(cfg.Seed)
	if err != nil {
		return nil, nil, err
	}
	if err := fits(m, trainSet); err != nil {
		return nil, nil, err
	}
	opt, err := nn.NewOptimizer(cfg.Optimizer, cfg.WeightDecay, nn.WithBackend(m.Backend()))
	if err != nil {
		return nil, nil, err
	}
	it := data.NewIterator(trainSet, cfg.Batch, cfg.Seed)
	steps := 0 // the bound on steps, and the schedule's horizon (0: estimated)
	if cfg.Epochs > 0 {
		steps = it.BatchesPerEpoch() * cfg.Epochs
	}
	if cfg.Steps > 0 && (steps == 0 || cfg.Steps < steps) {
		steps = cfg.Steps
	}
	h := horizon{steps: steps, duration: cfg.Duration}
	sched, err := nn.ParseSchedule(cfg.Schedule, cfg.LR, h.total())
	if err != nil {
		return nil, nil, err
	}
	targets := trainSet.Targets()
	sum := &Summary{
		Model: m.Arch, Params: len(m.Params), Optimizer: opt.Name(), Schedule: sched.String(),
		Backend: m.Backend().Name(), Epochs: cfg.Epochs, Batch: cfg.Batch, Seed: cfg.Seed,
	}
	var evalSet data.Dataset
	subset := false
	if testSet != nil {
		evalSet = data.Spread(testSet, cfg.EvalSamples)
		subset = cfg.EvalSamples > 0 && cfg.EvalSamples < testSet.Len()
	}
	start := time.Now()
	point := func(step int, loss, acc float64, subset bool) EvalPoint {
		p := EvalPoint{Step: step, Seconds: time.Since(start).Seconds(), Loss: loss, Accuracy: acc, Subset: subset}
		if targets > 1 {
			p.BitsPerChar = BitsPerToken(loss)
		}
		sum.Curve = append(sum.Curve, p)
		return p
	}
	step, samples := 0, 0
	done := false
	for epoch := 1; !done && (cfg.Epochs == 0 || epoch <= cfg.Epochs); epoch++ {
		var lossSum float64
		seen, correct := 0, 0
		for it.Next() {
			if err := ctx.Err(); err != nil {
				return m, sum, err
			}
			x, y := it.Batch()
			loss, c := m.ForwardBackward(x, y)
			if math.IsNaN(loss) || math.IsInf(loss, 0) {
				return m, sum, fmt.Errorf("%w: loss is %v at step %d (epoch %d); lower --lr or set --clip", ErrDiverged, loss, step+1, epoch)
			}
			if cfg.ClipNorm > 0 {
				if n := nn.ClipGlobalNorm(m.Backend(), m.Grads, cfg.ClipNorm); math.IsNaN(n) || math.IsInf(n, 0) {
					return m, sum, fmt.Errorf("%w: gradient norm is %v at step %d (epoch %d)", ErrDiverged, n, step+1, epoch)
				}
			}
			lr := sched.LR(step)
			opt.Step(m.Params, m.Grads, lr)
			step++
			n := len(y) / targets
			samples += n
			seen += len(y)
			correct += c
			lossSum += loss * float64(len(y))
			el := time.Since(start)
			if progress != nil {
				progress(Progress{
					Epoch: epoch, Epochs: cfg.Epochs, Step: step, Steps: h.total(),
					Loss: lossSum / float64(seen), StepLoss: loss, Accuracy: float64(correct) / float64(seen),
					SamplesPerSec: float64(samples) / el.Seconds(), TokensPerSec: float64(samples*targets) / el.Seconds(), LR: lr, Elapsed: el,
				})
			}
			if cfg.EvalEvery > 0 && step%cfg.EvalEvery == 0 && evalSet != nil {
				l, a := evaluate(m, evalSet, cfg.EvalBatch)
				point(step, l, a, subset)
				if progress != nil {
					progress(Progress{Epoch: epoch, Epochs: cfg.Epochs, Step: step, Steps: h.total(), Elapsed: time.Since(start),
						Evaluated: true, TestLoss: l, TestAccuracy: a})
				}
			}
			if h.estimate(step, time.Since(start)) {
				if sched, err = nn.ParseSchedule(cfg.Schedule, cfg.LR, h.total()); err != nil {
					return m, sum, err
				}
			}
			if h.over(step, time.Since(start)) {
				done = true
				break
			}
		}
		// Per target: a sample's loss is the mean over its targets.
		sum.TrainLoss = lossSum / float64(max(seen, 1))
		sum.TrainAccuracy = float64(correct) / float64(max(seen, 1))
		trainTime := time.Since(start)
		if testSet != nil {
			sum.TestLoss, sum.TestAccuracy = evaluate(m, testSet, cfg.EvalBatch)
			point(step, sum.TestLoss, sum.TestAccuracy, false)
		}
		if progress != nil {
			progress(Progress{
				Epoch: epoch, Epochs: cfg.Epochs, Step: step, Steps: h.total(),
				Loss: sum.TrainLoss, Accuracy: sum.TrainAccuracy,
				SamplesPerSec: float64(samples) / trainTime.Seconds(), TokensPerSec: float64(samples*targets) / trainTime.Seconds(),
				Elapsed: time.Since(start), EpochDone: true, TestAccuracy: sum.TestAccuracy, TestLoss: sum.TestLoss,
			})
		}
	}
	sum.Steps = step
	sum.Schedule = sched.String()
	sum.WallS = time.Since(start).Seconds()
	sum.SamplesPerSec = float64(samples) / sum.WallS
	if targets > 1 {
		sum.TokensPerSec = sum.SamplesPerSec * float64(targets)
		if testSet != nil {
			sum.ValBitsPerChar = BitsPerToken(sum.TestLoss)
		}
	}
	return m, sum, nil
}

// isNil reports a nil Dataset, or a nil *data.Set in one.
func isNil(ds data.Dataset) bool {
	s, ok := ds.(*data.Set)
	return ds == nil || ok && s == nil
}

// horizon is a run's bound on steps and time, and the schedule's horizon:
// the step bound when there is one, else the steps the duration holds at
// the pace so far.
type horizon struct {
	steps    int           // the step bound (0: none)
	duration time.Duration // the time bound (0: none)
	guess    int           // the estimated horizon (steps == 0)
}

// Estimation of the horizon: after calibrateSteps steps, then every
// reestimateSteps.
const (
	calibrateSteps  = 20
	reestimateSteps = 100
	// unknownHorizon stands for the horizon before the first estimate:
	// long enough that a cosine has not begun to decay.
	unknownHorizon = 1 << 30
)

// total returns the schedule's horizon.
func (h *horizon) total() int {
	switch {
	case h.steps > 0:
		return h.steps
	case h.guess > 0:
		return h.guess
	}
	return unknownHorizon
}

// estimate re-estimates the horizon from the pace of step steps in el, if
// one is due; it reports whether the horizon changed.
func (h *horizon) estimate(step int, el time.Duration) bool {
	if h.steps > 0 || h.duration <= 0 || el <= 0 || (step != calibrateSteps && step%reestimateSteps != 0) {
		return false
	}
	rest := float64(h.duration-el) / float64(el) * float64(step)
	g := step + max(int(rest), 1)
	changed := g != h.guess
	h.guess = g
	return changed
}

// over reports whether training ends after step steps taking el.
func (h *horizon) over(step int, el time.Duration) bool {
	return (h.steps > 0 && step >= h.steps) || (h.duration > 0 && el >= h.duration) || (h.guess > 0 && step >= h.guess)
}
