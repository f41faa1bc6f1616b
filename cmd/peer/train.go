package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/starling-ml/starling/data"
	"github.com/starling-ml/starling/internal/progress"
	"github.com/starling-ml/starling/train"
)

func init() {
	register(&command{name: "train", summary: "train a model on MNIST on this machine alone", run: runTrain})
}

func runTrain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	def := train.DefaultLocalConfig()
	fs := newFlagSet("train", stderr)
	model := fs.String("model", def.Model, "model: logreg, mlp (784-200-200-10), mlp:784-W-…-10, or cnn (FedAvg's CNN)")
	epochs := fs.Int("epochs", def.Epochs, "passes over the training set")
	batch := fs.Int("batch", def.Batch, "samples per step")
	lr := fs.Float64("lr", float64(def.LR), "peak learning rate")
	optName := fs.String("optimizer", def.Optimizer, "sgd, momentum (0.9), nesterov, adam or adamw")
	sched := fs.String("schedule", def.Schedule, "learning-rate schedule: constant, step[:EVERY,GAMMA], cosine, or warmup:STEPS+<schedule>")
	wd := fs.Float64("wd", float64(def.WeightDecay), "weight decay")
	clip := fs.Float64("clip", def.ClipNorm, "clip gradients to this global L2 norm (0: off)")
	seed := fs.Uint64("seed", def.Seed, "seed for initialisation and data order")
	dataDir := fs.String("data", "", "folder with the MNIST IDX files (default: the GoMNIST module in the Go module cache)")
	limit := fs.Int("limit", 0, "train on the first N samples only (0: all)")
	jsonOut := fs.String("json", "", "write a JSON summary to this file")
	save := fs.String("save", "", "save the trained weights to this safetensors file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("train: unexpected arguments %q", fs.Args())
	}
	cfg := train.LocalConfig{
		Model: *model, Epochs: *epochs, Batch: *batch, LR: float32(*lr), Optimizer: *optName,
		Schedule: *sched, WeightDecay: float32(*wd), ClipNorm: *clip, Seed: *seed, EvalBatch: def.EvalBatch,
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	if *limit < 0 {
		return fmt.Errorf("train: --limit must not be negative")
	}
	trainSet, testSet, err := data.LoadMNIST(*dataDir)
	if err != nil {
		return err
	}
	trainSet = trainSet.Head(*limit)
	fmt.Fprintf(stderr, "training %s on %d MNIST samples, %d epochs, batch %d, %s lr %g (%s)\n",
		*model, trainSet.Len(), cfg.Epochs, cfg.Batch, cfg.Optimizer, cfg.LR, cfg.Schedule)
	bar := progress.New(stderr)
	m, sum, err := train.Local(ctx, cfg, trainSet, testSet, func(p train.Progress) {
		if p.EpochDone {
			bar.Println(fmt.Sprintf("epoch %d/%d  train loss %.4f  train acc %.2f%%  test acc %.2f%%  %.0f samples/s  %s",
				p.Epoch, p.Epochs, p.Loss, 100*p.Accuracy, 100*p.TestAccuracy, p.SamplesPerSec, p.Elapsed.Round(1e8)))
			return
		}
		bar.Update(p.Step, p.Steps, fmt.Sprintf("epoch %d/%d step %d/%d loss %.4f acc %.1f%% %.0f samples/s",
			p.Epoch, p.Epochs, p.Step, p.Steps, p.Loss, 100*p.Accuracy, p.SamplesPerSec))
	})
	bar.Done()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "test accuracy %.2f%% (loss %.4f) after %d epochs, %d steps, %.1fs, %.0f samples/s on %s\n",
		100*sum.TestAccuracy, sum.TestLoss, sum.Epochs, sum.Steps, sum.WallS, sum.SamplesPerSec, sum.Backend)
	if *save != "" {
		if err := m.SaveFile(*save); err != nil {
			return fmt.Errorf("train: saving weights: %w", err)
		}
	}
	if *jsonOut != "" {
		b, err := json.MarshalIndent(sum, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(*jsonOut, append(b, '\n'), 0o644); err != nil {
			return fmt.Errorf("train: writing summary: %w", err)
		}
	}
	return nil
}
