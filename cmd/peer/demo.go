package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/starling-ml/starling/internal/cli"
	"github.com/starling-ml/starling/internal/demo"
)

func init() {
	register(&command{name: "demo", summary: "start a local swarm of peers and train on non-IID MNIST", run: runDemo})
}

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	def := demo.DefaultOptions()
	fs := newFlagSet("demo", stderr)
	peers := fs.Int("peers", def.Peers, "number of peer processes")
	out := fs.String("out", def.Out, "output folder for plots, the summary and peer logs")
	rounds := fs.Int("rounds", def.Rounds, "federated rounds")
	partition := fs.String("partition", def.Partition, "data split: iid, shards or dirichlet:α")
	timeout := fs.Duration("timeout", def.Timeout, "stop the demo after this long")
	uiAddr := fs.String("ui", def.UI, "serve a live dashboard of the swarm on this address and print its URL (\"\": none)")
	var extra cli.List
	fs.Var(&extra, "peer-flag", "extra `peer run` flag for every peer, e.g. --peer-flag=--strategy=fedprox (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("demo: unexpected arguments %q", fs.Args())
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	o := def
	o.Exe, o.Peers, o.Out, o.Rounds, o.Partition, o.Timeout, o.Extra, o.UI = exe, *peers, *out, *rounds, *partition, *timeout, extra, *uiAddr
	res, err := demo.Run(ctx, o, stdout, stderr)
	if res != nil && len(res.Curve) > 0 {
		msg := fmt.Sprintf("final test accuracy %.2f%% after %d rounds in %.0fs", 100*res.FinalAccuracy, len(res.Curve), res.WallS)
		if res.SecondsToTarget >= 0 {
			msg += fmt.Sprintf(" (%.0f%% reached after %.0fs)", 100*res.Target, res.SecondsToTarget)
		}
		fmt.Fprintf(stdout, "%s; plots and summary in %s\n", msg, o.Out)
	}
	return err
}
