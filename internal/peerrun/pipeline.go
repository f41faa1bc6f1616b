package peerrun

import (
	"context"
	"fmt"
	"time"

	"github.com/starling-ml/starling/data"
	"github.com/starling-ml/starling/swarm"
	"github.com/starling-ml/starling/train"
)

func init() { RegisterMode("pipeline", runPipeline) }

// PipelineOptions are the settings only --mode pipeline reads.
type PipelineOptions struct {
	// Stages is K, the peers the model's layers are split over.
	Stages int
	// Stage is this peer's stage, or −1 to take its rank among the
	// members' sorted IDs (mod Stages).
	Stage int
	// Pipelines is the number of pipelines that train together, each
	// stage averaging its gradient with its replicas' by all-reduce every
	// step (pipeline × data parallelism); Pipelines·Stages peers in all.
	Pipelines int
	// Pipe is the schedule, the micro-batches and the wait deadline.
	Pipe train.PipeConfig
	// Steps is the optimiser steps of the job.
	Steps int
	// EvalEvery reports progress and writes the checkpoint every that
	// many steps (and after the last).
	EvalEvery int
}

// DefaultPipelineOptions returns 2 stages placed by peer ID, 1F1B over 4
// micro-batches, 1000 steps, reporting every 100.
func DefaultPipelineOptions() PipelineOptions {
	return PipelineOptions{Stages: 2, Stage: -1, Pipelines: 1, Pipe: train.DefaultPipeConfig(), Steps: defaultSteps, EvalEvery: defaultEvalEvery}
}

// validate checks the settings of --mode pipeline that need no model
// (Run checks --stages against the model's layers).
func (o PipelineOptions) validate() error {
	switch {
	case o.Stages < 1:
		return fmt.Errorf("%w: --stages %d, want ≥ 1", ErrUsage, o.Stages)
	case o.Pipelines < 1:
		return fmt.Errorf("%w: --pipelines %d, want ≥ 1", ErrUsage, o.Pipelines)
	case o.Stage >= o.Stages:
		return fmt.Errorf("%w: --stage %d of --stages %d (stages count from 0)", ErrUsage, o.Stage, o.Stages)
	case o.Steps < 1 || o.EvalEvery < 1:
		return fmt.Errorf("%w: --steps and --eval-every must be positive", ErrUsage)
	}
	if err := o.Pipe.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	return nil
}

// runPipeline is --mode pipeline: this peer trains one stage of the
// model's layers, the others the rest, passing activations and gradients
// over tensor streams (train.Pipeline). Every wait on a neighbour has
// Pipe.Timeout; a stage that dies stops the pipeline with an error, and
// peers restarted with --resume continue from their checkpoints.
func runPipeline(ctx context.Context, env *Env) error {
	o := env.Opts.Pipeline
	p, w := env.Peer, env.Worker
	wctx, cancel := context.WithTimeout(ctx, env.Opts.Wait)
	if err := p.WaitPeers(wctx, o.Stages*o.Pipelines); err != nil {
		cancel()
		return fmt.Errorf("pipeline: waiting for %d peers (%d pipelines of %d stages; have %d): %w", o.Stages*o.Pipelines, o.Pipelines, o.Stages, len(p.Members()), err)
	}
	place, err := swarm.PipeAssign(wctx, p.Node, p.ID(), p.Members(), o.Stages, o.Pipelines, o.Stage, uint64(w.Steps))
	cancel()
	if err != nil {
		return fmt.Errorf("pipeline: %w", err)
	}
	stage, prev, next := place.Stage, place.Prev, place.Next
	strategy := fmt.Sprintf("pipeline:%d/%d", stage, o.Stages)
	if ck := env.Checkpoint; ck != nil && ck.Strategy != strategy {
		return fmt.Errorf("%w: checkpoint is of %s, this peer is %s", train.ErrCheckpoint, ck.Strategy, strategy)
	}
	if err := pipeRewind(env, place.MinStep(), strategy); err != nil {
		return err
	}
	sts, err := w.Model.Stages(o.Stages)
	if err != nil {
		return fmt.Errorf("%w: --stages: %w", ErrUsage, err)
	}
	link, err := swarm.NewPipeLink(p.Node, prev, next)
	if err != nil {
		return err
	}
	pc := o.Pipe
	if o.Pipelines > 1 {
		// Every replica of the stage takes part or the step fails: a
		// stage averaged over fewer would leave the replicas apart.
		net, buf := p.Net(w.Config().Batch), make([]float32, len(sts[stage].Params))
		pc.Replica = place.Pipeline
		pc.Average = func(ctx context.Context, step uint64, g []float32) error {
			got, err := net.AllReduce(ctx, step, place.Replicas, buf, g, 1)
			if err != nil {
				return err
			}
			if len(got) != len(place.Replicas) {
				return fmt.Errorf("%d of the %d replicas of stage %d took part", len(got), len(place.Replicas), stage)
			}
			copy(g, buf)
			return nil
		}
	}
	pl, err := train.NewPipeline(w, sts[stage], link, pc)
	if err != nil {
		return err
	}
	st := sts[stage]
	env.Log.Info("pipeline stage", "stage", stage, "stages", o.Stages, "pipeline", place.Pipeline, "pipelines", o.Pipelines, "units", fmt.Sprintf("[%d, %d)", st.Lo, st.Hi),
		"params", len(st.Params), "prev", prev, "next", next, "from step", w.Steps)
	var busy, wall time.Duration
	var samples, recomputed, measured int
	var lossSum float64
	var lossN, correct, targets int
	var last *train.Checkpoint
	for w.Steps < o.Steps {
		res, err := pl.Step(ctx)
		if err != nil {
			return err
		}
		if w.Steps > 1 { // the first step warms up buffers and streams
			busy, wall, samples, measured = busy+res.Busy, wall+res.Wall, samples+res.Samples, measured+1
			recomputed += res.Recomputed
		}
		if st.Last() {
			lossSum += res.Loss
			lossN++
			correct, targets = correct+res.Correct, targets+res.Samples*w.Model.Targets()
		}
		if w.Steps%o.EvalEvery != 0 && w.Steps != o.Steps {
			continue
		}
		ck := &train.Checkpoint{Strategy: strategy, Version: uint64(w.Steps)}
		ck.Capture(w)
		if err := env.Save(ck); err != nil {
			return err
		}
		// The one before is kept too: a stage that dies may leave its
		// last checkpoint one behind the others' (pipeRewind).
		if last != nil && env.Opts.Checkpoint != "" {
			last.Mode = env.Opts.Mode
			if err := last.Save(env.Opts.Checkpoint + prevSuffix); err != nil {
				return err
			}
		}
		last = ck
		var test data.Dataset
		if st.First() {
			test = env.Test
		}
		vloss, vacc, err := pl.Evaluate(ctx, test)
		if err != nil {
			return err
		}
		pr := Progress{Round: w.Steps, Rounds: o.Steps, Peers: o.Stages, Note: pipeNote(stage, o, busy, wall, samples)}
		if st.Last() {
			pr.Loss, pr.Accuracy = vloss, vacc
			pr.Note += fmt.Sprintf(", training loss %.4f nats and accuracy %.4f since the last report", lossSum/float64(max(lossN, 1)), float64(correct)/float64(max(targets, 1)))
		} else {
			pr.Note += " (the last stage reports the evaluation)"
		}
		lossSum, lossN, correct, targets = 0, 0, 0, 0
		env.Report(pr)
	}
	if measured > 0 {
		env.Log.Warn("pipeline done", "stage", stage, "stages", o.Stages, "schedule", o.Pipe.Schedule, "micro", o.Pipe.Micro,
			"steps", measured, "samples/s", float64(samples)/wall.Seconds(), "idle", 1-busy.Seconds()/wall.Seconds(),
			"bound", train.PipeBubbleBound(o.Stages, o.Pipe.Micro), "recomputed", recomputed)
	}
	return nil
}

// prevSuffix names the checkpoint before the last (--checkpoint FILE's
// FILE.prev) that pipeline stages keep.
const prevSuffix = ".prev"

// pipeRewind brings the worker back to step min, the least step any
// stage declared, from the checkpoint before its last: a stage killed
// after the others saved step s may have saved only s − --eval-every,
// and the pipeline can go on only from a step every stage holds.
func pipeRewind(env *Env, min uint64, strategy string) error {
	w := env.Worker
	if uint64(w.Steps) == min {
		return nil
	}
	path := env.Opts.Checkpoint + prevSuffix
	ck, err := train.LoadCheckpoint(path, 1<<30)
	if err != nil || ck.Strategy != strategy || ck.Version != min {
		if err == nil {
			err = fmt.Errorf("it is of %s at step %d", ck.Strategy, ck.Version)
		}
		return fmt.Errorf("%w: another stage resumes at step %d, this one at %d, and %s cannot take it back: %v", train.ErrCheckpoint, min, w.Steps, path, err)
	}
	if err := ck.Check(w, env.Opts.Mode); err != nil {
		return err
	}
	if err := ck.Restore(w); err != nil {
		return fmt.Errorf("%w: %v", train.ErrCheckpoint, err)
	}
	env.Log.Warn("pipeline: resuming from the checkpoint before the last, where every stage is", "step", min, "file", path)
	return nil
}

// pipeNote describes the stage's pace: its share of time idle (waiting on
// its neighbours) against the (K−1)/(M+K−1) bound, and its samples/s.
func pipeNote(stage int, o PipelineOptions, busy, wall time.Duration, samples int) string {
	if wall <= 0 {
		return fmt.Sprintf("stage %d/%d", stage, o.Stages)
	}
	return fmt.Sprintf("stage %d/%d: idle %.0f%% (bound %.0f%%), %.1f samples/s", stage, o.Stages,
		100*(1-busy.Seconds()/wall.Seconds()), 100*train.PipeBubbleBound(o.Stages, o.Pipe.Micro), float64(samples)/wall.Seconds())
}
