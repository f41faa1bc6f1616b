package train

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/starling-ml/starling/aggregate/rule"
	"github.com/starling-ml/starling/compression"
	"github.com/starling-ml/starling/gossip/wire"
	"github.com/starling-ml/starling/peerid"
	"github.com/starling-ml/starling/staleness"
	"github.com/starling-ml/starling/trace"
)

// Asynchronous modes of RunAsync.
const (
	// ModeFedAsync: every peer mixes each contribution (a whole model) into
	// its own, x ← (1−α·s(τ))·x + α·s(τ)·x_new (Xie et al. 2019).
	ModeFedAsync = "fedasync"
	// ModeFedBuff: every peer buffers contributions (model deltas), each
	// weighted by s(τ), and applies their mean after K of them (Nguyen et
	// al. 2022).
	ModeFedBuff = "fedbuff"
)

// AsyncConfig configures RunAsync.
type AsyncConfig struct {
	// Mode is ModeFedAsync or ModeFedBuff.
	Mode string
	// Model is the model id; announcements of other models are dropped.
	Model string
	// LocalSteps is H, the local SGD steps between two publications. 10
	// keeps a 200k-parameter MLP's traffic near one model per 10 steps.
	LocalSteps int
	// RoundTime, when > 0, also ends a round once it has lasted that long
	// (after at least one step), so that a straggler publishes and merges
	// as often as the others instead of drifting through long rounds. 0
	// keeps rounds at LocalSteps steps.
	RoundTime time.Duration
	// Alpha is FedAsync's mixing rate α ∈ (0, 1]. 0.5 pulls a fresh model
	// halfway, which on a few peers keeps them close without freezing the
	// local progress.
	Alpha float64
	// Policy weighs a contribution by its staleness, with an optional SSP
	// bound: "poly:0.5" (FedAsync's default), "hinge:10,4", "const", "sqrt"
	// (FedBuff's), "poly:0.5+ssp:16" (staleness.Parse).
	Policy staleness.Policy
	// BufferK is FedBuff's K: contributions per server step (at least
	// that many with a robust BufferRule). 8, about two per peer of a
	// small swarm; FedBuff's experiments use 10 on large ones. The mean
	// does better with 4 on small swarms (docs/design.md).
	BufferK int
	// ServerLR is FedBuff's server learning rate η. 1 applies the mean
	// weighted delta as is.
	ServerLR float64
	// Codec encodes published vectors ("fp32", "fp16", "int8", …).
	Codec compression.Spec
	// FetchTimeout bounds one fetch of an announced vector. 10 s pulls a
	// 100 MB model at 80 Mbit/s; a slower or dead holder is skipped.
	FetchTimeout time.Duration
	// Fetchers is how many fetches run at once. 4 overlaps a few holders'
	// latency without flooding the link.
	Fetchers int
	// Inbox is how many fetched contributions wait to be merged; when it is
	// full the oldest is dropped (DropOverflow). 64.
	Inbox int
	// MaxAhead is how far a contribution's base or version may be ahead of
	// the local version before it is taken for bogus and dropped
	// (DropFuture). Honest peers are within a few rounds of each other;
	// 1024 leaves room for heavy delays.
	MaxAhead uint64
	// PeerTTL is how long a peer's last version counts for the SSP gate;
	// a peer silent for longer cannot hold the gate shut. 10 s. A peer
	// heard from but whose version has not grown for 3×PeerTTL (hung, or
	// lying) stops counting too, until it grows.
	PeerTTL time.Duration
	// SnapshotEvery is the interval of Recorder snapshots (0: after every
	// round). 250 ms.
	SnapshotEvery time.Duration
	// MaxSteps stops after that many local steps (0: run until ctx ends).
	MaxSteps int
	// ClipFactor, in FedAsync, moves a model towards this peer's before
	// mixing it in, to at most ClipFactor times the median distance of
	// the other peers' latest models (rule.DistanceClip), so that a
	// lying or diverged peer cannot drag the model far; with it, a peer's
	// models are mixed in at most once per own round (DropRepeat), so
	// that one flooding its models gets no more pulls than the others.
	// 0 turns both off. 1.
	ClipFactor float64
	// FarSources, in FedAsync over an AsyncNet that knows its connections
	// (AsyncLinks), is how many peers this one pulls models from without
	// having had a connection with them (farSources): announcements of
	// other unconnected peers are dropped (DropFar), so that a swarm of n
	// peers does not open n² connections. Connected peers are always
	// pulled from. 4 leaves small swarms, whose peers are all connected or
	// nearly, as they were; < 0: no bound.
	FarSources int
	// BufferRule is how FedBuff combines the buffered contributions: a
	// coordinate-wise rule (rule.Median, the default, or rule.Trimmed),
	// robust to a minority of liars, or rule.Mean (or nil), FedBuff as
	// published, which one lying peer can poison. With a robust rule peers
	// publish their models rather than deltas, so the codec must be dense;
	// each peer's latest model is a standing vote, and a step needs K new
	// models from a strict majority of the live peers (bufferQuorum;
	// docs/design.md).
	BufferRule rule.Rule
}

// robustRule returns BufferRule, or nil for the mean (FedBuff's running
// sum).
func (c AsyncConfig) robustRule() rule.Rule {
	if _, mean := c.BufferRule.(rule.Mean); mean {
		return nil
	}
	return c.BufferRule
}

// DefaultAsyncConfig returns FedAsync with the documented defaults.
func DefaultAsyncConfig() AsyncConfig {
	return AsyncConfig{
		Mode: ModeFedAsync, Model: "default", LocalSteps: 10, Alpha: 0.5, Policy: staleness.Polynomial(staleness.DefaultPolyA),
		BufferK: 8, ServerLR: 1, Codec: compression.MustSpec("fp32"), FetchTimeout: 10 * time.Second, Fetchers: 4,
		Inbox: 64, MaxAhead: 1024, PeerTTL: 10 * time.Second, SnapshotEvery: 250 * time.Millisecond,
		ClipFactor: 1, BufferRule: rule.Median{}, FarSources: 4,
	}
}

// Validate reports settings that cannot work. It does not modify c.
func (c AsyncConfig) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: async: "+format, append([]any{ErrStrategy}, args...)...)
	}
	switch {
	case c.Mode != ModeFedAsync && c.Mode != ModeFedBuff:
		return bad("mode %q, want %s or %s", c.Mode, ModeFedAsync, ModeFedBuff)
	case c.Model == "" || len(c.Model) > wire.MaxModelIDLen:
		return bad("model id %q must have 1..%d bytes", c.Model, wire.MaxModelIDLen)
	case c.LocalSteps < 1:
		return bad("local steps %d < 1", c.LocalSteps)
	case !(c.Alpha > 0 && c.Alpha <= 1):
		return bad("alpha %v not in (0, 1]", c.Alpha)
	case c.BufferK < 1:
		return bad("buffer K %d < 1", c.BufferK)
	case !(c.ServerLR > 0) || math.IsInf(c.ServerLR, 0):
		return bad("server learning rate %v", c.ServerLR)
	case c.FetchTimeout <= 0 || c.PeerTTL <= 0 || c.SnapshotEvery < 0 || c.RoundTime < 0:
		return bad("fetch timeout and peer TTL must be > 0, snapshot interval and round time ≥ 0")
	case c.Fetchers < 1 || c.Inbox < 1 || c.MaxAhead < 1 || c.MaxSteps < 0:
		return bad("fetchers, inbox and max-ahead must be ≥ 1, max steps ≥ 0")
	case !(c.ClipFactor >= 0) || math.IsInf(c.ClipFactor, 0):
		return bad("clip factor %v must be ≥ 0 (0: off)", c.ClipFactor)
	}
	if c.Codec.IsZero() {
		return bad("no codec (want fp32 for raw float32)")
	}
	r := c.robustRule()
	if r != nil {
		if !r.Local() {
			return bad("buffer rule %v is not coordinate-wise: want median, trimmed:β or mean", r)
		}
		if err := (staleness.BufferConfig{K: 1, ServerLR: 1, Rule: r}).Validate(); err != nil {
			return bad("buffer rule: %v", err)
		}
	}
	if c.Mode == ModeFedBuff && r != nil && !carriesModels(c.Codec) {
		return bad("buffer rule %s sends models, which codec %q cannot carry: want fp32, fp16, bf16 or int8, without error feedback", r, c.Codec)
	}
	return nil
}

// carriesModels reports whether s sends whole models faithfully: a dense
// codec (an entropy stage on top is fine), without error feedback, whose
// residual is meant for deltas.
func carriesModels(s compression.Spec) bool {
	return !s.ErrorFeedback() && s.Desc().Dense
}

// DropReason says why an asynchronous contribution never reached the model.
type DropReason uint8

// Drop reasons. Each contribution that is not merged is counted under
// exactly one.
const (
	DropModel      DropReason = iota // announced for another model id
	DropKind                         // a payload kind the mode does not merge
	DropShape                        // announced or decoded length ≠ the model's
	DropReplay                       // sequence number not above that peer's last
	DropFuture                       // base or version beyond MaxAhead of ours
	DropStale                        // τ beyond the policy's SSP bound
	DropNonFinite                    // a NaN or Inf in the vector
	DropFetch                        // the pull failed (timeout, dead holder, digest)
	DropDecode                       // bytes that do not decode with their codec
	DropOverflow                     // the inbox or the pull queue was full
	DropSuperseded                   // a newer model from the same peer came before it was pulled
	DropRepeat                       // FedAsync: another model from a peer already merged in this own round
	DropFar                          // FedAsync: from an unconnected peer beyond FarSources
	numDropReasons
)

var dropNames = [numDropReasons]string{
	"model", "kind", "shape", "replay", "future", "stale", "nonfinite", "fetch", "decode", "overflow", "superseded", "repeat", "far",
}

func (r DropReason) String() string {
	if r < numDropReasons {
		return dropNames[r]
	}
	return fmt.Sprintf("drop(%d)", uint8(r))
}

// Drops counts dropped contributions by reason.
type Drops [numDropReasons]uint64

// Total returns the number of drops.
func (d Drops) Total() uint64 {
	var n uint64
	for _, c := range d {
		n += c
	}
	return n
}

// Map returns the non-zero counts by reason name.
func (d Drops) Map() map[string]uint64 {
	m := make(map[string]uint64)
	for r, c := range d {
		if c > 0 {
			m[DropReason(r).String()] = c
		}
	}
	return m
}

func (d Drops) String() string {
	var b strings.Builder
	for r, c := range d {
		if c > 0 {
			if b.Len() > 0 {
				b.WriteByte(' ')
			}
			fmt.Fprintf(&b, "%s=%d", DropReason(r), c)
		}
	}
	if b.Len() == 0 {
		return "none"
	}
	return b.String()
}

// AsyncSummary describes one peer's asynchronous run.
type AsyncSummary struct {
	Peer      string            `json:"peer"`
	Mode      string            `json:"mode"`
	Policy    string            `json:"policy"`
	Steps     int               `json:"steps"`       // local SGD steps
	Rounds    int               `json:"rounds"`      // publications attempted
	Published int               `json:"published"`   // publications that succeeded
	Merged    int               `json:"merged"`      // contributions mixed or buffered
	Flushes   int               `json:"flushes"`     // FedBuff server steps
	Version   uint64            `json:"version"`     // final local version
	MeanTau   float64           `json:"mean_tau"`    // over merged contributions
	GateWaitS float64           `json:"gate_wait_s"` // time held by the SSP gate
	Clipped   int               `json:"clipped"`     // models moved closer (ClipFactor)
	Drops     map[string]uint64 `json:"drops"`
	WallS     float64           `json:"wall_s"`
}

// AsyncOption sets an extra of RunAsync.
type AsyncOption func(*asyncOptions)

type asyncOptions struct {
	delay func(from peerid.ID) time.Duration
}

// WithDeliveryDelay delays every fetched contribution by f(sender) before
// it may be merged, without holding a pull slot: experiments use it to
// inject message delays and so staleness. f is called from several
// goroutines.
func WithDeliveryDelay(f func(from peerid.ID) time.Duration) AsyncOption {
	return func(o *asyncOptions) { o.delay = f }
}

// contribution is a fetched, decoded vector waiting to be merged.
type contribution struct {
	from               peerid.ID
	seq, version, base uint64
	kind               wire.PayloadKind
	vec                []float32
	pooled             bool // vec came from asyncPeer.vecs
}

// Polling intervals of the driver's waits.
const (
	// gatePoll is how often a peer held by the SSP gate looks at the
	// versions again (it merges what arrives meanwhile).
	gatePoll = 20 * time.Millisecond
)

// asyncPeer is one peer's state and the driver of its decisions
// (asyncplan.go). The run goroutine owns everything but the atomics, the
// peer table of vc (peersMu) and the receiver goroutine's seen.
type asyncPeer struct {
	cfg   AsyncConfig
	pol   staleness.Policy
	self  peerid.ID
	w     *Worker
	rec   Recorder
	start time.Time
	opts  asyncOptions
	plan  payloadPlan

	vc    *staleness.VersionClock
	mixer *staleness.Mixer // FedAsync
	// clip and roundFrom (the peers merged in this own round) are
	// FedAsync's with ClipFactor > 0.
	clip      *rule.DistanceClip
	roundFrom map[peerid.ID]bool
	buffer    *staleness.Buffer // FedBuff
	server    []float32         // FedBuff: the peer's model; training runs on w.Model.Params
	robust    bool              // FedBuff with a robust BufferRule: votes per peer, a quorum

	local   atomic.Uint64 // vc.Local() for the receiver goroutine
	peersMu sync.Mutex    // guards vc's peer table (Observe, Lag): both goroutines use it
	drops   [numDropReasons]atomic.Uint64
	seen    map[peerid.ID]*seqWindow // receiver goroutine only

	merged, flushes int
	tauSum          float64

	// Buffers of fetched bytes and decoded vectors, reused: a peer pulls
	// a model-sized vector per contribution.
	bufs, vecs sync.Pool
}

func newAsyncPeer(w *Worker, self peerid.ID, cfg AsyncConfig, rec Recorder, opts asyncOptions) (*asyncPeer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	pol := cfg.Policy
	p := &asyncPeer{cfg: cfg, pol: pol, self: self, w: w, rec: rec, opts: opts, start: time.Now(),
		vc: staleness.NewVersionClock(0, cfg.PeerTTL), seen: make(map[peerid.ID]*seqWindow)}
	p.vc.SetStall(3 * cfg.PeerTTL)
	if cfg.Mode == ModeFedAsync && cfg.ClipFactor > 0 {
		p.clip = distanceClip(cfg.ClipFactor)
		p.roundFrom = map[peerid.ID]bool{}
	}
	var err error
	if cfg.Mode == ModeFedAsync {
		p.mixer, err = staleness.NewMixer(staleness.MixerConfig{Alpha: cfg.Alpha, Policy: pol}, p.vc)
	} else {
		p.server = append([]float32(nil), w.Model.Params...)
		rule := cfg.robustRule()
		p.robust = rule != nil
		p.buffer, err = staleness.NewBuffer(len(p.server), staleness.BufferConfig{K: cfg.BufferK, ServerLR: cfg.ServerLR, Policy: pol, Rule: rule, Models: p.robust}, p.vc)
	}
	if err != nil {
		return nil, err
	}
	p.plan = planPayload(cfg.Mode, p.robust)
	if rec == nil {
		p.rec = discardRecorder{}
	}
	return p, nil
}

// model returns the peer's model: the one it would serve to a user.
func (p *asyncPeer) model() []float32 {
	if p.server != nil {
		return p.server
	}
	return p.w.Model.Params
}

func (p *asyncPeer) since() time.Duration { return time.Since(p.start) }

func (p *asyncPeer) drop(r DropReason, from peerid.ID, tau int) {
	p.drops[r].Add(1)
	p.rec.Event(Event{Peer: p.self.String(), At: p.since(), Kind: "drop:" + r.String(), Staleness: tau})
}

// Drops returns a snapshot of the drop counters.
func (p *asyncPeer) dropCounts() Drops {
	var d Drops
	for i := range d {
		d[i] = p.drops[i].Load()
	}
	return d
}

// screen screens a against the peer's settings and local version (see
// screen). Receiver goroutine: it owns seen.
func (p *asyncPeer) screen(a *wire.Announcement) screening {
	return screen(a, screenView{model: p.cfg.Model, kind: p.plan.kind, dim: len(p.w.Model.Params), local: p.local.Load(),
		maxAhead: p.cfg.MaxAhead, localSteps: p.cfg.LocalSteps, policy: p.pol}, p.seen)
}

// observe records that peer works from version base, for the SSP gate and
// the buffer's quorum.
func (p *asyncPeer) observe(peer peerid.ID, base uint64) {
	p.peersMu.Lock()
	p.vc.Observe(string(peer), staleness.Version(base), time.Now())
	p.peersMu.Unlock()
}

// liveOthers returns how many other peers are live.
func (p *asyncPeer) liveOthers() int {
	p.peersMu.Lock()
	defer p.peersMu.Unlock()
	return p.vc.Live(time.Now())
}

// merge folds one contribution into the model, or drops it, and recycles
// its vector. Run goroutine.
func (p *asyncPeer) merge(c *contribution) {
	p.mergeVec(c)
	p.recycle(c)
}

func (p *asyncPeer) recycle(c *contribution) {
	if c.pooled {
		p.vecs.Put(&c.vec)
	}
}

// mergeVec merges or drops c: planMerge, then the mixer or the buffer,
// then mergeOutcome.
func (p *asyncPeer) mergeVec(c *contribution) {
	once := p.roundFrom != nil && c.from != p.self
	plan := planMerge(c, mergeView{dim: len(p.w.Model.Params), kind: p.plan.kind, local: uint64(p.vc.Local()),
		maxAhead: p.cfg.MaxAhead, once: once, merged: once && p.roundFrom[c.from]})
	if plan.advance {
		p.vc.Set(staleness.Version(c.base))
	}
	if !plan.merge {
		p.drop(plan.drop, c.from, 0)
		return
	}
	var (
		d   staleness.Decision
		err error
		w   float64
	)
	if p.mixer != nil {
		if plan.clip {
			p.clip.Clip(c.vec, p.w.Model.Params, string(c.from))
		}
		d, err = p.mixer.Mix(p.w.Model.Params, c.vec, staleness.Version(c.base))
		w = p.cfg.Alpha * d.Weight
	} else {
		if p.robust {
			p.buffer.SetQuorum(bufferQuorum(p.liveOthers()))
		}
		var flushed bool
		d, flushed, err = p.buffer.AddFrom(p.server, c.vec, staleness.Version(c.base), string(c.from))
		w = d.Weight
		if flushed {
			p.flushes++
		}
	}
	p.local.Store(uint64(p.vc.Local()))
	if r, ok := mergeOutcome(d, err); !ok {
		tau := 0
		if r == DropStale {
			tau = int(d.Tau)
		}
		p.drop(r, c.from, tau)
		return
	}
	p.merged++
	p.tauSum += float64(d.Tau)
	if p.roundFrom != nil {
		p.roundFrom[c.from] = true
	}
	p.rec.Event(Event{Peer: p.self.String(), At: p.since(), Kind: "merge", Staleness: int(d.Tau), Weight: w})
}

// RunAsync trains w asynchronously with the peers reachable through net,
// in FedAsync or FedBuff mode, until ctx ends (the normal way to stop it:
// it then returns nil) or cfg.MaxSteps local steps are done.
//
// Each round the peer trains LocalSteps steps from its current model,
// publishes the result (FedAsync: the model; FedBuff: the delta from the
// round's start, or the model with a robust BufferRule) with its base
// version, and merges what other peers published meanwhile, each weighted
// by the staleness policy. Versions are Lamport clocks: every merged
// contribution and every own round ticks the local version, and a
// contribution from a peer that is ahead moves it forward, so τ = local −
// base counts the updates a contribution missed.
//
// A receiver goroutine screens announcements (model id, kind, length,
// replay, versions too far ahead, beyond the SSP bound) before pulling
// anything and queues them; Fetchers pullers fetch (each with
// FetchTimeout), decode and hand them to the run loop, which merges
// between rounds. In FedAsync mode a model still waiting to be pulled is
// replaced by a newer one from the same peer. Every drop is counted by
// reason and recorded as an Event "drop:<reason>"; no dropped contribution
// touches the model. A dead peer only means fewer contributions. With an
// SSP bound in the policy, a peer more than the bound ahead of the slowest
// live peer waits (merging what arrives) before its next round.
func RunAsync(ctx context.Context, w *Worker, net AsyncNet, cfg AsyncConfig, rec Recorder, opts ...AsyncOption) (*AsyncSummary, error) {
	var o asyncOptions
	for _, opt := range opts {
		opt(&o)
	}
	p, err := newAsyncPeer(w, net.Self(), cfg, rec, o)
	if err != nil {
		return nil, err
	}
	enc := cfg.Codec.New()
	inbox := make(chan *contribution, cfg.Inbox)
	rctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { p.receive(rctx, net, inbox, &wg) })
	defer func() {
		stop()
		wg.Wait()
	}()

	sum := &AsyncSummary{Peer: p.self.String(), Mode: cfg.Mode, Policy: p.pol.String()}
	var (
		payload  []byte
		delta    []float32
		lastSnap time.Duration
		runErr   error
	)
	snapshot := func(force bool) {
		if at := p.since(); snapshotDue(force, at, lastSnap, cfg.SnapshotEvery) {
			p.rec.Snapshot(p.self.String(), at, w.Steps, p.model())
			lastSnap = at
		}
	}
	snapshot(true)
	for round := 0; ctx.Err() == nil; round++ {
		steps, ok := nextRound(w.Steps, cfg.LocalSteps, cfg.MaxSteps)
		if !ok {
			break
		}
		waited, err := p.gate(ctx, inbox)
		sum.GateWaitS += waited.Seconds()
		if err != nil {
			break
		}
		base := uint64(p.vc.Local())
		if p.server != nil {
			copy(w.Model.Params, p.server)
		}
		endCompute := trace.StartArgs(ctx, trace.Train, "compute", int64(round), trace.Args{"steps": steps})
		loss, steps, err := p.localSteps(ctx, steps, snapshot)
		endCompute()
		if err != nil {
			if ctx.Err() == nil {
				runErr = err
			}
			break
		}
		p.rec.Event(Event{Peer: p.self.String(), At: p.since(), Kind: "round", Loss: loss})
		clear(p.roundFrom)
		vec := w.Model.Params
		if p.plan.delta {
			delta = growVec(delta, len(vec))
			for i := range vec {
				delta[i] = vec[i] - p.server[i]
			}
			vec = delta
		}
		if p.plan.tick {
			p.vc.Tick()
		}
		p.local.Store(uint64(p.vc.Local()))
		endEnc := trace.Start(ctx, trace.Net, "encode", int64(round))
		payload = enc.Encode(payload, vec)
		endEnc()
		sum.Rounds++
		a := wire.Announcement{
			Version: uint64(p.vc.Local()), Base: base, Kind: p.plan.kind, Codec: enc.ID(),
			Elems: uint32(len(vec)), Samples: uint64(steps * w.Config().Batch), Loss: finiteF32(loss),
			Key: fmt.Sprintf("%s/%d", cfg.Mode, round),
		}
		pctx, cancel := context.WithTimeout(ctx, cfg.FetchTimeout)
		endPub := trace.StartArgs(ctx, trace.Net, "publish", int64(round), trace.Args{"bytes": len(payload)})
		pubErr := net.Publish(pctx, a, payload)
		endPub()
		if pubErr == nil {
			sum.Published++
			p.rec.Event(Event{Peer: p.self.String(), At: p.since(), Kind: "publish", Bytes: int64(len(payload))})
		}
		cancel()
		if p.plan.buffer {
			p.merge(&contribution{from: p.self, version: a.Version, base: base, kind: p.plan.kind, vec: vec})
		}
		p.drain(inbox)
		net.SetStatus(uint64(p.vc.Local()), float32(float64(w.Samples)/max(p.since().Seconds(), 1e-9)))
		snapshot(false)
	}
	if p.server != nil {
		// FedBuff trains on a copy of the peer's model: the worker ends
		// holding the model, not its last round's local one.
		copy(w.Model.Params, p.server)
	}
	snapshot(true)
	sum.Steps = w.Steps
	sum.Merged, sum.Flushes = p.merged, p.flushes
	if p.clip != nil {
		sum.Clipped = p.clip.Clipped()
	}
	sum.Version = uint64(p.vc.Local())
	if p.merged > 0 {
		sum.MeanTau = p.tauSum / float64(p.merged)
	}
	sum.Drops = p.dropCounts().Map()
	sum.WallS = p.since().Seconds()
	return sum, runErr
}

// localSteps runs up to k local SGD steps (fewer if RoundTime passes
// first: roundOver) and returns their mean loss and number, taking
// snapshots between steps (so a slow peer's curve has points inside its
// long rounds).
func (p *asyncPeer) localSteps(ctx context.Context, k int, snapshot func(bool)) (float64, int, error) {
	sum := 0.0
	start := time.Now()
	i := 0
	for ; !roundOver(i, k, time.Since(start), p.cfg.RoundTime); i++ {
		loss, err := p.w.Step(ctx)
		if err != nil {
			return 0, i, err
		}
		sum += loss
		snapshot(false)
		// Let the receiver and pullers run now, not when the scheduler
		// preempts this compute-bound loop: their wait is staleness.
		runtime.Gosched()
	}
	return sum / float64(max(i, 1)), i, nil
}

// drain merges everything queued, without waiting.
func (p *asyncPeer) drain(inbox <-chan *contribution) {
	for {
		select {
		case c := <-inbox:
			p.merge(c)
		default:
			return
		}
	}
}

// gate holds the next round while gateWaits says so, merging what
// arrives, and returns how long it held it. Peers silent for PeerTTL stop
// counting, and so do peers stuck at a version for 3×PeerTTL, so it cannot
// wait forever on a dead, hung or lying peer.
func (p *asyncPeer) gate(ctx context.Context, inbox <-chan *contribution) (time.Duration, error) {
	if _, ok := p.pol.Bound(); !ok {
		return 0, ctx.Err()
	}
	start := time.Now()
	tick := time.NewTicker(gatePoll)
	defer tick.Stop()
	for {
		p.peersMu.Lock()
		wait := gateWaits(p.pol, p.vc, time.Now())
		p.peersMu.Unlock()
		if !wait {
			return time.Since(start), nil
		}
		select {
		case c := <-inbox:
			p.merge(c)
		case <-tick.C:
		case <-ctx.Done():
			return time.Since(start), ctx.Err()
		}
	}
}

// receive screens announcements and queues the accepted ones for Fetchers
// pullers, which fetch, decode and deliver them to the run loop. It never
// blocks on a pull, so the control plane's queue does not back up behind
// slow holders.
func (p *asyncPeer) receive(ctx context.Context, net AsyncNet, inbox chan *contribution, wg *sync.WaitGroup) {
	q := newSharedPullQueue(p.plan.coalesce(), 4*p.cfg.Inbox)
	var far *farSources
	links, ok := net.(AsyncLinks)
	if ok && p.cfg.Mode == ModeFedAsync && p.cfg.FarSources >= 0 {
		far = newFarSources(p.cfg.FarSources, p.cfg.PeerTTL)
	}
	for range p.cfg.Fetchers {
		wg.Go(func() { p.puller(ctx, net, q, inbox, wg) })
	}
	for {
		a, err := net.Next(ctx)
		if err != nil {
			return
		}
		s := p.screen(a)
		if s.observe {
			p.observe(a.Peer, a.Base)
		}
		if s.pull && far != nil && !far.admit(a.Source(), time.Now(), links.Connected) {
			s.pull, s.drop = false, DropFar
		}
		if !s.pull {
			p.drop(s.drop, a.Peer, s.tau)
			continue
		}
		if old, r := q.push(a); old != nil {
			p.drop(r, old.Peer, 0)
		}
	}
}

// puller pulls queued announcements until ctx ends. A delivery delay runs
// on its own goroutine, so it holds no pull slot.
func (p *asyncPeer) puller(ctx context.Context, net AsyncNet, q *sharedPullQueue, inbox chan *contribution, wg *sync.WaitGroup) {
	for {
		a, ok := q.pop(ctx)
		if !ok {
			return
		}
		c, r, ok := p.pull(ctx, net, a)
		if !ok {
			if ctx.Err() == nil {
				p.drop(r, a.Peer, 0)
			}
			continue
		}
		var d time.Duration
		if p.opts.delay != nil {
			d = p.opts.delay(a.Peer)
		}
		if d <= 0 {
			p.deliver(inbox, c)
			continue
		}
		wg.Go(func() {
			t := time.NewTimer(d)
			defer t.Stop()
			select {
			case <-t.C:
				p.deliver(inbox, c)
			case <-ctx.Done():
			}
		})
	}
}

// sharedPullQueue is the pullQueue of a receiver and its pullers: safe
// for concurrent use, and pop waits for an announcement.
type sharedPullQueue struct {
	mu    sync.Mutex
	q     pullQueue
	ready chan struct{}
}

func newSharedPullQueue(coalesce bool, max int) *sharedPullQueue {
	return &sharedPullQueue{q: newPullQueue(coalesce, max), ready: make(chan struct{}, 1)}
}

// push queues a (pullQueue.push).
func (s *sharedPullQueue) push(a *wire.Announcement) (*wire.Announcement, DropReason) {
	s.mu.Lock()
	old, r := s.q.push(a)
	s.mu.Unlock()
	s.wake()
	return old, r
}

func (s *sharedPullQueue) wake() {
	select {
	case s.ready <- struct{}{}:
	default:
	}
}

// pop takes the oldest announcement, waiting for one until ctx ends.
func (s *sharedPullQueue) pop(ctx context.Context) (*wire.Announcement, bool) {
	for {
		s.mu.Lock()
		a, ok := s.q.pop()
		more := s.q.len() > 0
		s.mu.Unlock()
		if ok {
			if more {
				s.wake() // another puller may take the next
			}
			return a, true
		}
		select {
		case <-s.ready:
		case <-ctx.Done():
			return nil, false
		}
	}
}

// pull fetches and decodes one announced vector.
func (p *asyncPeer) pull(ctx context.Context, net AsyncNet, a *wire.Announcement) (*contribution, DropReason, bool) {
	var buf []byte
	if b, ok := p.bufs.Get().(*[]byte); ok {
		buf = *b
	}
	fctx, cancel := context.WithTimeout(ctx, p.cfg.FetchTimeout)
	b, err := net.Fetch(fctx, a, buf)
	cancel()
	defer func() { p.bufs.Put(&b) }()
	if err != nil {
		return nil, DropFetch, false
	}
	dec, err := compression.New(a.Codec, "")
	if err != nil {
		return nil, DropDecode, false
	}
	var vec []float32
	if v, ok := p.vecs.Get().(*[]float32); ok && cap(*v) >= int(a.Elems) {
		vec = (*v)[:a.Elems]
	} else {
		vec = make([]float32, a.Elems)
	}
	if err := dec.Decode(vec, b); err != nil {
		p.vecs.Put(&vec)
		return nil, decodeDrop(err), false
	}
	return &contribution{from: a.Peer, seq: a.Seq, version: a.Version, base: a.Base, kind: a.Kind, vec: vec, pooled: true}, 0, true
}

// deliver queues c, dropping the oldest queued contribution when full.
func (p *asyncPeer) deliver(inbox chan *contribution, c *contribution) {
	for {
		select {
		case inbox <- c:
			return
		default:
		}
		select {
		case old := <-inbox:
			p.drop(DropOverflow, old.from, 0)
			if old.pooled {
				p.vecs.Put(&old.vec)
			}
		default:
		}
	}
}

// discardRecorder discards everything.
type discardRecorder struct{}

func (discardRecorder) Snapshot(string, time.Duration, int, []float32) {}
func (discardRecorder) Event(Event)                                    {}

func finiteF32(f float64) float32 {
	if math.IsNaN(f) || math.IsInf(f, 0) || math.Abs(f) > math.MaxFloat32 {
		return 0
	}
	return float32(f)
}

func growVec(dst []float32, n int) []float32 {
	if cap(dst) >= n {
		return dst[:n]
	}
	return make([]float32, n)
}
