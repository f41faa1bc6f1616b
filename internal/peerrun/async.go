package peerrun

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/starling-ml/starling/compression"
	"github.com/starling-ml/starling/nn"
	"github.com/starling-ml/starling/swarm"
	"github.com/starling-ml/starling/train"
)

func init() {
	RegisterMode("async", runAsync)
	RegisterMode("gossip", runGossip)
}

// AsyncOptions are the settings --mode async and --mode gossip read.
type AsyncOptions struct {
	// Async configures --mode async (FedAsync or FedBuff, Async.Mode).
	Async train.AsyncConfig
	// Gossip configures --mode gossip (AD-PSGD pairwise or SGP push-sum).
	Gossip train.GossipConfig
	// Steps ends training after that many local steps; Duration after that
	// much time. Either may be 0 (no limit), not both.
	Steps    int
	Duration time.Duration
	// EvalEvery evaluates on the test set, reports progress and writes the
	// checkpoint every that many local steps (checked at the strategy's
	// snapshots, every 250 ms at most) and at the end.
	EvalEvery int
}

// DefaultAsyncOptions returns train's defaults, 1000 steps, evaluating
// every 100.
func DefaultAsyncOptions() AsyncOptions {
	return AsyncOptions{Async: train.DefaultAsyncConfig(), Gossip: train.DefaultGossipConfig(), Steps: defaultSteps, EvalEvery: defaultEvalEvery}
}

func (o AsyncOptions) validate() error {
	switch {
	case o.Steps < 0 || o.Duration < 0:
		return fmt.Errorf("%w: --steps and --duration must not be negative", ErrUsage)
	case o.Steps == 0 && o.Duration == 0:
		return fmt.Errorf("%w: --steps 0 needs a --duration (training would never end)", ErrUsage)
	case o.EvalEvery <= 0:
		return fmt.Errorf("%w: --eval-every must be positive", ErrUsage)
	}
	return nil
}

// validateAsync checks the settings of --mode async and gossip before
// anything starts.
func (o *Options) validateAsync() error {
	var err error
	switch o.Mode {
	case "async":
		cfg := o.Async.Async
		cfg.Model, cfg.Codec = o.Swarm.Gossip.Model, compressOr(o.Compress, cfg.Codec)
		err = cfg.Validate()
	case "gossip":
		err = o.Async.Gossip.Validate()
	default:
		return nil
	}
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	return o.Async.validate()
}

// runAsync is --mode async: FedAsync (mix every fresh model in, weighted
// by its staleness) or FedBuff (apply after K buffered deltas).
func runAsync(ctx context.Context, env *Env) error {
	cfg := env.Opts.Async.Async
	cfg.Model, cfg.MaxSteps, cfg.Codec = env.Opts.Swarm.Gossip.Model, env.Opts.Async.Steps, compressOr(env.Opts.Compress, cfg.Codec)
	return runStreaming(ctx, env, cfg.Mode, func(ctx context.Context, net *swarm.StreamNet, ev *evaluator) (string, error) {
		sum, err := train.RunAsync(ctx, env.Worker, env.asyncNet(net), cfg, ev)
		if err != nil {
			return "", err
		}
		note := fmt.Sprintf("merged %d", sum.Merged)
		for _, r := range slices.Sorted(maps.Keys(sum.Drops)) {
			note += fmt.Sprintf(", dropped %d %s", sum.Drops[r], r)
		}
		return note, nil
	})
}

// runGossip is --mode gossip: continuous local SGD with gossip averaging
// among the peers live when training starts.
func runGossip(ctx context.Context, env *Env) error {
	cfg := env.Opts.Async.Gossip
	cfg.MaxSteps = env.Opts.Async.Steps
	// The group is fixed at start, in the same (sorted) order on every
	// peer: it decides AD-PSGD's roles and SGP's graph. A peer that dies
	// is skipped (Alive); one that joins later is not gossiped with.
	// Members are sorted by their text, which for Ed25519 IDs (all that
	// node/ runs) is also libp2p's order.
	group := env.Peer.Members()
	return runStreaming(ctx, env, cfg.Algorithm, func(ctx context.Context, net *swarm.StreamNet, ev *evaluator) (string, error) {
		sum, err := train.RunGossip(ctx, env.Worker, env.gossipNet(net), group, cfg, ev)
		if err != nil {
			return "", err
		}
		note := fmt.Sprintf("%d exchanges, %d failed, %d skipped", sum.Exchanges, sum.Failed, sum.Skipped)
		if sum.ServedS > 0 {
			note += fmt.Sprintf(", served the active peers %.1fs after the last step", sum.ServedS)
		}
		return note, nil
	})
}

// runStreaming runs one of the strategies that pull models over node/
// streams (their settings were checked by Options.Validate): it checks a
// resumed checkpoint's strategy, starts the transport, bounds the run by
// --duration, and reports the final model with run's note once the
// transport is closed (no exchange served for another peer touches the
// final model after that).
func runStreaming(ctx context.Context, env *Env, strategy string, run func(context.Context, *swarm.StreamNet, *evaluator) (string, error)) error {
	if ck := env.Checkpoint; ck != nil && ck.Strategy != strategy {
		return fmt.Errorf("%w: checkpoint is from strategy %q, this run is %s", train.ErrCheckpoint, ck.Strategy, strategy)
	}
	// A fetched vector is at most the model in fp32, plus room for a
	// codec's header.
	t, err := swarm.NewStreamTransport(env.Peer.Node, env.Opts.Swarm.Gossip.Model, 4*int64(len(env.Worker.Model.Params)+1024))
	if err != nil {
		return err
	}
	defer t.Close()
	if d := env.Opts.Async.Duration; d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	ev := newEvaluator(env, strategy, env.Opts.Async)
	note, err := run(ctx, &swarm.StreamNet{CP: env.Peer.Control, T: t}, ev)
	t.Close()
	if err != nil {
		return err
	}
	return ev.finish(note)
}

// evaluator is the Recorder of the asynchronous modes: it passes
// everything on to env.Recorder and, at the snapshot after every EvalEvery
// local steps, evaluates the snapshot on the test set, reports progress
// and writes the checkpoint. Snapshots come from the strategy's own
// goroutine between steps, so the optimiser state is read there safely;
// the parameters are the snapshot's copy.
type evaluator struct {
	train.Recorder
	env      *Env
	strategy string
	o        AsyncOptions

	mu       sync.Mutex
	eval     *nn.Model // holds the snapshot being evaluated
	next     int       // steps at which the next evaluation is due
	last     []float32 // the snapshot being reported
	lastStep int
	err      error
}

func newEvaluator(env *Env, strategy string, o AsyncOptions) *evaluator {
	return &evaluator{Recorder: env.Recorder, env: env, strategy: strategy, o: o, next: env.Worker.Steps + o.EvalEvery}
}

// Event implements train.Recorder; it logs the events a user watching
// the run should see.
func (e *evaluator) Event(ev train.Event) {
	if ev.Kind == "serving" {
		e.env.Log.Info(ev.Detail)
	}
	e.Recorder.Event(ev)
}

// Snapshot implements train.Recorder.
func (e *evaluator) Snapshot(p string, at time.Duration, updates int, params []float32) {
	e.Recorder.Snapshot(p, at, updates, params)
	e.mu.Lock()
	defer e.mu.Unlock()
	if updates < e.next {
		return
	}
	e.next = (updates/e.o.EvalEvery + 1) * e.o.EvalEvery
	e.last, e.lastStep = append(e.last[:0], params...), updates
	e.report("")
}

// report evaluates e.last and checkpoints it; e.mu is held.
func (e *evaluator) report(note string) {
	if e.eval == nil {
		m, err := e.env.Worker.NewModel(0)
		if err != nil {
			e.err = err
			return
		}
		e.eval = m
	}
	copy(e.eval.Params, e.last)
	loss, acc := train.Evaluate(e.eval, e.env.Test)
	// Not ck.Capture: exchanges served for other peers may be writing the
	// worker's parameters; the optimiser state is this goroutine's.
	w := e.env.Worker
	ck := &train.Checkpoint{Strategy: e.strategy, Version: uint64(e.lastStep), Arch: w.Model.Arch,
		Params: slices.Clone(e.last), Steps: e.lastStep, Opt: map[string][]float32{}}
	var st map[string][]float32
	ck.OptSteps, st = w.Opt.State()
	for k, v := range st {
		ck.Opt[k] = slices.Clone(v)
	}
	if err := e.env.Save(ck); err != nil && e.err == nil {
		e.err = err
	}
	total := e.o.Steps
	if total == 0 {
		total = e.lastStep
	}
	e.env.Report(Progress{Round: e.lastStep, Rounds: total, Accuracy: acc, Loss: loss, Peers: len(e.env.Peer.Members()), Note: note})
}

// finish reports the final model (the worker's, now that training is
// over) and returns the first checkpoint error.
func (e *evaluator) finish(note string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.last, e.lastStep = append(e.last[:0], e.env.Worker.Model.Params...), e.env.Worker.Steps
	e.report(note)
	return e.err
}

// compressOr returns s, or def when s is zero.
func compressOr(s, def compression.Spec) compression.Spec {
	if s.IsZero() {
		return def
	}
	return s
}
