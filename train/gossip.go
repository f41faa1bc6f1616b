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
	"github.com/starling-ml/starling/peerid"
	"github.com/starling-ml/starling/staleness"
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
	// no limit). Push-sum needs peers to push at similar rates: a peer
	// that pushes much more often than it receives sees its weight, and so
	// its share of the average, shrink towards 0, and its own progress is
	// lost. With stragglers, set Period above the slow peers' step time.
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
	// (average.PushSumPeer.SetClip). 0 turns it off. 1: a
	// liar is exchanged with as often as anyone, always pulling the same
	// way, and 3 let one passive peer in four halve the others' accuracy
	// (TestGossipByzantinePassive).
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
		rng: rand.New(rand.NewPCG(cfg.Seed, uint64(me)))}
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
	lastEx   time.Time
	sinceEx  int // local steps since the last exchange started
}

// due reports whether an exchange is due after this step, and if so starts
// the clocks of the next one.
func (g *gossipRun) due() bool {
	g.sinceEx++
	if g.sinceEx < g.cfg.Every || time.Since(g.lastEx) < g.cfg.Period {
		return false
	}
	g.sinceEx, g.lastEx = 0, time.Now()
	return true
}

func (g *gossipRun) done(ctx context.Context) bool {
	return ctx.Err() != nil || (g.cfg.MaxSteps > 0 && g.w.Steps >= g.cfg.MaxSteps)
}

func (g *gossipRun) snapshot(force bool, model func([]float32) []float32) {
	at := time.Since(g.start)
	if !force && at-g.lastSnap < g.cfg.SnapshotEvery {
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
		_, n, err := w.Grad(ctx)
		if err != nil {
			return err
		}
		pp.Update(func(x []float32) {
			applyTo(w, x, n)
			copy(w.Model.Params, x)
		})
		if role == average.Active && g.due() {
			if j := g.pickPassive(); j < 0 {
				g.sum.Skipped++
			} else {
				ectx, cancel := context.WithTimeout(ctx, g.cfg.Timeout)
				err := pp.Exchange(ectx, ex, g.peers[j])
				cancel()
				g.exchanged(err, int64(8*len(w.Model.Params)))
				pp.Update(func(x []float32) { copy(w.Model.Params, x) })
			}
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

// serveMin is the least time serveActives may wait in all; it may wait up
// to 10× the passive's own training time when that is longer.
var serveMin = time.Minute

// serveActives keeps a passive peer that has done its MaxSteps in the
// exchange while an active peer of the group is still on its way there:
// alive, short of MaxSteps by its last count, and still counting (a count
// whose highest value has not grown for the exchange timeout plus 3 s
// means the peer is stuck, gone or lying: staleness.VersionClock's stall). Without it the actives, which are slower (they wait on
// their exchanges), would see their last exchanges fail. The passive's
// model goes on being averaged with theirs meanwhile, as it would have
// been while it trained. An active slower than 10× this peer, or one
// whose count creeps on forever, is not waited for beyond that.
func (g *gossipRun) serveActives(ctx context.Context, prog GossipProgress) {
	ctx, cancel := context.WithTimeout(ctx, max(serveMin, 10*time.Since(g.start)))
	defer cancel()
	// The actives' counts, ignored once stuck (SetStall) or dead (Forget).
	counts := staleness.NewVersionClock(0, 0)
	counts.SetStall(g.cfg.Timeout + 3*time.Second)
	start, served := time.Now(), false
	for {
		now := time.Now()
		for i, p := range g.peers {
			if i == g.me || average.RoleOf(i) != average.Active {
				continue
			}
			if s, ok := prog.Steps(p); ok && g.net.Alive(p) {
				counts.Observe(p.String(), staleness.Version(s), now)
			} else {
				counts.Forget(p.String())
			}
		}
		if _, v, ok := counts.Slowest(now); !ok || v >= staleness.Version(g.cfg.MaxSteps) {
			break
		}
		if !served {
			served = true
			g.rec.Event(Event{Peer: g.net.Self().String(), At: time.Since(g.start), Kind: "serving",
				Detail: "done; staying in the exchange for the active peers still training"})
		}
		if sleepCtx(ctx, 100*time.Millisecond) != nil {
			break
		}
	}
	if served {
		g.sum.ServedS = time.Since(start).Seconds()
	}
}

// pickPassive returns a random live passive peer's index, or −1.
func (g *gossipRun) pickPassive() int {
	n := len(g.peers)
	for range n {
		j := average.PickPassive(g.rng, n)
		if j < 0 {
			return -1
		}
		if g.net.Alive(g.peers[j]) {
			return j
		}
	}
	return -1
}

// minPushWeight is the push-sum weight below which a peer stops pushing
// (the mean weight over the peers is 1).
const minPushWeight = 1.0 / 64

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
		// absorbed shares). Scaling by W keeps a peer whose weight has
		// shrunk (it pushes more often than it receives) from turning a
		// normal step into a huge one in its estimate.
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
		due := n > 1 && g.due()
		if due && ps.Weight() < minPushWeight {
			// Pushing would halve a weight that is already small: a peer
			// that gets fewer shares than it sends (its in-neighbours died
			// or are slower) would see it fall geometrically until X/W is
			// lost to float32 underflow. It keeps its mass (the sum of
			// weights is unchanged) and pushes again once shares have
			// brought the weight back up.
			g.sum.Skipped++
		} else if due {
			// The exponential graph's next live out-neighbour.
			to := -1
			for range average.ExpGraphOffsets(n) {
				j := average.ExpGraphPeer(g.me, n, k)
				k++
				if g.net.Alive(g.peers[j]) {
					to = j
					break
				}
			}
			if to < 0 {
				g.sum.Skipped++
			} else {
				ectx, cancel := context.WithTimeout(ctx, g.cfg.Timeout)
				err := ps.Step(ectx, ex, g.peers[to], k, uint64(w.Steps))
				cancel()
				g.exchanged(err, int64(4*len(w.Model.Params)))
			}
		}
		g.snapshot(false, ps.Estimate)
		runtime.Gosched()
	}
	g.snapshot(true, ps.Estimate)
	return ctx.Err()
}
