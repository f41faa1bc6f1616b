package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/starling-ml/starling/device"
	"github.com/starling-ml/starling/internal/progress"
	"github.com/starling-ml/starling/internal/rusage"
	"github.com/starling-ml/starling/nn"
	"github.com/starling-ml/starling/train"
	"github.com/starling-ml/starling/workload"
)

func init() {
	register(&command{name: "train", summary: "train a model (MNIST classifiers, charlm on text) on this machine alone", run: runTrain})
}

// trainOptions is what `peer train`'s flags ask for.
type trainOptions struct {
	Local    train.LocalConfig
	Data     workload.Config
	Device   device.Backend
	Prec     nn.Precision
	Init     string // safetensors file to start from
	Save     string // safetensors file to write the trained model to
	JSON     string // summary file
	HasTuned bool   // the model has a workload.Tuning, applied where no flag was set
}

// trainFlags defines `peer train`'s flags on fs and returns the function
// that reads them once fs is parsed. A model with a workload.Tuning
// (charlm) takes its settings from it for every training flag not set on
// the command line.
func trainFlags(fs *flag.FlagSet) func() (trainOptions, error) {
	def, tu := train.DefaultLocalConfig(), workload.CharLMTuning
	model := fs.String("model", def.Model, "model: logreg, mlp (784-200-200-10), mlp:784-W-…-10, cnn (FedAvg's CNN), or charlm[:layers=L,width=W,heads=H,ctx=T,mlp=R,dropout=P,level=byte|rune] (a character-level transformer; default 4 blocks of width 128, 4 heads, ctx 128)")
	epochs := fs.Int("epochs", def.Epochs, fmt.Sprintf("passes over the training set (0: no bound; charlm: %d)", tu.Epochs))
	steps := fs.Int("steps", 0, "stop after this many optimiser steps (0: no bound)")
	duration := fs.Duration("duration", 0, fmt.Sprintf("stop after this much wall-clock time; with no step or epoch bound the schedule fits it (0: no bound; charlm: %s)", tu.Duration))
	batch := fs.Int("batch", def.Batch, fmt.Sprintf("samples per step (charlm: windows per step, %d)", tu.Batch))
	lr := fs.Float64("lr", shortest(def.LR), fmt.Sprintf("peak learning rate (charlm: %g)", tu.LR))
	optName := fs.String("optimizer", def.Optimizer, fmt.Sprintf("sgd, momentum (0.9), nesterov, adam or adamw (charlm: %s)", tu.Optimizer))
	sched := fs.String("schedule", def.Schedule, fmt.Sprintf("learning-rate schedule: constant, step[:EVERY,GAMMA], cosine, or warmup:STEPS+<schedule> (charlm: %s)", tu.Schedule))
	wd := fs.Float64("wd", shortest(def.WeightDecay), fmt.Sprintf("weight decay (charlm: %g)", tu.WeightDecay))
	clip := fs.Float64("clip", def.ClipNorm, fmt.Sprintf("clip gradients to this global L2 norm (0: off; charlm: %g)", tu.ClipNorm))
	evalEvery := fs.Int("eval-every", 0, fmt.Sprintf("evaluate every N steps on --eval-samples test samples (0: after each epoch only; charlm: %d)", tu.EvalEvery))
	evalSamples := fs.Int("eval-samples", 0, fmt.Sprintf("test samples of each periodic evaluation, spread over the test set (0: all; charlm: %d)", tu.EvalSamples))
	seed := fs.Uint64("seed", def.Seed, "seed for initialisation, data order and a corpus's validation split")
	dataDir := fs.String("data", "", "image models: folder of IDX files (default: MNIST from the GoMNIST module in the Go module cache); charlm: a text file or a folder of them (default: the Go standard library's sources)")
	limit := fs.Int("limit", 0, "train on the first N samples only (0: all)")
	jsonOut := fs.String("json", "", "write a JSON summary to this file (for charlm with val_bits_per_char and the curve of evaluations)")
	save := fs.String("save", "", "save the trained weights to this safetensors file (a PyTorch state dict; for charlm its metadata holds the vocabulary)")
	initW := fs.String("init", "", "start from the weights in this safetensors file instead of a random initialisation")
	dev := fs.String("device", "cpu", "backend: cpu (the fastest CPU backend here), gonum, or cpu/ISA")
	prec := fs.String("precision", "fp32", "fp32, or bf16: bfloat16 weights and saved activations with float32 accumulation and float32 master weights")
	return func() (trainOptions, error) {
		if *limit < 0 {
			return trainOptions{}, fmt.Errorf("train: --limit must not be negative")
		}
		tu, tuned, err := workload.TuningOf(*model)
		if err != nil {
			return trainOptions{}, err
		}
		be, err := device.ByName(*dev)
		if err != nil {
			return trainOptions{}, err
		}
		p, err := nn.ParsePrecision(*prec)
		if err != nil {
			return trainOptions{}, fmt.Errorf("--precision: %w", err)
		}
		o := trainOptions{
			Local: train.LocalConfig{
				Model: *model, Epochs: *epochs, Steps: *steps, Duration: *duration, Batch: *batch, LR: float32(*lr),
				Optimizer: *optName, Schedule: *sched, WeightDecay: float32(*wd), ClipNorm: *clip, Seed: *seed,
				EvalBatch: def.EvalBatch, EvalEvery: *evalEvery, EvalSamples: *evalSamples,
			},
			Data:   workload.Config{Model: *model, Data: *dataDir, Limit: *limit, Seed: *seed},
			Device: be, Prec: p, Init: *initW, Save: *save, JSON: *jsonOut, HasTuned: tuned,
		}
		if tuned {
			set := map[string]bool{}
			fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
			tune(&o.Local, tu, set)
		}
		if err := o.Local.Validate(); err != nil {
			return trainOptions{}, err
		}
		// Names that do not parse fail before any data is read.
		if _, err := nn.NewOptimizer(o.Local.Optimizer, o.Local.WeightDecay); err != nil {
			return trainOptions{}, err
		}
		if _, err := nn.ParseSchedule(o.Local.Schedule, o.Local.LR, 1); err != nil {
			return trainOptions{}, err
		}
		return o, nil
	}
}

// shortest returns the float64 that prints as x does (0.05, not
// 0.05000000074505806).
func shortest(x float32) float64 {
	f, _ := strconv.ParseFloat(strconv.FormatFloat(float64(x), 'g', -1, 32), 64)
	return f
}

// tune sets the settings of c whose flags are not in set from t.
func tune(c *train.LocalConfig, t workload.Tuning, set map[string]bool) {
	for flag, apply := range map[string]func(){
		"epochs":       func() { c.Epochs = t.Epochs },
		"duration":     func() { c.Duration = t.Duration },
		"batch":        func() { c.Batch = t.Batch },
		"lr":           func() { c.LR = t.LR },
		"optimizer":    func() { c.Optimizer = t.Optimizer },
		"schedule":     func() { c.Schedule = t.Schedule },
		"wd":           func() { c.WeightDecay = t.WeightDecay },
		"clip":         func() { c.ClipNorm = t.ClipNorm },
		"eval-every":   func() { c.EvalEvery = t.EvalEvery },
		"eval-samples": func() { c.EvalSamples = t.EvalSamples },
	} {
		if !set[flag] {
			apply()
		}
	}
}

// trainSummary is `peer train`'s JSON summary: train.Summary's fields
// and what was trained on.
type trainSummary struct {
	*train.Summary
	Data    string `json:"data"`
	ModelID string `json:"model_id"`
	Vocab   int    `json:"vocab,omitempty"`
	Init    string `json:"init,omitempty"`
	// Precision is --precision; PeakRSSMB the process's peak resident
	// memory (getrusage's maxrss; 0 where unknown), which with the
	// dataset counts every buffer of the model.
	Precision string  `json:"precision"`
	PeakRSSMB float64 `json:"peak_rss_mb,omitempty"`
}

func runTrain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("train", stderr)
	read := trainFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("train: unexpected arguments %q", fs.Args())
	}
	o, err := read()
	if err != nil {
		return err
	}
	cfg := o.Local
	wl, err := workload.Load(o.Data)
	if err != nil {
		return err
	}
	models, err := wl.Models(o.Device, o.Init, nn.WithPrecision(o.Prec))
	if err != nil {
		return fmt.Errorf("train: --init %w", err)
	}
	bounds := ""
	if cfg.Epochs > 0 {
		bounds += fmt.Sprintf(", %d epochs", cfg.Epochs)
	}
	if cfg.Steps > 0 {
		bounds += fmt.Sprintf(", %d steps", cfg.Steps)
	}
	if cfg.Duration > 0 {
		bounds += fmt.Sprintf(", up to %s", cfg.Duration)
	}
	from := ""
	if o.Init != "" {
		from = " from " + o.Init
	}
	if wl.Text() {
		fmt.Fprintf(stderr, "training %s (%d parameters)%s on %d windows of %s (%v; %d validation windows; %d binary files skipped)%s, batch %d, %s lr %g (%s) on %s\n",
			wl.Arch(), wl.Params(), from, wl.Train.Len(), wl.Source, wl.Vocab, wl.Test.Len(), len(wl.Skipped), bounds, cfg.Batch, cfg.Optimizer, cfg.LR, cfg.Schedule, deviceName(o.Device.Name(), o.Prec))
	} else {
		fmt.Fprintf(stderr, "training %s%s on %d samples of %s%s, batch %d, %s lr %g (%s) on %s\n",
			cfg.Model, from, wl.Train.Len(), wl.Source, bounds, cfg.Batch, cfg.Optimizer, cfg.LR, cfg.Schedule, deviceName(o.Device.Name(), o.Prec))
	}
	bar := progress.New(stderr)
	var (
		last   train.Progress // the last step's, for the evaluation lines
		recent float64        // moving average of the steps' losses
	)
	m, sum, err := train.Local(ctx, cfg, wl.Train, wl.Test, func(p train.Progress) {
		switch {
		case p.Evaluated && wl.Text():
			bar.Println(fmt.Sprintf("step %d  train loss %.4f  val %.4f bits/char  %.0f tokens/s  lr %.2g  %s",
				p.Step, recent, train.BitsPerToken(p.TestLoss), last.TokensPerSec, last.LR, p.Elapsed.Round(time.Second)))
		case p.Evaluated:
			bar.Println(fmt.Sprintf("step %d  train loss %.4f  test acc %.2f%% (subset)  %.0f samples/s  %s",
				p.Step, last.Loss, 100*p.TestAccuracy, last.SamplesPerSec, p.Elapsed.Round(time.Second)))
		case p.EpochDone && wl.Text():
			bar.Println(fmt.Sprintf("step %d  end of epoch %d  epoch's train loss %.4f  val %.4f bits/char (all %d windows)  %.0f tokens/s  %s",
				p.Step, p.Epoch, p.Loss, train.BitsPerToken(p.TestLoss), wl.Test.Len(), p.TokensPerSec, p.Elapsed.Round(time.Second)))
		case p.EpochDone:
			bar.Println(fmt.Sprintf("epoch %d/%d  train loss %.4f  train acc %.2f%%  test acc %.2f%%  %.0f samples/s  %s",
				p.Epoch, p.Epochs, p.Loss, 100*p.Accuracy, 100*p.TestAccuracy, p.SamplesPerSec, p.Elapsed.Round(1e8)))
		case wl.Text():
			last = p
			// About the last 20 steps: one epoch of a corpus can be the
			// whole run, so the epoch's mean lags far behind.
			if p.Step == 1 {
				recent = p.StepLoss
			}
			recent += (p.StepLoss - recent) / 20
			// The share done of whichever bound is nearer: steps (or the
			// horizon estimated from the duration) or time.
			frac := float64(p.Step) / float64(max(p.Steps, 1))
			if cfg.Duration > 0 {
				frac = max(frac, float64(p.Elapsed)/float64(cfg.Duration))
			}
			bar.Update(int(1000*frac), 1000, fmt.Sprintf("step %d loss %.4f (%.3f bits/char) %.0f tokens/s %s",
				p.Step, recent, train.BitsPerToken(recent), p.TokensPerSec, p.Elapsed.Round(time.Second)))
		default:
			last = p
			bar.Update(p.Step, p.Steps, fmt.Sprintf("epoch %d/%d step %d/%d loss %.4f acc %.1f%% %.0f samples/s",
				p.Epoch, p.Epochs, p.Step, p.Steps, p.Loss, 100*p.Accuracy, p.SamplesPerSec))
		}
	}, train.WithModel(models))
	bar.Done()
	if err != nil {
		return err
	}
	if wl.Text() {
		fmt.Fprintf(stdout, "validation %.4f bits/char (loss %.4f, next-char accuracy %.2f%%) after %d steps, %.1fs, %.0f tokens/s on %s\n",
			sum.ValBitsPerChar, sum.TestLoss, 100*sum.TestAccuracy, sum.Steps, sum.WallS, sum.TokensPerSec, deviceName(sum.Backend, o.Prec))
	} else {
		fmt.Fprintf(stdout, "test accuracy %.2f%% (loss %.4f) after %d epochs, %d steps, %.1fs, %.0f samples/s on %s\n",
			100*sum.TestAccuracy, sum.TestLoss, sum.Epochs, sum.Steps, sum.WallS, sum.SamplesPerSec, deviceName(sum.Backend, o.Prec))
	}
	if o.Save != "" {
		if err := wl.Save(m, o.Save); err != nil {
			return fmt.Errorf("train: saving weights: %w", err)
		}
	}
	if o.JSON != "" {
		out := trainSummary{Summary: sum, Data: wl.Source, ModelID: wl.ID(), Init: o.Init, Precision: o.Prec.String(), PeakRSSMB: float64(rusage.PeakRSS()) / 1e6}
		if wl.Vocab != nil {
			out.Vocab = wl.Vocab.Size()
		}
		b, err := json.MarshalIndent(out, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(o.JSON, append(b, '\n'), 0o644); err != nil {
			return fmt.Errorf("train: writing summary: %w", err)
		}
	}
	return nil
}

// deviceName is the backend's name, with the precision when it is not
// float32.
func deviceName(be string, p nn.Precision) string {
	if p == nn.FP32 {
		return be
	}
	return be + " " + p.String()
}
