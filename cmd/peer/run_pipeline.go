package main

import (
	"flag"

	"github.com/starling-ml/starling/internal/peerrun"
)

func init() {
	for _, f := range []string{"steps", "eval-every"} {
		modeOnlyFlags[f] = append(modeOnlyFlags[f], "pipeline")
	}
	for _, f := range []string{"stages", "stage", "pipelines", "micro-batches", "pipe-schedule", "pipe-timeout"} {
		modeOnlyFlags[f] = []string{"pipeline"}
	}
}

// pipelineFlags defines the flags only --mode pipeline reads on fs; steps
// and evalEvery are the shared --steps and --eval-every.
func pipelineFlags(fs *flag.FlagSet, steps, evalEvery *int) func() peerrun.PipelineOptions {
	d := peerrun.DefaultPipelineOptions()
	stages := fs.Int("stages", d.Stages, "pipeline: peers K the model's layers are split over (at most the model's layers)")
	stage := fs.Int("stage", d.Stage, "pipeline: this peer's stage, from 0 (default: its rank among the peers' sorted IDs)")
	pipelines := fs.Int("pipelines", d.Pipelines, "pipeline: pipelines P that train together, each stage averaging its gradient with the other pipelines' by all-reduce (P·K peers)")
	micro := fs.Int("micro-batches", d.Pipe.Micro, "pipeline: micro-batches M per batch (bubble (K−1)/(M+K−1))")
	sched := fs.String("pipe-schedule", d.Pipe.Schedule, "pipeline: 1f1b (at most K activations in flight) or gpipe (all forwards, then all backwards)")
	timeout := fs.Duration("pipe-timeout", d.Pipe.Timeout, "pipeline: longest wait on a neighbour stage before the pipeline stops")
	return func() peerrun.PipelineOptions {
		o := d
		o.Stages, o.Stage, o.Pipe.Micro, o.Pipe.Schedule, o.Pipe.Timeout = *stages, *stage, *micro, *sched, *timeout
		o.Steps, o.EvalEvery, o.Pipelines = *steps, *evalEvery, *pipelines
		return o
	}
}
