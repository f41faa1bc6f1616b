package peerrun

import (
	"context"
	"fmt"

	"github.com/starling-ml/starling/compression"
	"github.com/starling-ml/starling/swarm"
	"github.com/starling-ml/starling/train"
)

func init() {
	RegisterMode("ps", runPS)
}

// psConfig returns the settings of --mode ps for a model of dim
// parameters: Options.PS with the workload's id, --steps, --compress, the
// worker's learning rate when PS.LR is 0, and the all-reduce's
// --stall-timeout as the time a worker waits for a server before it fails
// over; a zero codec or start grace takes train's default.
func (o *Options) psConfig() train.PSConfig {
	cfg, d := o.PS, train.DefaultPSConfig()
	if cfg.Codec.IsZero() {
		cfg.Codec = d.Codec
	}
	if cfg.StartGrace == 0 {
		cfg.StartGrace = d.StartGrace
	}
	cfg.Model, cfg.MaxSteps, cfg.Codec = o.Swarm.Gossip.Model, o.Async.Steps, compressOr(o.Compress, cfg.Codec)
	if cfg.LR == 0 {
		cfg.LR = o.Worker.LR
	}
	if o.Swarm.Aggregate.StallTimeout > 0 {
		cfg.CallTimeout = o.Swarm.Aggregate.StallTimeout
	}
	return cfg
}

// validatePS checks the settings of --mode ps before anything starts.
func (o *Options) validatePS() error {
	if o.Mode != "ps" {
		return nil
	}
	cfg := o.psConfig()
	if cfg.Model == "" {
		cfg.Model = "unset" // Run sets it from the workload
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	if cfg.Servers > 0 && o.MinPeers < cfg.Servers {
		return fmt.Errorf("%w: --servers %d needs --min-peers ≥ %d (servers are elected among the peers present at start)", ErrUsage, cfg.Servers, cfg.Servers)
	}
	return o.Async.validate()
}

// runPS is --mode ps: the peers present at start elect the servers, each
// of which holds a shard of the parameters (and the replica of another);
// every peer trains, pushing gradients and pulling parameters
// asynchronously.
func runPS(ctx context.Context, env *Env) error {
	if ck := env.Checkpoint; ck != nil && ck.Strategy != "ps" {
		return fmt.Errorf("%w: checkpoint is from strategy %q, this run is ps", train.ErrCheckpoint, ck.Strategy)
	}
	cfg := env.Opts.psConfig()
	dim := len(env.Worker.Model.Params)
	members := env.Peer.Members()
	servers, backups, err := train.PSElect(members, cfg.Model, dim, cfg.Servers)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	env.Log.Info("parameter servers elected", "servers", servers, "backups", backups, "peers", len(members))
	t := swarm.NewPSTransport(env.Peer.Node, 4*dim+compression.MaxEncodedLenAny(dim)+1024, cfg.CallTimeout)
	defer t.Close()
	if d := env.Opts.Async.Duration; d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	ev := newEvaluator(env, "ps", env.Opts.Async)
	sum, err := train.RunPS(ctx, env.Worker, t, members, cfg, ev)
	t.Close()
	if err != nil {
		return err
	}
	note := fmt.Sprintf("pushed %d (mean τ %.1f), stale %d, failovers %d", sum.Pushes, sum.MeanTau, sum.Stale, sum.Failovers)
	if sum.GateWaits > 0 {
		note += fmt.Sprintf(", held by the SSP gate %d times (%.1f s, %d timeouts)", sum.GateWaits, sum.GateWaitS, sum.GateTimeouts)
	}
	if len(sum.Serves) > 0 {
		note += fmt.Sprintf("; served shards %v: applied %d (%d compensated)", sum.Serves, sum.Applied, sum.Compensated)
	}
	if sum.Promoted > 0 {
		note += fmt.Sprintf(", took over %d as backup", sum.Promoted)
	}
	return ev.finish(note)
}
