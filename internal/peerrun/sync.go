package peerrun

import (
	"context"
	"fmt"

	"github.com/starling-ml/starling/peerid"
	"github.com/starling-ml/starling/train"
)

func init() { RegisterMode("sync", runSync) }

// SyncOptions are the settings only --mode sync reads.
type SyncOptions struct {
	Sync train.SyncConfig
	// EvalEvery evaluates on the test set, reports progress and writes the
	// checkpoint every that many steps (and after the last, a join or a
	// step this peer was left out of).
	EvalEvery int
}

// The defaults sync, async and gossip share: the job's steps (sync) or
// this peer's (async, gossip), and how often to evaluate.
const (
	defaultSteps     = 1000
	defaultEvalEvery = 100
)

// DefaultSyncOptions returns train's defaults for a 1000-step job,
// evaluating every 100 steps.
func DefaultSyncOptions() SyncOptions {
	o := SyncOptions{Sync: train.DefaultSyncConfig(), EvalEvery: defaultEvalEvery}
	o.Sync.Steps = defaultSteps
	return o
}

// validate checks the settings of --mode sync before anything starts.
func (o SyncOptions) validate() error {
	if err := o.Sync.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	if o.EvalEvery <= 0 {
		return fmt.Errorf("%w: --eval-every must be positive", ErrUsage)
	}
	return nil
}

// runSync is --mode sync: synchronous data-parallel SGD, one all-reduce of
// the gradients per step.
func runSync(ctx context.Context, env *Env) error {
	o := env.Opts.Sync // checked by Options.Validate
	if ck := env.Checkpoint; ck != nil && ck.Strategy != "sync" {
		return fmt.Errorf("%w: checkpoint is from strategy %q, this run is sync", train.ErrCheckpoint, ck.Strategy)
	}
	w := env.Worker
	comp := env.Peer.Runner.Compression()
	if err := train.PrepareCompression(comp, w.Model, env.Checkpoint); err != nil {
		return err
	}
	total := o.Sync.Steps
	var lastErr error
	net := env.roundNet(false)
	err := train.Sync(ctx, w, net, o.Sync, env.Recorder, func(si train.StepInfo) bool {
		due := si.Step%uint64(o.EvalEvery) == 0 || si.Step == uint64(total) || si.Joined || si.Failed
		if !due {
			return false
		}
		ck := &train.Checkpoint{Strategy: "sync", Version: si.Step}
		ck.Capture(w)
		train.SaveCompression(ck, comp)
		if err := env.Save(ck); err != nil {
			lastErr = err
			return true
		}
		loss, acc := w.Evaluate(env.Test)
		note := ""
		switch {
		case si.Joined:
			note = "joined: state fetched from the running peers"
		case si.Failed:
			note = fmt.Sprintf("left out of step %d (%v); rejoining", si.Step+1, si.Err)
		}
		env.Report(Progress{Round: int(si.Step), Rounds: total, Accuracy: acc, Loss: loss, Peers: len(si.Group), Note: note})
		return false
	})
	if err == nil {
		err = lastErr
	}
	// After the last step, stay up while a live peer has yet to finish
	// the job (it was left out of a step and is rejoining, or came late):
	// past the last step a joiner takes the final state from the peers
	// that finished (train.Sync), and they must still be there to give it.
	env.LingerWhile = func() bool { return syncBehind(net.Statuses(), uint64(total)) }
	env.LingerMax = o.Sync.StepTimeout
	return err
}

// syncBehind reports whether a peer in statuses is still on its way to the
// job's last step: joining, or short of it without having stopped.
func syncBehind(statuses map[peerid.ID]train.Status, total uint64) bool {
	for _, st := range statuses {
		if st.JoinAt != 0 || (!st.Done && st.Version < total) {
			return true
		}
	}
	return false
}
