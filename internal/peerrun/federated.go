package peerrun

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/starling-ml/starling/train"
)

func init() { RegisterMode("federated", runFederated) }

// runFederated is --mode federated: serverless FedAvg and friends.
func runFederated(ctx context.Context, env *Env) error {
	cfg := env.Opts.Fed // checked by Options.Validate
	if st := env.Opts.Swarm.Aggregate.StallTimeout; st > 0 {
		cfg.FragmentRetry = 2*st + time.Second // past a failing all-reduce's end
	}
	if ck := env.Checkpoint; ck != nil {
		if ck.Strategy != cfg.Strategy {
			return fmt.Errorf("%w: checkpoint is from strategy %s, this run uses %s", train.ErrCheckpoint, ck.Strategy, cfg.Strategy)
		}
		cfg.Resume = &train.FedState{Version: ck.Version, State: ck.State}
	}
	eval := env.Worker
	var lastErr error
	rec := loggedEvents{Recorder: env.Recorder, log: env.Log}
	net := env.roundNet(true)
	err := train.Federated(ctx, env.Worker, net, cfg, rec, func(ri train.RoundInfo) bool {
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
			note = fmt.Sprintf("round failed (%v); state unchanged", ri.Err)
		case ri.Synced:
			note = "state fetched from peers"
		}
		env.Report(Progress{Round: int(ri.Round), Rounds: cfg.Rounds, Accuracy: acc, Loss: loss, Peers: len(ri.Participants), Note: note})
		return false
	})
	if err == nil {
		err = lastErr
	}
	// After the last round, stay up while a live peer has yet to finish
	// it or is fetching state from this one: a peer that failed the last
	// round takes the others' final state (train.Federated).
	env.LingerWhile = func() bool {
		for _, st := range net.Statuses() {
			if !st.Done && st.Version < uint64(cfg.Rounds) {
				return true
			}
		}
		return false
	}
	env.LingerMax = cfg.RoundTimeout
	if errors.Is(err, context.Canceled) {
		return err
	}
	return err
}

// loggedEvents logs the events a user should see as they happen: a peer
// cut off from most of the last round's group waits for it (train's
// awaitMajority), which looks like a hang unless it says so.
type loggedEvents struct {
	train.Recorder
	log *slog.Logger
}

func (l loggedEvents) Event(e train.Event) {
	switch e.Kind {
	case "minority", "catch-up-failed":
		l.log.Warn("federated: " + e.Detail)
	case "majority", "join", "caught-up", "overtaken", "catch-up":
		l.log.Info("federated: " + e.Detail)
	}
	l.Recorder.Event(e)
}
