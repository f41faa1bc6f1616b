// Command compression measures the training effect of gradient compression
// (issue 5's table): 4 peers train FedAvg's 2NN on MNIST with synchronous
// data-parallel SGD for 5 epochs, once per codec, and the command reports
// the final test accuracy and the bytes each peer sent. Every peer runs in
// this process on the simulated libp2p network (package sim), which
// counts the bytes each peer's all-reduce sends; see sim.Compression.
//
//	go run ./examples/compression                      # the full table (minutes)
//	go run ./examples/compression --codecs 'fp32;topk:0.01,ef' --epochs 1 --json out.json
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"

	"github.com/starling-ml/starling/aggregate"
	"github.com/starling-ml/starling/compression"
	"github.com/starling-ml/starling/data"
	"github.com/starling-ml/starling/sim"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "compression:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	def := sim.DefaultCompressConfig()
	fs := flag.NewFlagSet("compression", flag.ContinueOnError)
	fs.SetOutput(stderr)
	peers := fs.Int("peers", def.Peers, "number of peers")
	epochs := fs.Int("epochs", def.Epochs, "epochs over each peer's shard")
	batch := fs.Int("batch", def.Worker.Batch, "batch size per peer")
	lr := fs.Float64("lr", float64(def.Worker.LR), "learning rate")
	opt := fs.String("optimizer", def.Worker.Optimizer, "sgd, momentum, nesterov, adam, adamw")
	sched := fs.String("schedule", def.Worker.Schedule, "learning-rate schedule over the whole run: constant, cosine, step, warmup:N+…")
	model := fs.String("model", "2nn", "model: 2nn (784-200-200-10), cnn, logreg, mlp:784-…-10")
	var names []string
	for _, c := range def.Codecs {
		names = append(names, c.String())
	}
	codecs := fs.String("codecs", strings.Join(names, ";"), "';'-separated --compress specs to compare (fp32 is the uncompressed baseline)")
	algo := fs.String("algo", "auto", "all-reduce algorithm: auto, tree or butterfly")
	seed := fs.Uint64("seed", def.Seed, "seed of the shards, batch order and initial model")
	repeat := fs.Int("repeat", 1, "run every codec with seeds seed, seed+1, … and report means")
	dataDir := fs.String("data", "", "folder with the MNIST IDX files (default: the module cache)")
	jsonOut := fs.String("json", "", "write the rows (and every repeat's) as JSON to this file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg := def
	cfg.Peers, cfg.Epochs, cfg.Seed = *peers, *epochs, *seed
	cfg.Worker.Batch, cfg.Worker.LR, cfg.Worker.Optimizer, cfg.Worker.Model, cfg.Worker.Schedule = *batch, float32(*lr), *opt, *model, *sched
	if *model == "2nn" {
		cfg.Worker.Model = "mlp"
	}
	var err error
	if cfg.Algorithm, err = aggregate.ParseAlgorithm(*algo); err != nil {
		return err
	}
	cfg.Codecs = nil
	for _, s := range strings.Split(*codecs, ";") {
		if s = strings.TrimSpace(s); s != "" {
			c, err := compression.ParseSpec(s)
			if err != nil {
				return err
			}
			cfg.Codecs = append(cfg.Codecs, c)
		}
	}
	if *repeat < 1 {
		return fmt.Errorf("--repeat %d: want at least 1", *repeat)
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	trainSet, testSet, err := data.LoadMNIST(*dataDir)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "%d peers, model %s, batch %d per peer, %s lr %g (%s), %d epochs, all-reduce %s, in one process on an in-memory network\n",
		cfg.Peers, *model, cfg.Worker.Batch, cfg.Worker.Optimizer, cfg.Worker.LR, cfg.Worker.Schedule, cfg.Epochs, cfg.Algorithm)
	progress := func(s string) { fmt.Fprintln(stderr, s) }
	var runs [][]sim.CompressRow
	for r := range *repeat {
		c := cfg
		c.Seed = cfg.Seed + uint64(r)
		rows, err := sim.Compression(ctx, c, trainSet, testSet, progress)
		if err != nil {
			return err
		}
		runs = append(runs, rows)
		if *repeat > 1 {
			fmt.Fprintf(stderr, "seed %d:\n%s", c.Seed, sim.CompressTable(rows))
		}
	}
	rows := sim.MeanCompressRows(runs)
	if *repeat > 1 {
		fmt.Fprintf(stdout, "mean of %d seeds:\n", *repeat)
	}
	fmt.Fprint(stdout, sim.CompressTable(rows))
	if *jsonOut != "" {
		out := struct {
			Peers     int                 `json:"peers"`
			Epochs    int                 `json:"epochs"`
			Model     string              `json:"model"`
			Batch     int                 `json:"batch_per_peer"`
			Optimizer string              `json:"optimizer"`
			Schedule  string              `json:"schedule"`
			LR        float32             `json:"lr"`
			Algorithm string              `json:"algorithm"`
			Seed      uint64              `json:"seed"`
			Rows      []sim.CompressRow   `json:"rows"`
			Runs      [][]sim.CompressRow `json:"runs"`
		}{cfg.Peers, cfg.Epochs, *model, cfg.Worker.Batch, cfg.Worker.Optimizer, cfg.Worker.Schedule, cfg.Worker.LR, cfg.Algorithm.String(), cfg.Seed, rows, runs}
		b, err := json.MarshalIndent(out, "", "  ")
		if err != nil {
			return err
		}
		return os.WriteFile(*jsonOut, append(b, '\n'), 0o644)
	}
	return nil
}
