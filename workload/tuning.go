package workload

import "time"

// Tuning is the training settings a workload trains well with. The
// commands start from it and let every flag given explicitly (on the
// command line, in the environment or in a config file) win. This is the
// one place the language model's defaults are defined; the image models
// have no Tuning and keep the commands' own defaults
// (train.DefaultLocalConfig, train.DefaultWorkerConfig), as before
// workloads.
type Tuning struct {
	// Optimizer, LR (the peak rate), Schedule, WeightDecay, ClipNorm
	// (global gradient norm) and Batch (samples a step) configure every
	// step, alone or in a swarm.
	Optimizer   string
	LR          float32
	Schedule    string
	WeightDecay float32
	ClipNorm    float64
	Batch       int
	// Epochs (0: no bound) and Duration bound `peer train`'s run; with no
	// step or epoch bound the schedule fits the duration.
	Epochs   int
	Duration time.Duration
	// EvalEvery and EvalSamples are `peer train`'s periodic evaluation:
	// every EvalEvery steps on EvalSamples test samples.
	EvalEvery, EvalSamples int
	// LocalSteps is a federated round's local steps, in place of one
	// epoch of the peer's shard.
	LocalSteps int
}

// CharLMTuning trains the default CharLM (4 blocks of width 128, T = 128,
// about 0.85 M parameters at byte level) on the Go sources for ten
// minutes on two cores: AdamW at 4e-3 after 100 steps of linear warmup,
// cosine decay to 0, weight decay 0.1, gradients clipped to norm 1, 32
// windows a step (4,096 tokens). A federated round is 50 local steps
// (an epoch of a peer's shard would be hours).
var CharLMTuning = Tuning{
	Optimizer: "adamw", LR: 4e-3, Schedule: "warmup:100+cosine", WeightDecay: 0.1, ClipNorm: 1, Batch: 32,
	Epochs: 0, Duration: 10 * time.Minute, EvalEvery: 200, EvalSamples: 256, LocalSteps: 50,
}

// TuningOf returns the Tuning of the model a spec names, and false for a
// model that has none (the image classifiers). It reads no data.
func TuningOf(modelSpec string) (Tuning, bool, error) {
	m, err := parse(modelSpec)
	if err != nil || m.kind != "charlm" {
		return Tuning{}, false, err
	}
	return CharLMTuning, true, nil
}
