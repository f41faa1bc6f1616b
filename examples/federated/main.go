// Command federated reproduces the MNIST experiments of McMahan et al. 2017
// ("Communication-Efficient Learning of Deep Networks from Decentralized
// Data"): 100 clients, the 2NN, C = 0.1, E = 1, B = 10, with IID or
// pathological non-IID (two label shards per client) data, and reports the
// rounds FedAvg needs to reach 97% test accuracy. Every client is a full
// Starling peer in this process; sampled clients average their models with
// Starling's all-reduce over an in-memory network.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"

	"github.com/starling-ml/starling/data"
	"github.com/starling-ml/starling/sim"
	"github.com/starling-ml/starling/train"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "federated:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("federated", flag.ContinueOnError)
	fs.SetOutput(stderr)
	clients := fs.Int("clients", 100, "number of clients K")
	fraction := fs.Float64("fraction", 0.1, "fraction C of clients sampled per round")
	epochs := fs.Int("epochs", 1, "local epochs E")
	batch := fs.Int("batch", 10, "local batch size B")
	lr := fs.Float64("lr", 0.1, "client learning rate (plain SGD)")
	partition := fs.String("partition", "iid", "iid, shards (pathological non-IID: 2 label shards per client) or dirichlet:α")
	model := fs.String("model", "2nn", "model: 2nn (784-200-200-10), cnn, logreg")
	strategy := fs.String("strategy", "fedavg", "fedavg, fedprox[:mu=…], fedadam, fedyogi, fedadagrad, diloco[:h=…]")
	rounds := fs.Int("rounds", 1000, "maximum rounds")
	target := fs.Float64("target", 0.97, "stop at this test accuracy (0: run all rounds)")
	seed := fs.Uint64("seed", 1, "seed for the partition, sampling and initialisation")
	dataDir := fs.String("data", "", "folder with the MNIST IDX files (default: the module cache)")
	jsonOut := fs.String("json", "", "write rounds_to_target, final_accuracy and the curve to this file")
	groupSize := fs.Int("group-size", train.DefaultFedConfig().GroupSize, "average in groups of at most this many of a round's sampled clients, re-drawn each round (0: one group)")
	events := fs.Bool("events", false, "print the peers' events other than completed rounds (joins, catch-ups, failed rounds and why) to stderr")
	consensus := fs.Bool("consensus", false, "measure every round's spread of the models before and after averaging, and evaluate every client's final model")
	if err := fs.Parse(args); err != nil {
		return err
	}
	fed := train.DefaultFedConfig()
	if err := fed.ParseStrategy(*strategy); err != nil {
		return err
	}
	fed.Rounds, fed.Fraction, fed.LocalEpochs, fed.Seed, fed.GroupSize = *rounds, *fraction, *epochs, *seed, *groupSize
	wc := train.DefaultWorkerConfig()
	wc.Model, wc.Batch, wc.LR, wc.Optimizer, wc.ModelSeed = *model, *batch, float32(*lr), "sgd", *seed
	if *model == "2nn" {
		wc.Model = "mlp"
	}
	if *strategy == "diloco" || len(*strategy) > 6 && (*strategy)[:6] == "diloco" {
		wc.Optimizer = "adamw"
	}
	trainSet, testSet, err := data.LoadMNIST(*dataDir)
	if err != nil {
		return err
	}
	cfg := sim.FedConfig{Clients: *clients, Partition: *partition, Fed: fed, Worker: wc, Target: *target, Seed: *seed, Consensus: *consensus}
	if *events {
		var mu sync.Mutex
		cfg.Events = func(e train.Event) {
			if e.Kind == "round" {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			fmt.Fprintf(stderr, "%7.2fs %s %s: %s\n", e.At.Seconds(), e.Peer, e.Kind, e.Detail)
		}
	}
	fmt.Fprintf(stderr, "%s: %d clients (%s), C=%g, E=%d, B=%d, lr %g, model %s, target %.2f%%\n",
		fed.Strategy, *clients, *partition, *fraction, *epochs, *batch, *lr, *model, 100**target)
	res, err := sim.Federation(ctx, cfg, trainSet, testSet, func(p sim.RoundPoint) {
		if p.Round%10 == 0 || p.Accuracy >= *target {
			fmt.Fprintf(stderr, "round %4d  test acc %.2f%%  loss %.4f  %.0fs\n", p.Round, 100*p.Accuracy, p.Loss, p.Seconds)
		}
	})
	if err != nil {
		return err
	}
	switch {
	case *target <= 0:
		fmt.Fprintf(stdout, "ran %d rounds (%.0fs); final accuracy %.2f%%\n", res.Rounds, res.WallS, 100*res.FinalAccuracy)
	case res.RoundsToTarget > 0:
		fmt.Fprintf(stdout, "reached %.2f%% in %d rounds (%.0fs); final accuracy %.2f%%\n", 100**target, res.RoundsToTarget, res.TimeToTarget, 100*res.FinalAccuracy)
	default:
		fmt.Fprintf(stdout, "did not reach %.2f%% in %d rounds; final accuracy %.2f%%\n", 100**target, res.Rounds, 100*res.FinalAccuracy)
	}
	if *consensus {
		fmt.Fprintf(stdout, "final accuracy over all %d clients: mean %.2f%%, lowest %.2f%%\n", *clients, 100*res.FinalMean, 100*res.FinalMin)
		fmt.Fprintln(stdout, "round  peers  groups  spread before  spread after  after/before  theory (k-1)/(n-1)")
		for _, c := range res.Consensus {
			fmt.Fprintf(stdout, "%5d  %5d  %6d  %13.4g  %12.4g  %12.4f  %.4f\n", c.Round, c.Participants, c.Groups, c.Before, c.After, c.Ratio, c.Theory)
		}
	}
	if *jsonOut != "" {
		b, err := json.MarshalIndent(res, "", "  ")
		if err != nil {
			return err
		}
		return os.WriteFile(*jsonOut, append(b, '\n'), 0o644)
	}
	return nil
}
