package peerrun

import (
	"context"
	"errors"
	"fmt"

	"github.com/starling-ml/starling/train"
)

func init() { RegisterMode("federated", runFederated) }

// runFederated is --mode federated: serverless FedAvg and friends.
func runFederated(ctx context.Context, env *Env) error {
	cfg := env.Opts.Fed
	if err := cfg.Validate(); err != nil {
		return err
	}
	if ck := env.Checkpoint; ck != nil {
		if ck.Strategy != cfg.Strategy {
			return fmt.Errorf("%w: checkpoint is from strategy %s, this run uses %s", train.ErrCheckpoint, ck.Strategy, cfg.Strategy)
		}
		cfg.Resume = &train.FedState{Version: ck.Version, State: ck.State}
	}
	eval := env.Worker
	var lastErr error
	err := train.Federated(ctx, env.Worker, env.Peer.FedNet(), cfg, env.Recorder, func(ri train.RoundInfo) bool {
		ck := &train.Checkpoint{Strategy: cfg.Strategy, Version: ri.Round, State: ri.State}
		ck.Capture(env.Worker)
		if err := env.Save(ck); err != nil {
			lastErr = err
			return true
		}
		loss, acc := eval.Evaluate(env.Test)
		note := ""
		switch {
		case ri.Failed:
			note = "round failed; state unchanged"
		case ri.Synced:
			note = "state fetched from peers"
		}
		env.Report(Progress{Round: int(ri.Round), Rounds: cfg.Rounds, Accuracy: acc, Loss: loss, Peers: len(ri.Participants), Note: note})
		return false
	})
	if err == nil {
		err = lastErr
	}
	if errors.Is(err, context.Canceled) {
		return err
	}
	return err
}
