package train

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/starling-ml/starling/data"
	"github.com/starling-ml/starling/internal/ctxtime"
	"github.com/starling-ml/starling/nn"
)

// WorkerConfig configures one peer's local trainer.
type WorkerConfig struct {
	Model       string  // nn.New architecture
	Batch       int     // samples per local step
	LR          float32 // learning rate (peak, when a schedule is set)
	Optimizer   string  // sgd, momentum, nesterov, adam, adamw
	Schedule    string  // constant (default), cosine, step, warmup:N+…
	TotalSteps  int     // horizon for the schedule (0: constant)
	WeightDecay float32
	ClipNorm    float64 // 0: off
	// ModelSeed initialises the model. Peers that must start from the same
	// model share it.
	ModelSeed uint64
	// DataSeed orders this worker's batches; peers should differ.
	DataSeed uint64
	// Slowdown makes the worker that many times slower than the machine:
	// after each step it waits (Slowdown−1)× the step's compute time,
	// counting at most slowCap× the usual step (a step stretched by a
	// pause of the process is not multiplied). 0 or 1 is full speed. It
	// emulates stragglers in experiments.
	Slowdown float64
}

// DefaultWorkerConfig returns settings that suit FedAvg's 2NN on MNIST.
func DefaultWorkerConfig() WorkerConfig {
	return WorkerConfig{Model: "mlp", Batch: 64, LR: 0.05, Optimizer: "momentum", Schedule: "constant", ModelSeed: 1, DataSeed: 1}
}

// Validate reports settings that cannot work.
func (c WorkerConfig) Validate() error {
	switch {
	case c.Batch <= 0:
		return fmt.Errorf("train: batch must be positive, got %d", c.Batch)
	case !(c.LR > 0) || math.IsInf(float64(c.LR), 0):
		return fmt.Errorf("train: learning rate must be positive and finite, got %v", c.LR)
	case c.WeightDecay < 0, c.ClipNorm < 0, c.Slowdown < 0, c.TotalSteps < 0:
		return fmt.Errorf("train: weight decay, clip norm, slowdown and total steps must not be negative")
	}
	return nil
}

// Worker is one peer's local trainer: a model, its optimiser, a schedule
// and an iterator over the peer's data shard. It is the piece every
// strategy (sync, federated, gossip, async) shares. Not safe for
// concurrent use.
type Worker struct {
	Model *nn.Model
	Opt   nn.Optimizer
	Sched nn.Schedule
	cfg   WorkerConfig
	it    *data.Iterator
	shard data.Dataset
	build ModelFunc

	// Steps counts optimiser steps taken; Samples the samples trained on.
	Steps, Samples int
	// Compute is the time spent computing (without Slowdown waits).
	Compute time.Duration
	// usual is the running mean of a step's compute time (Slowdown).
	usual time.Duration
	// stepTime, if > 0, is how long a step takes in all, Slowdown times:
	// tests set it (SetStepTime) to pace peers in a synctest bubble, where
	// computing takes no time.
	stepTime time.Duration
}

// ModelFunc builds a model initialised from seed. The same seed must give
// the same model: peers that start from one model share the seed.
type ModelFunc func(seed uint64) (*nn.Model, error)

// Arch returns the ModelFunc of an nn.New architecture (the MNIST-shaped
// built-in models: "logreg", "mlp", "mlp:784-…-10", "cnn").
func Arch(arch string) ModelFunc {
	return func(seed uint64) (*nn.Model, error) { return nn.New(arch, seed) }
}

// WorkerOption is an extra of NewWorker and Local.
type WorkerOption func(*workerOptions)

type workerOptions struct{ build ModelFunc }

// WithModel builds the model with f instead of nn.New(cfg.Model): a model
// whose shape comes from its data, such as a workload's.
func WithModel(f ModelFunc) WorkerOption { return func(o *workerOptions) { o.build = f } }

func resolveWorker(model string, opts []WorkerOption) ModelFunc {
	var o workerOptions
	for _, f := range opts {
		f(&o)
	}
	if o.build == nil {
		return Arch(model)
	}
	return o.build
}

// NewWorker builds a worker training on shard the model nn.New(cfg.Model,
// cfg.ModelSeed) builds, or WithModel's. The model must fit the shard: its
// input size, its targets per sample, and at least the shard's classes.
func NewWorker(cfg WorkerConfig, shard data.Dataset, opts ...WorkerOption) (*Worker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if shard == nil || shard.Len() == 0 {
		return nil, fmt.Errorf("train: worker has no data")
	}
	build := resolveWorker(cfg.Model, opts)
	m, err := build(cfg.ModelSeed)
	if err != nil {
		return nil, err
	}
	if err := fits(m, shard); err != nil {
		return nil, err
	}
	opt, err := nn.NewOptimizer(cfg.Optimizer, cfg.WeightDecay, nn.WithBackend(m.Backend()))
	if err != nil {
		return nil, err
	}
	spec := cfg.Schedule
	if spec == "" || cfg.TotalSteps == 0 {
		spec = "constant"
	}
	sched, err := nn.ParseSchedule(spec, cfg.LR, cfg.TotalSteps)
	if err != nil {
		return nil, err
	}
	return &Worker{Model: m, Opt: opt, Sched: sched, cfg: cfg, it: data.NewIterator(shard, cfg.Batch, cfg.DataSeed), shard: shard, build: build}, nil
}

// fits reports a model that cannot train on ds.
func fits(m *nn.Model, ds data.Dataset) error {
	if in := data.InputSize(ds); in != m.Input.Size() {
		return fmt.Errorf("train: model %s takes %d inputs, data has %d", m.Arch, m.Input.Size(), in)
	}
	targets, err := m.Loss().Targets(m.Output)
	if err != nil {
		return err
	}
	if targets != ds.Targets() {
		return fmt.Errorf("train: model %s scores %d targets a sample, data has %d", m.Arch, targets, ds.Targets())
	}
	if ds.NumClasses() > m.Classes {
		return fmt.Errorf("train: model %s has %d classes, data has %d", m.Arch, m.Classes, ds.NumClasses())
	}
	return nil
}

// NewModel builds another model of the worker's architecture, initialised
// from seed (an evaluator's copy, say).
func (w *Worker) NewModel(seed uint64) (*nn.Model, error) { return w.build(seed) }

// Config returns the worker's configuration.
func (w *Worker) Config() WorkerConfig { return w.cfg }

// ShardSize returns the number of samples the worker trains on.
func (w *Worker) ShardSize() int { return w.shard.Len() }

// StepsPerEpoch returns the number of batches in one pass over the shard.
func (w *Worker) StepsPerEpoch() int { return w.it.BatchesPerEpoch() }

// Grad computes the gradient of the next batch into Model.Grads (starting
// a new pass over the shard when one ends) and returns the batch's loss
// and size. It does not update the parameters.
func (w *Worker) Grad(ctx context.Context) (loss float64, n int, err error) {
	if err := ctx.Err(); err != nil {
		return 0, 0, err
	}
	if !w.it.Next() && !w.it.Next() {
		return 0, 0, fmt.Errorf("train: empty shard")
	}
	x, y := w.it.Batch()
	start := time.Now()
	loss, _ = w.Model.ForwardBackward(x, y)
	if math.IsNaN(loss) || math.IsInf(loss, 0) {
		return loss, len(y), fmt.Errorf("%w: loss is %v at local step %d", ErrDiverged, loss, w.Steps+1)
	}
	if w.cfg.ClipNorm > 0 {
		if g := nn.ClipGlobalNorm(w.Model.Backend(), w.Model.Grads, w.cfg.ClipNorm); math.IsNaN(g) || math.IsInf(g, 0) {
			return loss, len(y), fmt.Errorf("%w: gradient norm is %v at local step %d", ErrDiverged, g, w.Steps+1)
		}
	}
	el := time.Since(start)
	w.Compute += el
	if err := w.slow(ctx, el); err != nil {
		return loss, len(y), err
	}
	return loss, len(y), nil
}

// slow waits (Slowdown−1)× el to emulate a slower machine (see slowWait),
// or out the rest of max(1, Slowdown)× stepTime when that is set.
func (w *Worker) slow(ctx context.Context, el time.Duration) error {
	if w.stepTime > 0 {
		return ctxtime.Sleep(ctx, time.Duration(float64(w.stepTime)*max(w.cfg.Slowdown, 1))-el)
	}
	if w.cfg.Slowdown <= 1 {
		return nil
	}
	return ctxtime.Sleep(ctx, w.slowWait(el))
}

// slowCap bounds the step time Slowdown multiplies, in usual steps.
const slowCap = 4

// slowWait returns the wait after a step that computed for el: (Slowdown−1)
// times el, with el cut to slowCap× the running mean of the steps before
// it. Without the cut, a process stopped or starved for a second during
// one step (a preempted VM, SIGSTOP, a loaded machine) would then sleep
// Slowdown−1 seconds more, and a straggler experiment would measure that
// pause instead of the slowdown asked for. The mean takes in the cut
// times too, so it follows a machine that really becomes slower within
// a few dozen steps while a single outlier moves it little.
func (w *Worker) slowWait(el time.Duration) time.Duration {
	if w.usual > 0 {
		el = min(el, slowCap*w.usual)
		w.usual += (el - w.usual) / 16
	} else {
		w.usual = max(el, 1)
	}
	return time.Duration(float64(el) * (w.cfg.Slowdown - 1))
}

// Apply takes one optimiser step with the gradient in Model.Grads (as
// computed by Grad, or replaced by an aggregate of several peers').
func (w *Worker) Apply(samples int) {
	w.Opt.Step(w.Model.Params, w.Model.Grads, w.Sched.LR(w.Steps))
	w.Steps++
	w.Samples += samples
}

// Step computes a gradient and applies it: one step of local SGD.
func (w *Worker) Step(ctx context.Context) (loss float64, err error) {
	loss, n, err := w.Grad(ctx)
	if err != nil {
		return loss, err
	}
	w.Apply(n)
	return loss, nil
}

// LocalSteps runs k steps of local SGD and returns their mean loss and the
// number of samples they used.
func (w *Worker) LocalSteps(ctx context.Context, k int) (meanLoss float64, samples int, err error) {
	for i := 0; i < k; i++ {
		loss, n, err := w.Grad(ctx)
		if err != nil {
			return 0, samples, err
		}
		w.Apply(n)
		meanLoss += loss * float64(n)
		samples += n
	}
	if samples > 0 {
		meanLoss /= float64(samples)
	}
	return meanLoss, samples, nil
}

// Evaluate returns the model's mean loss and accuracy (per target: the
// next-token accuracy of a language model) on ds; see Evaluate.
func (w *Worker) Evaluate(ds data.Dataset) (loss, acc float64) {
	return Evaluate(w.Model, ds)
}
