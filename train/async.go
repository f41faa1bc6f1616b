package train

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/starling-ml/starling/aggregate/rule"
	"github.com/starling-ml/starling/compression"
	"github.com/starling-ml/starling/gossip"
	"github.com/starling-ml/starling/staleness"
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
	// Policy is the staleness policy spec (staleness.Parse): "poly:0.5"
	// (FedAsync's default), "hinge:10,4", "const", "sqrt" (FedBuff's), with
	// an optional SSP bound: "poly:0.5+ssp:16".
	Policy string
	// BufferK is FedBuff's K: contributions per server step (at least
	// that many with a robust BufferRule). 8, about two per peer of a
	// small swarm; FedBuff's experiments use 10 on large ones. With the
	// mean, 4 reaches a target sooner on small swarms (2.3 s against 2.8 s
	// to 97 % in the straggler experiment of docs/results).
	BufferK int
	// ServerLR is FedBuff's server learning rate η. 1 applies the mean
	// weighted delta as is.
	ServerLR float64
	// Codec is the compression spec of published vectors ("fp32", "fp16",
	// "int8", …).
	Codec string
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
	// BufferRule is how FedBuff combines the buffered contributions
	// (rule.Parse; a rule of one pass): "median" (the default)
	// or "trimmed:β", robust to a minority of liars, or "mean", FedBuff
	// as published, which one lying peer can poison. With a rule other
	// than the mean, peers publish their models rather than deltas (so
	// the codec must be dense: fp32, fp16, bf16 or int8, without error
	// feedback). Each peer's latest model is a standing vote, counted as
	// s(τ)·(its model − this peer's model) with τ its staleness at the
	// step, until it sends another or standingSteps (16) steps pass; the
	// votes are cut to their median length and the rule combines them
	// (staleness.BufferConfig.Rule, Models). A step needs K new models
	// from a strict majority of the live peers, this one included
	// (bufferQuorum), so that one flooding is still one vote among honest
	// ones. A peer that left counts as live until PeerTTL passes: when
	// half of the others leave at once, buffers wait that long for the
	// quorum (TestFedBuffQuorumAfterPeersLeave).
	//
	// Why models, and why standing votes: every peer keeps a model of its
	// own, and a delta, taken from its sender's model, cannot pull a
	// receiver's model back towards the others'. With votes on deltas one
	// peer of three real processes drifted off and stalled in 5 of 6 runs;
	// the mean kept IID runs together but on non-IID shards (dirichlet:0.5)
	// every peer stalled at its own accuracy, 0.70–0.89: a peer's own
	// deltas are always the freshest, so a staleness policy weighs them
	// above the others' (with "const" the mean holds, but a liar poisons
	// it). Votes on models pull the peers
	// together; standing votes keep a stopped peer's or a straggler's
	// model in every step, where votes cleared at each step had two peers
	// of three lose 9 points in the last steps of a non-IID run, taken
	// after the first peer stopped.
	BufferRule string
}

// bufferRule parses BufferRule: nil for the mean (FedBuff's running sum).
func (c AsyncConfig) bufferRule() (rule.Rule, error) {
	r, err := rule.Parse(c.BufferRule)
	if err != nil {
		return nil, err
	}
	if _, ok := r.(rule.Mean); ok {
		return nil, nil
	}
	if !r.Local() {
		return nil, fmt.Errorf("%v is not coordinate-wise: want median, trimmed:β or mean", r)
	}
	return r, (staleness.BufferConfig{K: 1, ServerLR: 1, Rule: r}).Validate()
}

// DefaultAsyncConfig returns FedAsync with the documented defaults.
func DefaultAsyncConfig() AsyncConfig {
	return AsyncConfig{
		Mode: ModeFedAsync, Model: "default", LocalSteps: 10, Alpha: 0.5, Policy: "poly:0.5",
		BufferK: 8, ServerLR: 1, Codec: "fp32", FetchTimeout: 10 * time.Second, Fetchers: 4,
		Inbox: 64, MaxAhead: 1024, PeerTTL: 10 * time.Second, SnapshotEvery: 250 * time.Millisecond,
		ClipFactor: 1, BufferRule: "median",
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
	case c.Model == "" || len(c.Model) > gossip.MaxModelIDLen:
		return bad("model id %q must have 1..%d bytes", c.Model, gossip.MaxModelIDLen)
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
	rule, err := c.bufferRule()
	if err != nil {
		return bad("buffer rule: %v", err)
	}
	if _, err := staleness.Parse(c.Policy); err != nil {
		return fmt.Errorf("%w: async: %w", ErrStrategy, err)
	}
	enc, err := compression.Parse(c.Codec)
	if err != nil {
		return fmt.Errorf("%w: async: %w", ErrStrategy, err)
	}
	if c.Mode == ModeFedBuff && rule != nil && !carriesModels(enc) {
		return bad("buffer rule %s sends models, which codec %q cannot carry: want fp32, fp16, bf16 or int8, without error feedback", c.BufferRule, c.Codec)
	}
	return nil
}

// carriesModels reports whether enc sends whole models faithfully: a
// dense codec (an entropy stage on top is fine), without error feedback,
// whose residual is meant for deltas.
func carriesModels(enc compression.Codec) bool {
	if e, ok := enc.(*compression.Entropy); ok {
		enc = e.Inner()
	}
	_, ef := enc.(*compression.ErrorFeedback)
	return !ef && compression.Dense(enc)
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
	DropSuperseded                   // FedAsync: a newer model from the same peer came before it was pulled
	DropRepeat                       // FedAsync: another model from a peer already merged in this own round
	numDropReasons
)

var dropNames = [numDropReasons]string{
	"model", "kind", "shape", "replay", "future", "stale", "nonfinite", "fetch", "decode", "overflow", "superseded", "repeat",
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
	delay func(from peer.ID) time.Duration
}

// WithDeliveryDelay delays every fetched contribution by f(sender) before
// it may be merged, without holding a pull slot: experiments use it to
// inject message delays and so staleness. f is called from several
// goroutines.
func WithDeliveryDelay(f func(from peer.ID) time.Duration) AsyncOption {
	return func(o *asyncOptions) { o.delay = f }
}

// contribution is a fetched, decoded vector waiting to be merged.
type contribution struct {
	from               peer.ID
	seq, version, base uint64
	kind               gossip.PayloadKind
	vec                []float32
	pooled             bool // vec came from asyncPeer.vecs
}

// asyncPeer is one peer's state. The run goroutine owns everything but the
// atomics and the receiver's lastSeq.
type asyncPeer struct {
	cfg   AsyncConfig
	pol   staleness.Policy
	self  peer.ID
	w     *Worker
	rec   Recorder
	start time.Time
	opts  asyncOptions

	vc    *staleness.VersionClock
	mixer *staleness.Mixer // FedAsync
	// clip and roundFrom (the peers merged in this own round) are
	// FedAsync's with ClipFactor > 0.
	clip      *rule.DistanceClip
	roundFrom map[peer.ID]bool
	buffer    *staleness.Buffer // FedBuff
	server    []float32         // FedBuff: the peer's model; training runs on w.Model.Params
	robust    bool              // FedBuff with a robust BufferRule: votes per peer, a quorum

	local   atomic.Uint64 // vc.Local() for the receiver goroutine
	peersMu sync.Mutex    // guards vc's peer table (Observe, Lag): both goroutines use it
	drops   [numDropReasons]atomic.Uint64
	seen    map[peer.ID]*seqWindow // receiver goroutine only

	merged, flushes int
	tauSum          float64

	// Buffers of fetched bytes and decoded vectors, reused: a peer pulls
	// a model-sized vector per contribution.
	bufs, vecs sync.Pool
}

func newAsyncPeer(w *Worker, self peer.ID, cfg AsyncConfig, rec Recorder, opts asyncOptions) (*asyncPeer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	pol, _ := staleness.Parse(cfg.Policy)
	p := &asyncPeer{cfg: cfg, pol: pol, self: self, w: w, rec: rec, opts: opts, start: time.Now(),
		vc: staleness.NewVersionClock(0, cfg.PeerTTL), seen: make(map[peer.ID]*seqWindow)}
	p.vc.SetStall(3 * cfg.PeerTTL)
	if cfg.Mode == ModeFedAsync && cfg.ClipFactor > 0 {
		p.clip = distanceClip(cfg.ClipFactor)
		p.roundFrom = map[peer.ID]bool{}
	}
	var err error
	if cfg.Mode == ModeFedAsync {
		p.mixer, err = staleness.NewMixer(staleness.MixerConfig{Alpha: cfg.Alpha, Policy: pol}, p.vc)
	} else {
		p.server = append([]float32(nil), w.Model.Params...)
		rule, _ := cfg.bufferRule()
		p.robust = rule != nil
		p.buffer, err = staleness.NewBuffer(len(p.server), staleness.BufferConfig{K: cfg.BufferK, ServerLR: cfg.ServerLR, Policy: pol, Rule: rule, Models: p.robust}, p.vc)
	}
	if err != nil {
		return nil, err
	}
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

func (p *asyncPeer) kind() gossip.PayloadKind {
	if p.cfg.Mode == ModeFedBuff && !p.robust {
		return gossip.KindDelta
	}
	return gossip.KindModel
}

func (p *asyncPeer) since() time.Duration { return time.Since(p.start) }

func (p *asyncPeer) drop(r DropReason, from peer.ID, tau int) {
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

// screen checks an announcement before anything is fetched. It runs on the
// receiver goroutine, which owns lastSeq.
func (p *asyncPeer) screen(a *gossip.Announcement) (DropReason, bool) {
	if a.Model != p.cfg.Model {
		return DropModel, false
	}
	if a.Kind != p.kind() {
		return DropKind, false
	}
	if int(a.Elems) != len(p.w.Model.Params) {
		return DropShape, false
	}
	win := p.seen[a.Peer]
	if win == nil {
		win = &seqWindow{}
		p.seen[a.Peer] = win
	}
	if !win.admit(a.Seq) {
		return DropReplay, false
	}
	local := p.local.Load()
	if a.Base <= local+p.cfg.MaxAhead {
		// The announced base is the version the peer works from, whether
		// or not we pull it: the SSP gate holds us while it is more than
		// the bound behind, so that what the peer sends next is within it.
		p.peersMu.Lock()
		p.vc.Observe(string(a.Peer), staleness.Version(a.Base), time.Now())
		p.peersMu.Unlock()
	}
	if a.Base > local+p.cfg.MaxAhead || a.Version > local+p.cfg.MaxAhead+uint64(p.cfg.LocalSteps)+1 {
		return DropFuture, false
	}
	if s, ok := p.pol.Bound(); ok && local > a.Base && local-a.Base > uint64(s) {
		return DropStale, false // would be rejected on arrival: do not pull it
	}
	return 0, true
}

// liveOthers returns how many other peers are live.
func (p *asyncPeer) liveOthers() int {
	p.peersMu.Lock()
	defer p.peersMu.Unlock()
	return p.vc.Live(time.Now())
}

// bufferQuorum is how many peers' votes a robust FedBuff buffer waits for
// with live other peers: a strict majority of them and this one, so that
// a minority of liars is a minority of the votes however many deltas it
// floods.
func bufferQuorum(live int) int { return (live+1)/2 + 1 }

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

// mergeVec merges or drops c.
func (p *asyncPeer) mergeVec(c *contribution) {
	if len(c.vec) != len(p.w.Model.Params) {
		p.drop(DropShape, c.from, 0)
		return
	}
	if c.kind != p.kind() {
		p.drop(DropKind, c.from, 0)
		return
	}
	// Lamport merge: a contribution computed from a version we have not
	// reached yet is fresh (τ = 0) and moves our clock forward; one beyond
	// MaxAhead is bogus.
	if local := uint64(p.vc.Local()); c.base > local {
		if c.base-local > p.cfg.MaxAhead {
			p.drop(DropFuture, c.from, 0)
			return
		}
		p.vc.Set(staleness.Version(c.base))
	}
	var (
		d   staleness.Decision
		err error
		w   float64
	)
	if p.mixer != nil {
		if p.clip != nil && c.from != p.self {
			if p.roundFrom[c.from] {
				p.drop(DropRepeat, c.from, 0)
				return
			}
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
	switch {
	case errors.Is(err, staleness.ErrShape):
		p.drop(DropShape, c.from, 0)
	case errors.Is(err, staleness.ErrNonFinite):
		p.drop(DropNonFinite, c.from, 0)
	case errors.Is(err, staleness.ErrFutureVersion):
		p.drop(DropFuture, c.from, 0)
	case err != nil:
		p.drop(DropDecode, c.from, 0)
	case d.Action != staleness.Accept:
		p.drop(DropStale, c.from, int(d.Tau))
	default:
		p.merged++
		p.tauSum += float64(d.Tau)
		if p.roundFrom != nil {
			p.roundFrom[c.from] = true
		}
		p.rec.Event(Event{Peer: p.self.String(), At: p.since(), Kind: "merge", Staleness: int(d.Tau), Weight: w})
	}
}

// RunAsync trains w asynchronously with the peers reachable through net,
// in FedAsync or FedBuff mode, until ctx ends (the normal way to stop it:
// it then returns nil) or cfg.MaxSteps local steps are done.
//
// Each round the peer trains LocalSteps steps from its current model,
// publishes the result (FedAsync: the model; FedBuff: the delta from the
// round's start) with its base version, and merges what other peers
// published meanwhile, each weighted by the staleness policy. Versions
// are Lamport clocks: every merged contribution and every own round ticks
// the local version, and a contribution from a peer that is ahead moves it
// forward, so τ = local − base counts the updates a contribution missed.
//
// A receiver goroutine screens announcements (model id, kind, length,
// replay, versions too far ahead, beyond the SSP bound) before pulling
// anything and queues them; Fetchers pullers fetch (each with
// FetchTimeout), decode and hand them to the run loop, which merges between
// rounds. In FedAsync mode a model still waiting to be pulled is replaced
// by a newer one from the same peer. Every drop is counted by reason and recorded as
// an Event "drop:<reason>"; no dropped contribution touches the model. A
// dead peer only means fewer contributions. With an SSP bound in the
// policy, a peer more than the bound ahead of the slowest live peer waits
// (merging what arrives) before its next round.
func RunAsync(ctx context.Context, w *Worker, net AsyncNet, cfg AsyncConfig, rec Recorder, opts ...AsyncOption) (*AsyncSummary, error) {
	var o asyncOptions
	for _, opt := range opts {
		opt(&o)
	}
	p, err := newAsyncPeer(w, net.Self(), cfg, rec, o)
	if err != nil {
		return nil, err
	}
	enc, _ := compression.Parse(cfg.Codec)
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
		if at := p.since(); force || at-lastSnap >= cfg.SnapshotEvery {
			p.rec.Snapshot(p.self.String(), at, w.Steps, p.model())
			lastSnap = at
		}
	}
	snapshot(true)
	for round := 0; ; round++ {
		if ctx.Err() != nil || (cfg.MaxSteps > 0 && w.Steps >= cfg.MaxSteps) {
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
		steps := cfg.LocalSteps
		if cfg.MaxSteps > 0 {
			steps = min(steps, cfg.MaxSteps-w.Steps)
		}
		loss, steps, err := p.localSteps(ctx, steps, snapshot)
		if err != nil {
			if ctx.Err() == nil {
				runErr = err
			}
			break
		}
		p.rec.Event(Event{Peer: p.self.String(), At: p.since(), Kind: "round", Loss: loss})
		clear(p.roundFrom)
		vec := w.Model.Params // FedAsync, and FedBuff with a robust rule: the model
		if p.server != nil && !p.robust {
			delta = growVec(delta, len(vec))
			for i := range vec {
				delta[i] = vec[i] - p.server[i]
			}
			vec = delta
		} else if p.server == nil {
			p.vc.Tick() // the own round is an update of the model
		}
		p.local.Store(uint64(p.vc.Local()))
		payload = enc.Encode(payload, vec)
		sum.Rounds++
		a := gossip.Announcement{
			Version: uint64(p.vc.Local()), Base: base, Kind: p.kind(), Codec: enc.ID(),
			Elems: uint32(len(vec)), Samples: uint64(steps * w.Config().Batch), Loss: finiteF32(loss),
			Key: fmt.Sprintf("%s/%d", cfg.Mode, round),
		}
		pctx, cancel := context.WithTimeout(ctx, cfg.FetchTimeout)
		if err := net.Publish(pctx, a, payload); err == nil {
			sum.Published++
			p.rec.Event(Event{Peer: p.self.String(), At: p.since(), Kind: "publish", Bytes: int64(len(payload))})
		}
		cancel()
		if p.server != nil { // FedBuff: the own delta (or model) joins the own buffer
			p.merge(&contribution{from: p.self, version: a.Version, base: base, kind: p.kind(), vec: vec})
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
// first) and returns their mean loss and number, taking snapshots between
// steps (so a slow peer's curve has points inside its long rounds).
func (p *asyncPeer) localSteps(ctx context.Context, k int, snapshot func(bool)) (float64, int, error) {
	sum := 0.0
	start := time.Now()
	i := 0
	for ; i < k; i++ {
		if i > 0 && p.cfg.RoundTime > 0 && time.Since(start) >= p.cfg.RoundTime {
			break
		}
		loss, err := p.w.Step(ctx)
		if err != nil {
			return 0, i, err
		}
		sum += loss
		snapshot(false)
		// Let the receiver and fetchers run: a compute-bound loop keeps
		// them waiting for a P until the scheduler preempts it (10 ms),
		// which shows up as staleness.
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

// gate holds the next round while the SSP bound says wait, merging what
// arrives. Peers silent for PeerTTL stop counting, and so do peers stuck
// at a version for 3×PeerTTL, so it cannot wait forever on a dead, hung or
// lying peer.
func (p *asyncPeer) gate(ctx context.Context, inbox <-chan *contribution) (time.Duration, error) {
	if _, ok := p.pol.Bound(); !ok {
		return 0, ctx.Err()
	}
	start := time.Now()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		p.peersMu.Lock()
		lag := p.vc.Lag(time.Now())
		p.peersMu.Unlock()
		if p.pol.Gate(lag).Action != staleness.Wait {
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
// slow holders; in FedAsync mode a queued model announcement is replaced by
// a newer one from the same peer (DropSuperseded), since the newer model
// already holds the older one's work.
func (p *asyncPeer) receive(ctx context.Context, net AsyncNet, inbox chan *contribution, wg *sync.WaitGroup) {
	q := newPullQueue(p.cfg.Mode == ModeFedAsync, 4*p.cfg.Inbox)
	for range p.cfg.Fetchers {
		wg.Go(func() { p.puller(ctx, net, q, inbox, wg) })
	}
	for {
		a, err := net.Next(ctx)
		if err != nil {
			return
		}
		if r, ok := p.screen(a); !ok {
			tau := 0
			if l := p.local.Load(); l > a.Base {
				tau = int(l - a.Base)
			}
			p.drop(r, a.Peer, tau)
			continue
		}
		if old, r := q.push(a); old != nil {
			p.drop(r, old.Peer, 0)
		}
	}
}

// puller pulls queued announcements until ctx ends. A delivery delay runs
// on its own goroutine, so it holds no pull slot.
func (p *asyncPeer) puller(ctx context.Context, net AsyncNet, q *pullQueue, inbox chan *contribution, wg *sync.WaitGroup) {
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

// pullQueue holds screened announcements waiting to be pulled, oldest
// first, bounded by max (the oldest is dropped beyond it). With coalesce, at
// most one announcement per peer waits: a newer one takes the older one's
// place in the queue. Safe for concurrent use.
type pullQueue struct {
	mu       sync.Mutex
	items    []*gossip.Announcement
	byPeer   map[peer.ID]*gossip.Announcement
	coalesce bool
	max      int
	ready    chan struct{}
}

func newPullQueue(coalesce bool, max int) *pullQueue {
	return &pullQueue{byPeer: make(map[peer.ID]*gossip.Announcement), coalesce: coalesce, max: max, ready: make(chan struct{}, 1)}
}

// push queues a and returns the announcement it displaced, if any, and why.
func (q *pullQueue) push(a *gossip.Announcement) (*gossip.Announcement, DropReason) {
	q.mu.Lock()
	defer q.mu.Unlock()
	defer q.wake()
	if q.coalesce {
		if old := q.byPeer[a.Peer]; old != nil {
			prev := *old
			*old = *a // keeps the older one's place
			return &prev, DropSuperseded
		}
		q.byPeer[a.Peer] = a
	}
	q.items = append(q.items, a)
	if len(q.items) <= q.max {
		return nil, 0
	}
	d := q.items[0]
	q.items = q.items[1:]
	if q.byPeer[d.Peer] == d {
		delete(q.byPeer, d.Peer)
	}
	return d, DropOverflow
}

func (q *pullQueue) wake() {
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// pop takes the oldest announcement, waiting for one until ctx ends.
func (q *pullQueue) pop(ctx context.Context) (*gossip.Announcement, bool) {
	for {
		q.mu.Lock()
		if len(q.items) > 0 {
			a := q.items[0]
			q.items = q.items[1:]
			if q.byPeer[a.Peer] == a {
				delete(q.byPeer, a.Peer)
			}
			if len(q.items) > 0 {
				q.wake() // another puller may take the next
			}
			q.mu.Unlock()
			return a, true
		}
		q.mu.Unlock()
		select {
		case <-q.ready:
		case <-ctx.Done():
			return nil, false
		}
	}
}

// pull fetches and decodes one announced vector.
func (p *asyncPeer) pull(ctx context.Context, net AsyncNet, a *gossip.Announcement) (*contribution, DropReason, bool) {
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
		if errors.Is(err, compression.ErrLength) {
			return nil, DropShape, false
		}
		return nil, DropDecode, false
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

// seqWindow admits each sequence number of one sender once: numbers above
// the highest seen, or up to 64 below it if not seen yet (announcements
// may arrive out of order); everything else is a replay.
type seqWindow struct {
	top  uint64
	bits uint64 // bit i: top−i was seen
}

func (w *seqWindow) admit(seq uint64) bool {
	switch {
	case w.bits == 0 || seq > w.top:
		shift := seq - w.top
		if w.bits == 0 || shift >= 64 {
			w.bits = 1
		} else {
			w.bits = w.bits<<shift | 1
		}
		w.top = seq
		return true
	case w.top-seq >= 64:
		return false
	}
	bit := uint64(1) << (w.top - seq)
	if w.bits&bit != 0 {
		return false
	}
	w.bits |= bit
	return true
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
