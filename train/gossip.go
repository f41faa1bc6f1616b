package train

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"time"

	"github.com/starling-ml/starling/aggregate/rule"
	"github.com/starling-ml/starling/gossip/average"
	"github.com/starling-ml/starling/internal/ctxtime"
	"github.com/starling-ml/starling/peerid"
	"github.com/starling-ml/starling/staleness"
	"github.com/starling-ml/starling/trace"
)

// Gossip-averaging algorithms of RunGossip.
const (
	// GossipPairwise is AD-PSGD (Lian et al. 2018): active peers average
	// their model with a random passive peer, atomically.
	GossipPairwise = "adpsgd"
	// GossipPushSum is Stochastic Gradient Push (Assran et al. 2019):
	// push-sum over the time-varying one-peer exponential graph.
	GossipPushSum = "sgp"
)

// GossipConfig configures RunGossip.
type GossipConfig struct {
	// Algorithm is GossipPairwise or GossipPushSum.
	Algorithm string
	// Every is the number of local steps between two exchanges. 1 is the
	// papers' setting; raise it when a model's transfer costs more than a
	// few steps' compute.
	Every int
	// Period is the least time between two exchanges this peer starts (0:
	// no limit). Push-sum needs peers to push at similar rates
	// (docs/design.md): with stragglers, set Period above the slow peers'
	// step time.
	Period time.Duration
	// Timeout bounds one exchange. 5 s: a dead or stalled partner costs at
	// most that, then the peer trains on.
	Timeout time.Duration
	// SnapshotEvery is the interval of Recorder snapshots (0: every step).
	// 250 ms.
	SnapshotEvery time.Duration
	// MaxSteps stops after that many local steps (0: run until ctx ends).
	MaxSteps int
	// Seed seeds the choice of partners (mixed with the peer's index).
	Seed uint64
	// ClipFactor, in AD-PSGD, moves a partner's model towards this
	// peer's before averaging, to at most ClipFactor times the median
	// distance of the other partners (rule.DistanceClip): a lying or
	// diverged partner cannot drag the model far. In SGP it moves each
	// received share's X/W towards this peer's X/W the same way, and
	// refuses a share heavier than the group's whole weight
	// (average.PushSumPeer.SetClip). 0 turns it off. 1, since a liar is
	// exchanged with as often as anyone (docs/design.md).
	ClipFactor float64
}

// DefaultGossipConfig returns AD-PSGD with the documented defaults.
func DefaultGossipConfig() GossipConfig {
	return GossipConfig{Algorithm: GossipPairwise, Every: 1, Timeout: 5 * time.Second, SnapshotEvery: 250 * time.Millisecond, Seed: 1, ClipFactor: 1}
}

// Validate reports settings that cannot work. It does not modify c.
func (c GossipConfig) Validate() error {
	switch {
	case c.Algorithm != GossipPairwise && c.Algorithm != GossipPushSum:
		return fmt.Errorf("%w: gossip algorithm %q, want %s or %s", ErrStrategy, c.Algorithm, GossipPairwise, GossipPushSum)
	case c.Every < 1:
		return fmt.Errorf("%w: gossip every %d steps < 1", ErrStrategy, c.Every)
	case c.Timeout <= 0 || c.Period < 0 || c.SnapshotEvery < 0 || c.MaxSteps < 0:
		return fmt.Errorf("%w: gossip timeout must be > 0; period, snapshot interval and max steps ≥ 0", ErrStrategy)
	case !(c.ClipFactor >= 0) || math.IsInf(c.ClipFactor, 0):
		return fmt.Errorf("%w: gossip clip factor %v must be ≥ 0 (0: off)", ErrStrategy, c.ClipFactor)
	}
	return nil
}

// GossipSummary describes one peer's gossip run.
type GossipSummary struct {
	Peer      string  `json:"peer"`
	Algorithm string  `json:"algorithm"`
	Role      string  `json:"role,omitempty"` // AD-PSGD: active or passive
	Steps     int     `json:"steps"`
	Exchanges int     `json:"exchanges"`        // started by this peer and completed
	Failed    int     `json:"failed"`           // started by this peer and failed
	Skipped   int     `json:"skipped"`          // no live partner at that step
	Clipped   int     `json:"clipped"`          // partners' models (AD-PSGD) or shares (SGP) moved closer (ClipFactor)
	Weight    float64 `json:"weight,omitempty"` // SGP: final push-sum weight
	// ServedS is how long an AD-PSGD passive peer stayed in the exchange
	// after its last step, for active peers still training (seconds).
	ServedS float64 `json:"served_s,omitempty"`
	WallS   float64 `json:"wall_s"`
}

// RunGossip trains w with continuous local SGD and gossip averaging until
// ctx ends (then it returns nil) or cfg.MaxSteps steps are done. peers is
// the group, this peer included, in the same order on every peer (sorted
// IDs): it fixes AD-PSGD's roles and SGP's exponential graph.
//
// Gradients are computed on a copy of the shared model, so exchanges served
// for other peers (HandleSwap, HandleShare) proceed while this peer
// computes; the update is then applied to the model as it is by then, as in
// AD-PSGD. SGP computes the gradient at the de-biased estimate X/W and
// steps the numerator X. Every exchange has cfg.Timeout; partners that are
// not alive are skipped; a failed exchange is counted and training goes
// on. When it returns, w.Model.Params holds the peer's final model.
func RunGossip(ctx context.Context, w *Worker, net GossipNet, peers []peerid.ID, cfg GossipConfig, rec Recorder) (*GossipSummary, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if rec == nil {
		rec = discardRecorder{}
	}
	self := net.Self()
	me := slices.Index(peers, self)
	if me < 0 {
		return nil, fmt.Errorf("%w: gossip: %s is not in its peer list", ErrStrategy, self)
	}
	g := &gossipRun{cfg: cfg, w: w, net: net, peers: peers, me: me, rec: rec, start: time.Now(),
		rng: rand.New(rand.NewPCG(cfg.Seed, uint64(me))), clock: exchangeClock{every: cfg.Every, period: cfg.Period}}
	g.sum = &GossipSummary{Peer: self.String(), Algorithm: cfg.Algorithm}
	var err error
	if cfg.Algorithm == GossipPairwise {
		err = g.pairwise(ctx)
	} else {
		err = g.pushSum(ctx)
	}
	g.sum.Steps = w.Steps
	g.sum.WallS = time.Since(g.start).Seconds()
	if ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		err = nil
	}
	return g.sum, err
}

type gossipRun struct {
	cfg      GossipConfig
	w        *Worker
	net      GossipNet
	peers    []peerid.ID
	me       int
	rec      Recorder
	start    time.Time
	rng      *rand.Rand
	sum      *GossipSummary
	lastSnap time.Duration
	snap     []float32
	clock    exchangeClock
	alive    []bool
}

// servePoll is how often a serving passive peer looks at the actives'
// step counts.
const servePoll = 100 * time.Millisecond

func (g *gossipRun) done(ctx context.Context) bool {
	return ctx.Err() != nil || (g.cfg.MaxSteps > 0 && g.w.Steps >= g.cfg.MaxSteps)
}

// look returns which peers of the group are alive, or nil when no
// exchange is due (the plans then do not look at it).
func (g *gossipRun) look(due bool) []bool {
	if !due {
		return nil
	}
	g.alive = growBools(g.alive, len(g.peers))
	for i, p := range g.peers {
		g.alive[i] = g.net.Alive(p)
	}
	return g.alive
}

func (g *gossipRun) snapshot(force bool, model func([]float32) []float32) {
	at := time.Since(g.start)
	if !snapshotDue(force, at, g.lastSnap, g.cfg.SnapshotEvery) {
		return
	}
	g.lastSnap = at
	g.snap = model(g.snap)
	g.rec.Snapshot(g.net.Self().String(), at, g.w.Steps, g.snap)
}

func (g *gossipRun) exchanged(err error, bytes int64) {
	at := time.Since(g.start)
	if err != nil {
		g.sum.Failed++
		g.rec.Event(Event{Peer: g.net.Self().String(), At: at, Kind: "exchange-failed"})
		return
	}
	g.sum.Exchanges++
	g.rec.Event(Event{Peer: g.net.Self().String(), At: at, Kind: "exchange", Bytes: bytes})
}

// applyTo takes one optimiser step on x with the gradient in
// w.Model.Grads, as Worker.Apply does on w.Model.Params.
func applyTo(w *Worker, x []float32, samples int) {
	w.Opt.Step(x, w.Model.Grads, w.Sched.LR(w.Steps))
	w.Steps++
	w.Samples += samples
}

func (g *gossipRun) pairwise(ctx context.Context) error {
	w := g.w
	role := average.RoleOf(g.me)
	g.sum.Role = role.String()
	pp := average.NewPairwisePeer(slices.Clone(w.Model.Params), role)
	pp.SetClip(distanceClip(g.cfg.ClipFactor))
	ex := g.net.Bind(pp, len(w.Model.Params))
	defer func() {
		pp.Model(w.Model.Params)
		g.sum.Clipped = pp.Clipped()
	}()
	g.snapshot(true, pp.Model)
	pp.Update(func(x []float32) { copy(w.Model.Params, x) })
	prog, _ := g.net.(GossipProgress)
	for !g.done(ctx) {
		// The gradient is computed on a copy while the model may be
		// averaged; the step lands on the model as it is by then, and the
		// copy is refreshed under the same lock (one lock per step keeps
		// passive peers from starving the actives' exchanges).
		endCompute := trace.Start(ctx, trace.Train, "compute", int64(w.Steps+1))
		_, n, err := w.Grad(ctx)
		endCompute()
		if err != nil {
			return err
		}
		pp.Update(func(x []float32) {
			applyTo(w, x, n)
			copy(w.Model.Params, x)
		})
		due := role == average.Active && g.clock.step(time.Now())
		switch plan := planSwap(due, g.rng, len(g.peers), g.look(due)); plan.act {
		case gossipSkip:
			g.sum.Skipped++
		case gossipExchange:
			ectx, cancel := context.WithTimeout(ctx, g.cfg.Timeout)
			endEx := trace.Start(ctx, trace.Net, "exchange", int64(w.Steps))
			err := pp.Exchange(ectx, ex, g.peers[plan.partner])
			endEx()
			cancel()
			g.exchanged(err, int64(8*len(w.Model.Params)))
			pp.Update(func(x []float32) { copy(w.Model.Params, x) })
		}
		if prog != nil {
			prog.SetSteps(w.Steps)
		}
		g.snapshot(false, pp.Model)
		runtime.Gosched() // serve exchanges promptly (see asyncPeer.localSteps)
	}
	if role == average.Passive && prog != nil && ctx.Err() == nil {
		g.serveActives(ctx, prog)
	}
	g.snapshot(true, pp.Model)
	return ctx.Err()
}

// distanceClip returns a DistanceClip of factor f, or nil (no clipping)
// for f = 0.
func distanceClip(f float64) *rule.DistanceClip {
	if f <= 0 {
		return nil
	}
	c := rule.NewDistanceClip()
	c.Factor = f
	return c
}

// serveActives keeps a passive peer that has done its MaxSteps in the
// exchange, its model still averaged, while keepServing says an active
// peer is still on its way there, for serveBudget at most.
func (g *gossipRun) serveActives(ctx context.Context, prog GossipProgress) {
	ctx, cancel := context.WithTimeout(ctx, serveBudget(time.Since(g.start)))
	defer cancel()
	counts := staleness.NewVersionClock(0, 0)
	counts.SetStall(serveStall(g.cfg.Timeout))
	var actives []activeCount
	start, served := time.Now(), false
	for {
		actives = g.lookActives(prog, actives[:0])
		if !keepServing(counts, actives, time.Now(), g.cfg.MaxSteps) {
			break
		}
		if !served {
			served = true
			g.rec.Event(Event{Peer: g.net.Self().String(), At: time.Since(g.start), Kind: "serving",
				Detail: "done; staying in the exchange for the active peers still training"})
		}
		if ctxtime.Sleep(ctx, servePoll) != nil {
			break
		}
	}
	if served {
		g.sum.ServedS = time.Since(start).Seconds()
	}
}

// lookActives appends the other active peers' step counts to dst.
func (g *gossipRun) lookActives(prog GossipProgress, dst []activeCount) []activeCount {
	for i, p := range g.peers {
		if i == g.me || average.RoleOf(i) != average.Active {
			continue
		}
		s, ok := prog.Steps(p)
		dst = append(dst, activeCount{id: p, steps: s, ok: ok && g.net.Alive(p)})
	}
	return dst
}

func (g *gossipRun) pushSum(ctx context.Context) error {
	w := g.w
	ps := average.NewPushSumPeer(slices.Clone(w.Model.Params))
	n := len(g.peers)
	ps.SetClip(distanceClip(g.cfg.ClipFactor), float64(n))
	ex := g.net.Bind(ps, len(w.Model.Params))
	defer func() {
		ps.Estimate(w.Model.Params)
		g.sum.Weight = ps.Weight()
		g.sum.Clipped = ps.Clipped()
	}()
	g.snapshot(true, ps.Estimate)
	var k uint64
	var prev []float32
	for !g.done(ctx) {
		// The gradient is taken at z = X/W; the optimiser steps z, and X
		// moves by W·Δz under the lock (X/W may have changed meanwhile by
		// absorbed shares), so that a peer whose weight has shrunk does
		// not turn a normal step into a huge one in its estimate.
		ps.Estimate(w.Model.Params)
		_, ns, err := w.Grad(ctx)
		if err != nil {
			if ctx.Err() == nil {
				err = fmt.Errorf("%w (push-sum weight %g)", err, ps.Weight())
			}
			return err
		}
		prev = append(prev[:0], w.Model.Params...)
		w.Apply(ns)
		ps.Update(func(x []float32, wt float64) {
			for i, z := range w.Model.Params {
				x[i] += float32(wt * float64(z-prev[i]))
			}
		})
		due := n > 1 && g.clock.step(time.Now())
		plan := planPush(due, g.me, n, k, ps.Weight(), g.look(due))
		k = plan.k
		switch plan.act {
		case gossipSkip:
			g.sum.Skipped++
		case gossipExchange:
			ectx, cancel := context.WithTimeout(ctx, g.cfg.Timeout)
			err := ps.Step(ectx, ex, g.peers[plan.partner], k, uint64(w.Steps))
			cancel()
			g.exchanged(err, int64(4*len(w.Model.Params)))
		}
		g.snapshot(false, ps.Estimate)
		runtime.Gosched()
	}
	g.snapshot(true, ps.Estimate)
	return ctx.Err()
}

func growBools(dst []bool, n int) []bool {
	if cap(dst) >= n {
		return dst[:n]
	}
	return make([]bool, n)
}
