package train

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/starling-ml/starling/device"
	"github.com/starling-ml/starling/internal/ctxtime"
	"github.com/starling-ml/starling/internal/spec"
	"github.com/starling-ml/starling/peerid"
	"github.com/starling-ml/starling/trace"
)

// FedConfig configures serverless federated learning. Every peer of a
// federation must use the same settings.
type FedConfig struct {
	// Strategy is fedavg, fedprox, fedadam, fedyogi, fedadagrad, diloco,
	// streaming-diloco or async-diloco (both Streaming).
	Strategy string
	// Rounds is the number of rounds to run.
	Rounds int
	// Fraction is C, the fraction of live peers sampled each round (at
	// least one peer is always sampled).
	Fraction float64
	// GroupSize bounds the averaging groups: a round whose sample holds
	// more peers splits it into groups of at most GroupSize, drawn afresh
	// each round from (Seed, round, sample) by aggregate.Partition, and
	// each group averages on its own; the groups' models differ until later
	// rounds mix them. 0 averages the whole sample as one group. 16
	// (hivemind's target_group_size is of that order: a group's all-reduce
	// is then a few hops, and one slow peer holds up 15 others, not all).
	// Streaming DiLoCo ignores it.
	GroupSize int
	// LocalEpochs is E, passes over the peer's shard per round. When zero,
	// LocalSteps sets the local work instead.
	LocalEpochs int
	// LocalSteps is H, local steps per round when LocalEpochs is zero
	// (DiLoCo's inner steps).
	LocalSteps int
	// Mu is FedProx's proximal weight μ.
	Mu float32
	// ServerLR is the server (outer) learning rate: 1 for FedAvg, η for
	// FedOpt (0.01 in Reddi et al. for Adam/Yogi), 0.7 for DiLoCo.
	ServerLR float32
	// ServerMomentum is DiLoCo's outer Nesterov momentum (0.9).
	ServerMomentum float32
	// Fragments is Streaming DiLoCo's F: the model's tensors form F
	// strided fragments, synchronised one at a time (1 is DiLoCo sending
	// outer gradients).
	Fragments int
	// Alpha is Streaming DiLoCo's mixing factor α: after a fragment's
	// outer step the local fragment becomes α·local + (1−α)·global.
	Alpha float32
	// Overlap is Streaming DiLoCo's τ: the inner steps a fragment's
	// all-reduce overlaps before its result is merged (< H; beyond H/F
	// the all-reduces of successive fragments run at once).
	Overlap int
	// FragmentRetry is how far apart, counted from the first try's start,
	// Streaming DiLoCo tries a fragment's failed all-reduce again (twice)
	// with a fresh member list; 0 never retries. It must exceed how long
	// a failing all-reduce takes (about twice its stall timeout), so that
	// every survivor, however fast its own try failed, retries at the same
	// time.
	FragmentRetry time.Duration
	// Seed drives client sampling; all peers must share it.
	Seed uint64
	// RoundTimeout bounds one round: fetching state, local training and the
	// all-reduce.
	RoundTimeout time.Duration
	// ResetClientOpt starts every round's local optimiser from fresh state
	// (FedAvg's clients do); DiLoCo keeps its inner AdamW state.
	ResetClientOpt bool
	// Resume, if set, starts the peer from a checkpointed global state
	// instead of its model's initial parameters.
	Resume *FedState
	// CatchUp is how long a starting peer looks for a newer global state
	// among the live members (a late joiner or a restarted peer pulls it
	// instead of redoing rounds). 0 skips the look.
	CatchUp time.Duration
}

// FedState is a peer's global state: the version (rounds applied) and the
// vector [global parameters | server optimiser state].
type FedState struct {
	Version uint64
	State   []float32
}

// DefaultFedConfig returns FedAvg with C = 0.1 and E = 1, as in McMahan et
// al. 2017's MNIST experiments.
func DefaultFedConfig() FedConfig {
	return FedConfig{Strategy: "fedavg", Rounds: 100, Fraction: 0.1, GroupSize: 16, LocalEpochs: 1, ServerLR: 1, Seed: 1,
		RoundTimeout: 2 * time.Minute, ResetClientOpt: true, CatchUp: 2 * time.Second, FragmentRetry: 21 * time.Second}
}

// ParseStrategy sets Strategy and its parameters from a flag value such as
// "fedavg", "fedprox:mu=0.01", "fedadam:lr=0.01", "fedyogi", "fedadagrad",
// "diloco:h=50,lr=0.7,momentum=0.9",
// "streaming-diloco:h=100,fragments=4,alpha=0.5,overlap=0,lr=0.7,momentum=0.9",
// "async-diloco:h=50,lr=0.7,momentum=0.9", filling the papers' defaults.
func (c *FedConfig) ParseStrategy(s string) error {
	t, err := spec.One(s)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrStrategy, err)
	}
	r := t.Reader()
	r.Keyed()
	lr := func(def float64) float32 { return float32(r.Float("lr", def, spec.Positive())) }
	c.Strategy = t.Name
	switch t.Name {
	case "fedavg":
		c.ServerLR = lr(1)
		c.ResetClientOpt = true
	case "fedprox":
		c.Mu = float32(r.Float("mu", 0.01, spec.AtLeast(0)))
		c.ServerLR = lr(1)
		c.ResetClientOpt = true
	case "fedadam", "fedyogi":
		c.ServerLR = lr(0.01)
		c.ResetClientOpt = true
	case "fedadagrad":
		c.ServerLR = lr(0.1)
		c.ResetClientOpt = true
	case "diloco":
		c.ServerLR = lr(0.7)
		c.ServerMomentum = float32(r.Float("momentum", 0.9, spec.In(0, 1, true, false)))
		c.LocalSteps, c.LocalEpochs = r.Int("h", 50, 1, math.MaxInt32), 0
		c.ResetClientOpt = false
	case "streaming-diloco":
		c.ServerLR = lr(0.7)
		c.ServerMomentum = float32(r.Float("momentum", 0.9, spec.In(0, 1, true, false)))
		c.LocalSteps, c.LocalEpochs = r.Int("h", 100, 1, math.MaxInt32), 0
		c.Fragments = r.Int("fragments", 4, 1, 1<<16)
		c.Alpha = float32(r.Float("alpha", 0.5, spec.In(0, 1, true, true)))
		c.Overlap = r.Int("overlap", 0, 0, math.MaxInt32)
		c.ResetClientOpt = false
	case "async-diloco":
		// DiLoCo whose outer step is applied one outer step late (PCCL's
		// async DiLoCo): one fragment whose all-reduce overlaps all H
		// inner steps of the next outer step.
		c.ServerLR = lr(0.7)
		c.ServerMomentum = float32(r.Float("momentum", 0.9, spec.In(0, 1, true, false)))
		c.LocalSteps, c.LocalEpochs = r.Int("h", 50, 1, math.MaxInt32), 0
		c.Fragments, c.Overlap, c.Alpha = 1, c.LocalSteps, 0
		c.ResetClientOpt = false
	default:
		return fmt.Errorf("%w: %w", ErrStrategy, t.Errorf("unknown strategy %q (want fedavg, fedprox, fedadam, fedyogi, fedadagrad, diloco, streaming-diloco or async-diloco)", t.Name))
	}
	if err := r.Done(); err != nil {
		return fmt.Errorf("%w: %w", ErrStrategy, err)
	}
	return nil
}

// Streams reports whether the strategy runs as Streaming: streaming-diloco
// or async-diloco.
func (c FedConfig) Streams() bool {
	return c.Strategy == "streaming-diloco" || c.Strategy == "async-diloco"
}

// Validate reports settings that cannot work.
func (c FedConfig) Validate() error {
	switch {
	case c.Rounds <= 0:
		return fmt.Errorf("%w: rounds must be positive", ErrStrategy)
	case !(c.Fraction > 0 && c.Fraction <= 1):
		return fmt.Errorf("%w: fraction C must be in (0, 1], got %v", ErrStrategy, c.Fraction)
	case c.GroupSize < 0:
		return fmt.Errorf("%w: group size must not be negative, got %d", ErrStrategy, c.GroupSize)
	case c.LocalEpochs < 0 || c.LocalSteps < 0 || (c.LocalEpochs == 0 && c.LocalSteps == 0):
		return fmt.Errorf("%w: set local epochs E or local steps H", ErrStrategy)
	case !(c.ServerLR > 0):
		return fmt.Errorf("%w: server learning rate must be positive", ErrStrategy)
	case c.Mu < 0 || math.IsNaN(float64(c.Mu)):
		return fmt.Errorf("%w: FedProx μ must not be negative", ErrStrategy)
	case c.RoundTimeout <= 0:
		return fmt.Errorf("%w: round timeout must be positive", ErrStrategy)
	case c.FragmentRetry < 0:
		return fmt.Errorf("%w: fragment retry must not be negative", ErrStrategy)
	}
	if c.Strategy == "async-diloco" && (c.Fragments != 1 || c.Overlap != c.LocalSteps) {
		return fmt.Errorf("%w: async-diloco has one fragment and overlaps all h = %d inner steps, got fragments=%d, overlap=%d", ErrStrategy, c.LocalSteps, c.Fragments, c.Overlap)
	}
	if c.Strategy == "streaming-diloco" {
		switch {
		case c.Fragments < 1 || c.LocalSteps < c.Fragments:
			return fmt.Errorf("%w: streaming-diloco needs 1 ≤ fragments ≤ h, got fragments=%d, h=%d", ErrStrategy, c.Fragments, c.LocalSteps)
		case c.Overlap < 0 || c.Overlap >= c.LocalSteps:
			return fmt.Errorf("%w: streaming-diloco overlap %d must be below h = %d", ErrStrategy, c.Overlap, c.LocalSteps)
		case !(c.Alpha >= 0 && c.Alpha <= 1):
			return fmt.Errorf("%w: streaming-diloco alpha %v not in [0, 1]", ErrStrategy, c.Alpha)
		}
	}
	return nil
}

// newServerOpt builds the strategy's server optimiser for n parameters.
func (c FedConfig) newServerOpt(n int) (ServerOpt, error) {
	switch c.Strategy {
	case "fedavg", "fedprox", "":
		return &FedAvgServer{LR: c.ServerLR}, nil
	case "fedadam", "fedyogi", "fedadagrad":
		return NewFedOptServer(strings.TrimPrefix(c.Strategy, "fed"), c.ServerLR, n)
	case "diloco", "streaming-diloco", "async-diloco":
		return NewNesterovServer(c.ServerLR, c.ServerMomentum, n), nil
	}
	return nil, fmt.Errorf("%w: unknown strategy %q", ErrStrategy, c.Strategy)
}

// Sample returns the peers of members taking part in a round: ⌈C·n⌉ of
// them (at least one), chosen by a hash of (seed, round, peer), so every
// peer with the same member list derives the same sample. The result is
// sorted.
func Sample(seed, round uint64, members []peerid.ID, fraction float64) []peerid.ID {
	n := len(members)
	if n == 0 {
		return nil
	}
	k := min(n, max(1, int(math.Ceil(fraction*float64(n)-1e-9))))
	type keyed struct {
		h uint64
		p peerid.ID
	}
	ks := make([]keyed, n)
	for i, p := range members {
		ks[i] = keyed{device.Hash64(seed^round*0x9e3779b97f4a7c15, fnv64(string(p))), p}
	}
	slices.SortFunc(ks, func(a, b keyed) int {
		if a.h != b.h {
			if a.h < b.h {
				return -1
			}
			return 1
		}
		return strings.Compare(string(a.p), string(b.p))
	})
	out := make([]peerid.ID, k)
	for i := range out {
		out[i] = ks[i].p
	}
	slices.Sort(out)
	return out
}

func fnv64(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// The waits of a federated peer's loops (see docs/design.md).
const (
	// catchUpPoll is how often a starting peer looks for the others.
	catchUpPoll = 100 * time.Millisecond
	// catchUpFetch bounds a starting peer's fetch of the newest state.
	catchUpFetch = 1500 * time.Millisecond
	// fetchFanout is how many peers one attempt of a state fetch asks at
	// once (fetchFrom): enough for the swarm's striped pull (three
	// stripes) and a spare. Asking every member at once cost a joiner or
	// a catch-up of a 256-client federation 255 streams, each with its
	// buffers (a goroutine dump held 59 joiners doing so, and 8,723 state
	// requests waiting for a dial, at 10.9 GiB).
	fetchFanout = 4
	// blindFetch bounds an attempt that asks peers no status names as
	// holders of the state: statuses lag, so one of them may hold it, or
	// produce it while asked; the next attempt looks at the statuses again.
	blindFetch = 2 * time.Second
	// fetchPause separates a fetch's failed attempts, so that peers that
	// refuse at once do not make it spin.
	fetchPause = 50 * time.Millisecond
	// majorityPoll is how often a minority peer looks for the majority.
	majorityPoll = 200 * time.Millisecond
	// alignPoll is how often a peer lining up for a round looks at the
	// others' versions.
	alignPoll = 50 * time.Millisecond
	// alignWait bounds that (with a quarter of the round timeout): long
	// enough for a heartbeat or two to show where the others are, short
	// enough to stay well inside an all-reduce's stall timeout.
	alignWait = 1500 * time.Millisecond
	// progressPoll is how often a peer waiting for a state that rounds
	// still running will produce looks at the others' versions
	// (whileProgressing): its patience is a round timeout, and a look
	// builds every peer's status (a map of the swarm, at 256 peers).
	progressPoll = 250 * time.Millisecond
	// overtakeGrace is how long (with a quarter of the round timeout at
	// most) peers of a group must have said they finished round r before
	// a peer still in round r's all-reduce gives it up and takes their
	// state (watchOvertaken). The members of one all-reduce commit within
	// moments of each other (the last votes' hop), and a member that
	// committed may say so before this one returns: far longer than that,
	// short against the round timeout the all-reduce would wait.
	overtakeGrace = 1500 * time.Millisecond
)

// fedPeer is one federated peer's view of the others: the network, and
// the peers it saw announce that they stopped.
type fedPeer struct {
	net   Net
	cfg   FedConfig
	rec   Recorder
	self  peerid.ID
	start time.Time
	// departed holds the peers whose status said Done (noteDepartures).
	departed map[peerid.ID]bool
	// joinAt is the first round this peer takes part in (joinRound;
	// JoinPending until it is chosen), which its status carries.
	joinAt uint64
}

// members returns the live members and notes the peers that stopped (or
// came back).
func (f *fedPeer) members() []peerid.ID {
	m, _ := f.look()
	return m
}

// look returns the live members and the others' statuses, and notes the
// peers that stopped (or came back).
func (f *fedPeer) look() ([]peerid.ID, map[peerid.ID]Status) {
	st := f.net.Statuses()
	noteDepartures(f.departed, st)
	return f.net.Members(), st
}

func (f *fedPeer) quorate(members, ref []peerid.ID) bool {
	return quorate(f.self, f.departed, members, ref)
}

func (f *fedPeer) event(kind, detail string) {
	if f.rec != nil {
		f.rec.Event(Event{Peer: string(f.self), At: time.Since(f.start), Kind: kind, Detail: detail})
	}
}

// publish serves state as version and says so in this peer's status.
func (f *fedPeer) publish(ctx context.Context, version uint64, state []float32) {
	f.net.Publish(version, state)
	f.net.SetStatus(ctx, Status{Version: version, JoinAt: f.joinAt})
}

// awaitFounders waits for the peers that started beside this one, and
// have not chosen their first round yet, to do so: as long as others keep
// declaring, it gives the rest up to alignWait (a quarter of the round
// timeout at most) after the last declaration, and a round timeout in
// all. A fixed alignWait from its start was too short where starting
// peers share a loaded CPU: 256 clients on 2 cores declared over 2 s, and
// founders that went on formed round 1 from different members.
func (f *fedPeer) awaitFounders(ctx context.Context) error {
	start := time.Now()
	st := f.net.Statuses()
	watch := newProgressWatch(start, declared(st))
	patience := min(f.cfg.RoundTimeout/4, alignWait)
	for anyPending(st) {
		now := time.Now()
		if watch.stalled(now, declared(st), patience) || now.Sub(start) >= f.cfg.RoundTimeout {
			return nil
		}
		if err := ctxtime.Sleep(ctx, alignPoll); err != nil {
			return err
		}
		st = f.net.Statuses()
	}
	return nil
}

// awaitMajority waits, up to cfg.RoundTimeout, until the members at round
// r are quorate for ref again, and returns them. After the wait it goes
// on with the members it sees, which it returns with ok false: the others
// are taken for dead.
func (f *fedPeer) awaitMajority(ctx context.Context, r uint64, ref, members []peerid.ID) (_ []peerid.ID, ok bool, err error) {
	in, total := tally(f.self, f.departed, members, ref)
	f.event("minority", fmt.Sprintf("round %d: %d of the last round's %d peers reachable; waiting up to %v for a majority of them", r, in, total, f.cfg.RoundTimeout))
	deadline := time.Now().Add(f.cfg.RoundTimeout)
	for {
		if err := ctxtime.Sleep(ctx, majorityPoll); err != nil {
			return nil, false, err
		}
		members = f.members()
		if f.quorate(members, ref) {
			f.event("majority", fmt.Sprintf("round %d: a majority of the last round's peers is back", r))
			return members, true, nil
		}
		if time.Now().After(deadline) {
			f.event("minority", fmt.Sprintf("round %d: no majority of the last round's %d peers within %v; going on with %d", r, total, f.cfg.RoundTimeout, len(members)))
			return members, false, nil
		}
	}
}

// alignRound lines up with the other peers of its group of round r
// (planAlign), looking for up to wait: if one has already finished round
// r, it fetches the newest state into state and returns its version (else
// it returns version). With wait 0 it looks once.
func (f *fedPeer) alignRound(ctx context.Context, state []float32, version, r uint64, sampled []peerid.ID, wait time.Duration) (uint64, error) {
	deadline := time.Now().Add(wait)
	for {
		plan := planAlign(f.self, r, sampled, liveVersions(f.net.Statuses()))
		if len(plan.fetch) > 0 {
			fctx, cancel := context.WithTimeout(ctx, f.cfg.RoundTimeout/4)
			v, err := f.fetchFrom(fctx, plan.fetch, r, state)
			cancel()
			if err == nil {
				return v, nil
			}
			if ctx.Err() != nil {
				return version, ctx.Err()
			}
		}
		if plan.ready || time.Now().After(deadline) {
			return version, nil
		}
		if err := ctxtime.Sleep(ctx, alignPoll); err != nil {
			return version, err
		}
	}
}

// watchOvertaken returns a context that ends with ctx or once peers of
// group, by their statuses, have finished round r (overtaken) for
// overtakeGrace: an all-reduce of round r that waits for such a peer would
// wait until the round timeout, since the peer is alive and answers the
// all-reduce's probes, but never sends round r's data. stop ends the
// watch and returns those peers (nil if it did not end the round).
func (f *fedPeer) watchOvertaken(ctx context.Context, r uint64, group []peerid.ID) (_ context.Context, stop func() []peerid.ID) {
	grace := min(f.cfg.RoundTimeout/4, overtakeGrace)
	var watch overtakeWatch
	var ahead []peerid.ID // written by the watch's goroutine, read after it ends
	wctx, end := watchCtx(ctx, alignPoll, func(now time.Time) error {
		p := overtaken(f.self, r, group, liveVersions(f.net.Statuses()))
		if !watch.look(now, p, grace) {
			return nil
		}
		ahead = p
		return errOvertaken
	})
	return wctx, func() []peerid.ID {
		end()
		return ahead
	}
}

// errOvertaken ends a round's all-reduce whose group went on without this
// peer (watchOvertaken).
var errOvertaken = errors.New("train: peers of the group finished the round without this one")

// watchCtx returns a context that ends with ctx or, once check (called
// every period, on one goroutine) returns an error, with that error as
// its cause. stop ends the watch and waits for the goroutine.
func watchCtx(ctx context.Context, period time.Duration, check func(now time.Time) error) (_ context.Context, stop func()) {
	wctx, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-wctx.Done():
				return
			case <-t.C:
			}
			if err := check(time.Now()); err != nil {
				cancel(err)
				return
			}
		}
	}()
	return wctx, func() {
		cancel(nil)
		<-done
	}
}

// ErrNoState reports that no peer could provide the global state.
var ErrNoState = errors.New("train: no peer provided the global state")

// RoundInfo describes a finished round as one participant saw it.
type RoundInfo struct {
	Round        uint64
	Participants []peerid.ID // the group whose contributions were averaged
	Sampled      []peerid.ID
	Global       []float32 // the new global parameters (a view; copy to keep)
	State        []float32 // the whole global state (a view), for checkpoints
	Loss         float64   // this peer's mean local training loss
	Elapsed      time.Duration
	// Failed reports a round that failed everywhere this peer could see:
	// the state is the previous one, relabelled with this round.
	Failed bool
	// Synced reports a state this peer fetched from others (it missed the
	// round's all-reduce but not its result).
	Synced bool
	// Err is why the round failed for this peer (nil if it did not).
	Err error
}

// Federated runs serverless federated learning for one peer: each round
// it checks whether it is sampled; if so it brings its global state up to
// date (fetching it from the previous round's participants when it missed
// rounds), trains locally from the global model, all-reduces its delta
// with the other sampled peers of its group weighted by shard size (all
// of them, unless the sample is larger than GroupSize), and applies the
// server optimiser to the averaged delta, identically on every
// participant of the group. onRound, if not nil, is called after each round this peer
// took part in; returning true stops the peer. A peer that stops before
// the last round tells the others so (a Done status). A round that
// fails for this peer leaves it the previous state as that round's
// version; the next round it joins brings it back in line, and after a
// failed last round it takes the others' final state if they have one.
//
// Each round is look → decide → act: the peer reads the members and
// statuses, decides with the pure functions of fedplan.go (quorate,
// planRound, planAlign, judgeRound, finalFrom) and does what they say.
func Federated(ctx context.Context, w *Worker, net Net, cfg FedConfig, rec Recorder, onRound func(RoundInfo) bool) error {
	if cfg.Streams() {
		return Streaming(ctx, w, net, cfg, rec, onRound)
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	params := w.Model.Params
	n := len(params)
	server, err := cfg.newServerOpt(n)
	if err != nil {
		return err
	}
	st := server.State()
	state := make([]float32, n+len(st)) // [global params | server state]
	copy(state, params)
	global := state[:n]
	// send/avg: [local params] for plain averaging, else [local params |
	// global state] (see fedRound).
	vec := n
	if fa, ok := server.(*FedAvgServer); !ok || fa.LR != 1 {
		vec = n + len(state)
	}
	send := make([]float32, vec)
	avg := make([]float32, vec)
	delta := make([]float32, n)
	var version uint64
	completed := false // every round done, whether sampled or not
	start := time.Now()
	self := net.Self()
	f := &fedPeer{net: net, cfg: cfg, rec: rec, self: self, start: start, departed: map[peerid.ID]bool{}, joinAt: JoinPending}
	defer func() {
		if !completed && version < uint64(cfg.Rounds) { // stopped early, whatever the reason
			announceStop(ctx, func(ctx context.Context) { net.SetStatus(ctx, Status{Version: version, Done: true}) })
		}
	}()
	// ref is the membership of the last round this peer completed, else
	// the first view of the others it had (see quorate).
	var ref []peerid.ID
	if cfg.Resume != nil {
		if len(cfg.Resume.State) != len(state) {
			return fmt.Errorf("%w: checkpointed state has %d values, %s with %s needs %d", ErrStrategy, len(cfg.Resume.State), w.Model.Arch, cfg.Strategy, len(state))
		}
		copy(state, cfg.Resume.State)
		copy(st, state[n:])
		version = cfg.Resume.Version
	}
	// Until it has chosen its first round, no round takes this peer in
	// (admitted): the others never wait for a peer still starting up.
	f.publish(ctx, version, state)
	if cfg.CatchUp > 0 {
		// A late or restarted peer takes the newest state the others hold:
		// it looks for them for up to CatchUp, then asks them without
		// waiting for newer versions.
		deadline := time.Now().Add(cfg.CatchUp)
		for {
			members := f.members()
			if others := othersOf(self, members); len(others) > 0 {
				ref = members
				cctx, cancel := context.WithTimeout(ctx, catchUpFetch)
				v, err := f.fetchFrom(cctx, others, version+1, state)
				cancel()
				if err == nil {
					copy(st, state[n:])
					version = v
					f.event("caught-up", fmt.Sprintf("version %d", v))
				}
				break
			}
			if time.Now().After(deadline) {
				break
			}
			if err := ctxtime.Sleep(ctx, catchUpPoll); err != nil {
				return err
			}
		}
	}
	copy(w.Model.Params, global)
	// Choose the first round, at a boundary every running peer hears of
	// before it forms that round's group, and say so.
	f.joinAt = joinRound(version, f.net.Statuses())
	f.event("join", fmt.Sprintf("version %d: joining at round %d", version, f.joinAt))
	f.publish(ctx, version, state)
	if f.joinAt == version+1 {
		if err := f.awaitFounders(ctx); err != nil {
			return err
		}
	}
	if version > 0 && (cfg.Resume == nil || version > cfg.Resume.Version) && onRound != nil {
		if onRound(RoundInfo{Round: version, Synced: true, Global: global, State: state, Elapsed: time.Since(start)}) {
			return nil
		}
	}

	// adopt makes the state fetched into state, of version v, this peer's
	// and reports it as synced; it returns onRound's verdict.
	adopt := func(v uint64) (stop bool) {
		version = v
		copy(st, state[n:])
		copy(w.Model.Params, global)
		f.publish(ctx, version, state)
		return onRound != nil && onRound(RoundInfo{Round: version, Synced: true, Global: global, State: state, Elapsed: time.Since(start)})
	}
	align := true       // line up with the others before the next round joined
	lastFailed := false // the newest version is a failed round's, relabelled
	for r := version + 1; r <= uint64(cfg.Rounds); r++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		if version >= r || r < f.joinAt {
			continue // fetched past this round, or not joined yet
		}
		if r == f.joinAt && version+1 < r {
			// Joining a running federation: wait for the state round r
			// starts from, which the others publish as they finish r−1.
			from := othersOf(self, f.members())
			if v, err := f.fetchWhileProgressing(ctx, from, r-1, state); err == nil {
				if adopt(v) {
					return nil
				}
				if v >= r {
					continue
				}
			} else if ctx.Err() != nil {
				return ctx.Err()
			}
		}
		members, statuses := f.look()
		if ref == nil {
			ref = members // before a first completed round: the first view
		}
		if !f.quorate(members, ref) {
			var back bool
			var err error
			if members, back, err = f.awaitMajority(ctx, r, ref, members); err != nil {
				return err
			}
			if !back {
				ref = members // the others are taken for dead
			}
			statuses = f.net.Statuses()
			align = true // the majority may be rounds ahead
		}
		plan := planRound(cfg.Seed, cfg.Fraction, cfg.GroupSize, self, r, version,
			admitted(self, f.joinAt, r, members, statuses), admitted(self, f.joinAt, r-1, members, statuses))
		if !plan.join {
			continue
		}
		// Line up with the group: after a start or a failed round, give
		// laggards a moment; at every other round, look once whether a
		// peer of the group is already past round r. Statuses lag and
		// never lead, so one that is has finished round r without this
		// peer: the other half of a healed partition, rounds ahead, whose
		// all-reduce this peer could not join (see planAlign).
		wait := time.Duration(0)
		if align {
			wait = min(cfg.RoundTimeout/4, alignWait)
		}
		v, err := f.alignRound(ctx, state, version, r, plan.group, wait)
		if err != nil {
			return err
		}
		align = false
		if v > version {
			f.event("caught-up", fmt.Sprintf("round %d: took version %d from peers ahead", r, v))
			if adopt(v) {
				return nil
			}
			continue
		}
		before := version
		var (
			info   RoundInfo
			synced bool
		)
		if plan.behind {
			// Missed rounds: take the state after round r−1 first, as
			// long as the rounds before r, still running, go on
			// completing; the round's timeout starts after it.
			synced, err = f.fetchBehind(ctx, server, state, n, &version, r, plan.from)
		}
		if err == nil && !synced {
			rctx, cancel := context.WithTimeout(ctx, cfg.RoundTimeout)
			info, synced, err = f.round(rctx, w, server, state, send, avg, delta, &version, r, plan)
			cancel()
		}
		if err != nil && ctx.Err() != nil {
			return ctx.Err()
		}
		verdict := judgeRound(err, synced, version != before)
		if verdict.fatal {
			return err
		}
		if verdict.failed {
			f.event("round-failed", err.Error())
			align = true
		}
		if verdict.reference {
			ref = members
		}
		if !verdict.report {
			continue
		}
		info.Round = version
		info.Failed = verdict.lost
		lastFailed = verdict.lost
		info.Synced = synced
		info.Err = err
		info.Global = global
		info.State = state
		info.Elapsed = time.Since(start)
		if rec != nil {
			rec.Snapshot(string(self), info.Elapsed, int(version), global)
			rec.Event(Event{Peer: string(self), At: info.Elapsed, Kind: "round", Loss: info.Loss, Weight: float64(len(info.Participants))})
		}
		if onRound != nil && onRound(info) {
			return nil
		}
	}
	// A peer that came too late to take part (it would join past the last
	// round) takes the others' final state.
	if last := uint64(cfg.Rounds); f.joinAt > last && version < last {
		if v, err := f.fetchWhileProgressing(ctx, othersOf(self, f.members()), last, state); err == nil {
			f.event("caught-up", fmt.Sprintf("final version %d", v))
			if adopt(v) {
				return nil
			}
		} else if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	// A failed last round has no next round to mend it: take the others'
	// final state, if they have one to give.
	if last := uint64(cfg.Rounds); lastFailed && version == last {
		from := finalFrom(cfg.Seed, cfg.Fraction, self, last, f.members())
		fctx, cancel := context.WithTimeout(ctx, cfg.RoundTimeout/4)
		v, err := f.fetchFrom(fctx, from, last, state)
		cancel()
		if err == nil {
			f.event("caught-up", fmt.Sprintf("final version %d", v))
			if adopt(v) {
				return nil
			}
		}
	}
	// A peer left out of the last rounds by sampling ends behind them and
	// does not Leave: the others, still in those rounds, sample from
	// membership.
	completed = true
	return nil
}

// fetchFrom fetches the state of version ≥ want from candidates into
// state, a few peers at a time (pickSources): each attempt asks at most
// fetchFanout of them, the peers whose statuses say they hold it first,
// for up to a quarter of the round timeout (blindFetch at least), else
// others for up to blindFetch; a failed attempt moves on to peers not yet
// asked, looking at the statuses again. It returns once an attempt
// succeeds or ctx ends, which the caller bounds; state is untouched
// unless it succeeds.
func (f *fedPeer) fetchFrom(ctx context.Context, candidates []peerid.ID, want uint64, state []float32) (uint64, error) {
	tried := map[peerid.ID]bool{}
	for {
		ask, known := pickSources(f.cfg.Seed, f.self, want, candidates, liveVersions(f.net.Statuses()), tried, fetchFanout)
		if len(ask) == 0 {
			return 0, fmt.Errorf("%w: no peer to ask", ErrNoState)
		}
		wait := blindFetch
		if known {
			wait = max(blindFetch, f.cfg.RoundTimeout/4)
		}
		v, err := fetchState(ctx, f.net, ask, want, state, wait)
		if err == nil || ctxtime.Ended(ctx) != nil {
			return v, err
		}
		for _, p := range ask {
			tried[p] = true
		}
		if serr := ctxtime.Sleep(ctx, fetchPause); serr != nil {
			return 0, fmt.Errorf("%w (then %w)", err, serr)
		}
	}
}

// fetchState fetches the state of version ≥ version from peers into
// state, waiting up to timeout (0: as long as ctx); state is untouched
// unless it succeeds. Callers ask a few peers at a time (fetchFrom).
func fetchState(ctx context.Context, net Net, peers []peerid.ID, version uint64, state []float32, timeout time.Duration) (uint64, error) {
	if len(peers) == 0 {
		return 0, ErrNoState
	}
	fctx, cancel := ctx, context.CancelFunc(func() {})
	if timeout > 0 {
		fctx, cancel = context.WithTimeout(ctx, timeout)
	}
	defer cancel()
	tmp := make([]float32, len(state))
	v, err := net.Fetch(fctx, peers, version, tmp)
	if err != nil {
		return 0, err
	}
	copy(state, tmp)
	return v, nil
}

// whileProgressing returns a context that ends with ctx, or once the
// newest version among the live peers has not grown for the round
// timeout (progressWatch), with ErrNoState as its cause; stop ends the
// watch. A wait for a state that rounds still running will produce
// lasts as long as they complete: a fixed deadline from its start, on a
// loaded machine, gave up while they were completing, and the round
// that needed the state then produced none either.
func (f *fedPeer) whileProgressing(ctx context.Context) (_ context.Context, stop func()) {
	patience := f.cfg.RoundTimeout
	watch := newProgressWatch(time.Now(), topVersion(f.net.Statuses()))
	return watchCtx(ctx, progressPoll, func(now time.Time) error {
		if watch.stalled(now, topVersion(f.net.Statuses()), patience) {
			return fmt.Errorf("%w: no peer's version grew for %v", ErrNoState, patience)
		}
		return nil
	})
}

// fetchWhileProgressing is fetchState waiting while the federation moves
// (whileProgressing) rather than for a fixed time.
func (f *fedPeer) fetchWhileProgressing(ctx context.Context, peers []peerid.ID, version uint64, state []float32) (uint64, error) {
	wctx, stop := f.whileProgressing(ctx)
	defer stop()
	v, err := f.fetchFrom(wctx, peers, version, state)
	if err != nil && ctx.Err() == nil {
		if cause := context.Cause(wctx); cause != nil && errors.Is(cause, ErrNoState) {
			return 0, fmt.Errorf("%w (%w)", err, cause)
		}
	}
	return v, err
}

// fetchBehind brings a peer sampled for round r that missed rounds to
// the state after round r−1, from from, before it trains round r. synced
// reports that it took round r's result or a later state: the round is
// done.
func (f *fedPeer) fetchBehind(ctx context.Context, server ServerOpt, state []float32, n int, version *uint64, r uint64, from []peerid.ID) (synced bool, err error) {
	endFetch := trace.Start(ctx, trace.Net, "fetch", int64(r))
	v, err := f.fetchWhileProgressing(ctx, from, r-1, state)
	endFetch()
	if err != nil {
		return false, fmt.Errorf("round %d: fetching state %d: %w", r, r-1, err)
	}
	copy(server.State(), state[n:])
	*version = v
	f.publish(ctx, v, state)
	return v >= r, nil
}

// round runs round r, as plan says, for a sampled peer that holds the
// state after round r−1 (fetchBehind). synced reports that the peer took
// the round's result (or a later state) from others.
func (f *fedPeer) round(ctx context.Context, w *Worker, server ServerOpt, state, send, avg, delta []float32, version *uint64, r uint64, plan roundPlan) (RoundInfo, bool, error) {
	net, cfg := f.net, f.cfg
	n := len(w.Model.Params)
	global := state[:n]
	// Local training from the global model.
	copy(w.Model.Params, global)
	if cfg.ResetClientOpt {
		w.Opt.SetState(0, map[string][]float32{})
	}
	steps := cfg.LocalSteps
	if cfg.LocalEpochs > 0 {
		steps = cfg.LocalEpochs * w.StepsPerEpoch()
	}
	be := w.Model.Backend()
	var lossSum float64
	samples := 0
	endCompute := trace.StartArgs(ctx, trace.Train, "compute", int64(r), trace.Args{"steps": steps})
	for s := 0; s < steps; s++ {
		loss, k, err := w.Grad(ctx)
		if err != nil {
			return RoundInfo{}, false, err
		}
		if cfg.Mu > 0 {
			// FedProx: ∇ μ/2·‖w − w_global‖² = μ(w − w_global).
			be.Axpy(cfg.Mu, w.Model.Params, w.Model.Grads)
			be.Axpy(-cfg.Mu, global, w.Model.Grads)
		}
		w.Apply(k)
		lossSum += loss * float64(k)
		samples += k
	}
	endCompute()
	// Every participant contributes its local model — and, unless the
	// server step is plain averaging, its global state — so the averaged
	// result is the same on all of them even if their bases had drifted
	// apart (a peer that missed a round's result): each successful round
	// re-synchronises its participants.
	copy(send, w.Model.Params)
	if len(send) > n {
		copy(send[n:], state)
	}
	endAR := trace.StartArgs(ctx, trace.Net, "allreduce", int64(r), trace.Args{"floats": len(send), "sampled": len(plan.sampled), "group": len(plan.group)})
	arctx, stopWatch := f.watchOvertaken(ctx, r, plan.group)
	used, err := net.AllReduce(arctx, r, plan.group, avg, send, float64(w.ShardSize()))
	ahead := stopWatch()
	endAR()
	if err != nil && len(ahead) > 0 && ctx.Err() == nil {
		// Peers of the group finished round r without this peer: take
		// their result rather than the previous state relabelled.
		f.event("overtaken", fmt.Sprintf("round %d: %d peers of the group finished it without this one; taking their state", r, len(ahead)))
		fctx, cancel := context.WithTimeout(ctx, cfg.RoundTimeout/4)
		v, ferr := f.fetchFrom(fctx, ahead, r, state)
		cancel()
		if ferr == nil {
			copy(server.State(), state[n:])
			copy(w.Model.Params, global)
			*version = v
			f.publish(ctx, v, state)
			return RoundInfo{}, true, nil
		}
	}
	if err != nil {
		// No result for round r here: keep the state of r−1 as version r,
		// so later rounds never wait for a state nobody will publish. If
		// others completed the round, the next round this peer joins
		// brings it back in line with them.
		copy(w.Model.Params, global)
		*version = r
		f.publish(ctx, r, state)
		return RoundInfo{}, false, fmt.Errorf("round %d: all-reduce: %w", r, err)
	}
	defer trace.Start(ctx, trace.Train, "apply", int64(r))()
	if len(avg) == n {
		copy(global, avg) // FedAvg: the new model is the weighted mean
	} else {
		copy(state, avg[n:]) // the mean global state …
		for i := range delta {
			delta[i] = avg[i] - global[i] // … and the mean client delta
		}
		copy(server.State(), state[n:])
		server.Apply(global, delta)
		copy(state[n:], server.State())
	}
	copy(w.Model.Params, global)
	*version = r
	f.publish(ctx, r, state)
	return RoundInfo{Round: r, Participants: used, Sampled: plan.sampled, Loss: lossSum / float64(max(samples, 1))}, false, nil
}
