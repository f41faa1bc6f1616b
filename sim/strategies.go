package sim

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/starling-ml/starling/aggregate"
	"github.com/starling-ml/starling/gossip"
	"github.com/starling-ml/starling/gossip/average"
	"github.com/starling-ml/starling/peerid"
	"github.com/starling-ml/starling/swarm"
	"github.com/starling-ml/starling/train"
)

// Strategy runs one peer's training until ctx ends (returning nil then)
// and returns a JSON-encodable summary of it.
type Strategy func(ctx context.Context, p *Peer) (summary any, err error)

var (
	regMu    sync.RWMutex
	registry = map[string]Strategy{}
)

// Register makes s available under name, replacing any strategy of that
// name (the synchronous stand-in "sync" is meant to be replaced).
func Register(name string, s Strategy) {
	regMu.Lock()
	defer regMu.Unlock()
	registry[name] = s
}

// Strategies returns the registered names, sorted.
func Strategies() []string {
	regMu.RLock()
	defer regMu.RUnlock()
	names := make([]string, 0, len(registry))
	for n := range registry {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

func lookup(name string) Strategy {
	regMu.RLock()
	defer regMu.RUnlock()
	return registry[name]
}

func init() {
	Register("fedasync", asyncStrategy(train.ModeFedAsync))
	Register("fedbuff", asyncStrategy(train.ModeFedBuff))
	Register("adpsgd", gossipStrategy(train.GossipPairwise))
	Register("sgp", gossipStrategy(train.GossipPushSum))
	Register("local", localStrategy)
	Register("sync", syncStrategy)
	Register("ps", psStrategy)
}

// psStrategy is the parameter-server mode (train.RunPS) among the whole
// group, over the protocol of swarm.PSTransport.
func psStrategy(ctx context.Context, p *Peer) (any, error) {
	cfg := p.Config.PS
	cfg.Model, cfg.SnapshotEvery = p.Config.Async.Model, p.Config.SnapshotEvery
	if cfg.LR == 0 {
		cfg.LR = p.Config.Worker.LR
	}
	if !p.Config.Compress.IsZero() {
		cfg.Codec = p.Config.Compress
	}
	if p.Config.StallTimeout > 0 {
		cfg.CallTimeout = p.Config.StallTimeout
	}
	dim := len(p.Worker.Model.Params)
	t := swarm.NewPSTransport(p.Swarm.Node, 8*dim+1024, cfg.CallTimeout)
	defer t.Close()
	return train.RunPS(ctx, p.Worker, t, p.Group, cfg, p.Rec)
}

// transport starts the peer's stream transport over its node; a fetch
// takes up to the node's MaxTensorBytes (see newSwarm).
func transport(p *Peer) (*gossip.NodeTransport, error) {
	return swarm.NewStreamTransport(p.Swarm.Node, p.Config.Async.Model, 256<<20)
}

func asyncStrategy(mode string) Strategy {
	return func(ctx context.Context, p *Peer) (any, error) {
		t, err := transport(p)
		if err != nil {
			return nil, err
		}
		defer t.Close()
		cfg := p.Config.Async
		cfg.Mode = mode
		var opts []train.AsyncOption
		if p.Config.Delay > 0 {
			opts = append(opts, train.WithDeliveryDelay(func(peerid.ID) time.Duration { return p.Delay() }))
		}
		return train.RunAsync(ctx, p.Worker, &swarm.StreamNet{CP: p.Swarm.Control, T: t}, cfg, p.Rec, opts...)
	}
}

func gossipStrategy(algo string) Strategy {
	return func(ctx context.Context, p *Peer) (any, error) {
		t, err := transport(p)
		if err != nil {
			return nil, err
		}
		defer t.Close()
		cfg := p.Config.Gossip
		cfg.Algorithm = algo
		var net train.GossipNet = &swarm.StreamNet{CP: p.Swarm.Control, T: t}
		if p.Config.Delay > 0 {
			net = &delayGossipNet{GossipNet: net, p: p}
		}
		return train.RunGossip(ctx, p.Worker, net, p.Group, cfg, p.Rec)
	}
}

// delayGossipNet delays every exchange a peer starts.
type delayGossipNet struct {
	train.GossipNet
	p *Peer
}

func (n *delayGossipNet) Bind(h average.Handler, dim int) average.Exchanger {
	return &delayExchanger{Exchanger: n.GossipNet.Bind(h, dim), p: n.p}
}

type delayExchanger struct {
	average.Exchanger
	p *Peer
}

func (e *delayExchanger) Push(ctx context.Context, to peerid.ID, s average.Share) error {
	if err := Sleep(ctx, e.p.Delay()); err != nil {
		return fmt.Errorf("%w: %w", average.ErrNotDelivered, err)
	}
	return e.Exchanger.Push(ctx, to, s)
}

func (e *delayExchanger) Swap(ctx context.Context, with peerid.ID, mine, theirs []float32) error {
	if err := Sleep(ctx, e.p.Delay()); err != nil {
		return fmt.Errorf("%w: %w", average.ErrNotDelivered, err)
	}
	return e.Exchanger.Swap(ctx, with, mine, theirs)
}

// LocalSummary describes a peer that trained alone.
type LocalSummary struct {
	Peer  string  `json:"peer"`
	Steps int     `json:"steps"`
	WallS float64 `json:"wall_s"`
}

// localStrategy trains with no communication at all: the reference for
// what averaging adds.
func localStrategy(ctx context.Context, p *Peer) (any, error) {
	w := p.Worker
	start := time.Now()
	name := p.ID.String()
	p.Rec.Snapshot(name, 0, 0, w.Model.Params)
	last := time.Duration(0)
	for ctx.Err() == nil {
		if _, err := w.Step(ctx); err != nil {
			if ctx.Err() != nil {
				break
			}
			return nil, err
		}
		if at := time.Since(start); at-last >= p.Config.SnapshotEvery {
			p.Rec.Snapshot(name, at, w.Steps, w.Model.Params)
			last = at
		}
		runtime.Gosched() // as the other strategies do, for a fair share
	}
	p.Rec.Snapshot(name, time.Since(start), w.Steps, w.Model.Params)
	return &LocalSummary{Peer: name, Steps: w.Steps, WallS: time.Since(start).Seconds()}, nil
}

// SyncSummary describes a peer of synchronous training.
type SyncSummary struct {
	Peer   string  `json:"peer"`
	Steps  int     `json:"steps"`
	Failed int     `json:"failed_steps"` // steps this peer was left out of
	Group  int     `json:"final_group"`
	WallS  float64 `json:"wall_s"`
}

// syncStrategy is synchronous data-parallel SGD (train.Sync): every step
// the group all-reduces its gradients with the peer's aggregate.Runner
// over aggregate/p2p and applies the same mean. The job is fixed (no
// joining): every peer starts together, and one left out of a step stops.
func syncStrategy(ctx context.Context, p *Peer) (any, error) {
	scfg := train.DefaultSyncConfig()
	scfg.Steps = math.MaxInt32 // the run's duration ends the job
	scfg.SnapshotEvery = 1     // simRecorder keeps one per SnapshotEvery
	scfg.Fixed = true
	sum := &SyncSummary{Peer: string(p.ID), Group: len(p.Group)}
	start := time.Now()
	err := train.Sync(ctx, p.Worker, p.Swarm.Net(p.Worker.Config().Batch), scfg, p.Rec, func(si train.StepInfo) bool {
		if si.Failed {
			sum.Failed++
		} else {
			sum.Group = len(si.Group)
		}
		return false
	})
	sum.Steps, sum.WallS = p.Worker.Steps, time.Since(start).Seconds()
	return sum, err
}

// simTransport counts the bytes of every all-reduce chunk a peer sends
// (Peer.Sent) and delays it by Config.Delay's draw.
type simTransport struct {
	aggregate.Transport
	p *Peer
}

func (t *simTransport) Send(ctx context.Context, to peerid.ID, tag aggregate.Tag, data []float32) error {
	if err := Sleep(ctx, t.p.Delay()); err != nil {
		return err
	}
	t.p.sent.Add(4 * int64(len(data)))
	return t.Transport.Send(ctx, to, tag, data)
}
