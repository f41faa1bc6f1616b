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
)

// FedConfig configures serverless federated learning. Every peer of a
// federation must use the same settings.
type FedConfig struct {
	// Strategy is fedavg, fedprox, fedadam, fedyogi, fedadagrad or diloco.
	Strategy string
	// Rounds is the number of rounds to run.
	Rounds int
	// Fraction is C, the fraction of live peers sampled each round (at
	// least one peer is always sampled).
	Fraction float64
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
	return FedConfig{Strategy: "fedavg", Rounds: 100, Fraction: 0.1, LocalEpochs: 1, ServerLR: 1, Seed: 1,
		RoundTimeout: 2 * time.Minute, ResetClientOpt: true, CatchUp: 2 * time.Second}
}

// ParseStrategy sets Strategy and its parameters from a flag value such as
// "fedavg", "fedprox:mu=0.01", "fedadam:lr=0.01", "fedyogi", "fedadagrad",
// "diloco:h=50,lr=0.7,momentum=0.9", filling the papers' defaults.
func (c *FedConfig) ParseStrategy(spec string) error {
	name, args, _ := strings.Cut(spec, ":")
	kv, err := parseKV(spec, args)
	if err != nil {
		return err
	}
	take := func(key string, dst *float32, def float32) {
		if v, ok := kv[key]; ok {
			*dst = float32(v)
			delete(kv, key)
		} else {
			*dst = def
		}
	}
	c.Strategy = name
	switch name {
	case "fedavg":
		take("lr", &c.ServerLR, 1)
		c.ResetClientOpt = true
	case "fedprox":
		take("mu", &c.Mu, 0.01)
		take("lr", &c.ServerLR, 1)
		c.ResetClientOpt = true
	case "fedadam", "fedyogi", "fedadagrad":
		def := float32(0.01)
		if name == "fedadagrad" {
			def = 0.1
		}
		take("lr", &c.ServerLR, def)
		c.ResetClientOpt = true
	case "diloco":
		take("lr", &c.ServerLR, 0.7)
		take("momentum", &c.ServerMomentum, 0.9)
		var h float32
		take("h", &h, 50)
		c.LocalSteps, c.LocalEpochs = int(h), 0
		c.ResetClientOpt = false
	default:
		return fmt.Errorf("%w: unknown strategy %q (want fedavg, fedprox, fedadam, fedyogi, fedadagrad or diloco)", ErrStrategy, name)
	}
	for k := range kv {
		return fmt.Errorf("%w: %q: unknown parameter %q", ErrStrategy, spec, k)
	}
	return nil
}

// Validate reports settings that cannot work.
func (c FedConfig) Validate() error {
	switch {
	case c.Rounds <= 0:
		return fmt.Errorf("%w: rounds must be positive", ErrStrategy)
	case !(c.Fraction > 0 && c.Fraction <= 1):
		return fmt.Errorf("%w: fraction C must be in (0, 1], got %v", ErrStrategy, c.Fraction)
	case c.LocalEpochs < 0 || c.LocalSteps < 0 || (c.LocalEpochs == 0 && c.LocalSteps == 0):
		return fmt.Errorf("%w: set local epochs E or local steps H", ErrStrategy)
	case !(c.ServerLR > 0):
		return fmt.Errorf("%w: server learning rate must be positive", ErrStrategy)
	case c.Mu < 0 || math.IsNaN(float64(c.Mu)):
		return fmt.Errorf("%w: FedProx μ must not be negative", ErrStrategy)
	case c.RoundTimeout <= 0:
		return fmt.Errorf("%w: round timeout must be positive", ErrStrategy)
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
	case "diloco":
		return NewNesterovServer(c.ServerLR, c.ServerMomentum, n), nil
	}
	return nil, fmt.Errorf("%w: unknown strategy %q", ErrStrategy, c.Strategy)
}

// Sample returns the peers of members taking part in a round: ⌈C·n⌉ of
// them (at least one), chosen by a hash of (seed, round, peer), so every
// peer with the same member list derives the same sample. The result is
// sorted.
func Sample(seed, round uint64, members []string, fraction float64) []string {
	n := len(members)
	if n == 0 {
		return nil
	}
	k := min(n, max(1, int(math.Ceil(fraction*float64(n)-1e-9))))
	type keyed struct {
		h uint64
		p string
	}
	ks := make([]keyed, n)
	for i, p := range members {
		ks[i] = keyed{device.Hash64(seed^round*0x9e3779b97f4a7c15, fnv64(p)), p}
	}
	slices.SortFunc(ks, func(a, b keyed) int {
		if a.h != b.h {
			if a.h < b.h {
				return -1
			}
			return 1
		}
		return strings.Compare(a.p, b.p)
	})
	out := make([]string, k)
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

// FedNet is what a federated peer needs from the network. Implementations
// are safe for concurrent use, and every blocking call honours ctx.
type FedNet interface {
	// Self returns this peer's id.
	Self() string
	// Members returns the sorted ids of the federation's live peers
	// (including Self) as this peer sees them at the start of round.
	Members(ctx context.Context, round uint64) ([]string, error)
	// AllReduce sets dst to the sample-weighted mean of the src vectors of
	// group (which includes Self) for round, and returns the peers whose
	// contributions it holds.
	AllReduce(ctx context.Context, round uint64, group []string, dst, src []float32, weight float64) ([]string, error)
	// Publish makes state, the global state after round version, available
	// to Fetch. The network keeps its own copy.
	Publish(version uint64, state []float32)
	// Fetch fills dst with the published state of one of peers whose
	// version is at least version (waiting for one to get there until ctx
	// ends), and returns the version it got.
	Fetch(ctx context.Context, peers []string, version uint64, dst []float32) (uint64, error)
}

// Leaver is implemented by FedNets that can tell the other peers that
// this one stopped before the federation's last round while its network
// may stay up (a library user's node): they leave it out of their rounds
// instead of waiting for it in each.
type Leaver interface {
	// Leave announces that this peer stopped at version; it returns once
	// the announcement is out or ctx ends.
	Leave(ctx context.Context, version uint64) error
}

// Departures is implemented by FedNets that learn which peers announced
// that they stopped (Leaver). Federated does not count them among the
// peers whose majority it needs to go on (see quorate).
type Departures interface {
	// Departed reports whether peer announced that it stopped.
	Departed(peer string) bool
}

// quorate reports whether members hold a strict majority of ref (less the
// peers that announced their departure); an empty ref is no constraint.
// ref is the membership of the last round this peer completed: a peer cut
// off from most of it is on the minority side of a partition, or the
// others died; it cannot tell which, so it waits (awaitMajority) rather than
// train rounds of its own, whose state, numbered as the global rounds
// are, would later pass for the newest and replace the majority's.
func quorate(net FedNet, members, ref []string) bool {
	in, total := tally(net, members, ref)
	return total == 0 || 2*in > total
}

// tally returns how many of ref, less the peers that announced their
// departure, there are (total) and how many of them are among members (in).
func tally(net FedNet, members, ref []string) (in, total int) {
	dep, _ := net.(Departures)
	for _, p := range ref {
		if dep != nil && p != net.Self() && dep.Departed(p) {
			continue
		}
		total++
		if slices.Contains(members, p) {
			in++
		}
	}
	return in, total
}

// awaitMajority waits, up to cfg.RoundTimeout, until the members at round
// r hold a majority of ref again, and returns them. After the wait it goes
// on with the members it sees, which it returns with ok false: the others
// are taken for dead (a peer of two whose partner died waits this long).
func awaitMajority(ctx context.Context, net FedNet, cfg FedConfig, rec Recorder, start time.Time, r uint64, ref, members []string) (_ []string, ok bool, err error) {
	event := func(kind, detail string) {
		if rec != nil {
			rec.Event(Event{Peer: net.Self(), At: time.Since(start), Kind: kind, Detail: detail})
		}
	}
	in, total := tally(net, members, ref)
	event("minority", fmt.Sprintf("round %d: %d of the last round's %d peers reachable; waiting up to %v for a majority of them", r, in, total, cfg.RoundTimeout))
	deadline := time.Now().Add(cfg.RoundTimeout)
	for {
		if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
			return nil, false, err
		}
		if members, err = net.Members(ctx, r); err != nil {
			return nil, false, fmt.Errorf("round %d: %w", r, err)
		}
		if quorate(net, members, ref) {
			event("majority", fmt.Sprintf("round %d: a majority of the last round's peers is back", r))
			return members, true, nil
		}
		if time.Now().After(deadline) {
			event("minority", fmt.Sprintf("round %d: no majority of the last round's %d peers within %v; going on with %d", r, total, cfg.RoundTimeout, len(members)))
			return members, false, nil
		}
	}
}

// Versioned is implemented by FedNets that know the state version each
// live peer last published (from heartbeats, say). Federated uses it to
// line a peer up with the others after it starts or fails a round.
type Versioned interface {
	// Versions returns the last known version of each live peer.
	Versions() map[string]uint64
}

// alignRound waits, up to 1.5 s, until every
// other sampled peer has reached version r−1; if one has already finished
// round r, it fetches the newest state into state and returns its version
// (else it returns version).
func alignRound(ctx context.Context, net FedNet, cfg FedConfig, state []float32, version, r uint64, sampled []string) (uint64, error) {
	vn, ok := net.(Versioned)
	if !ok {
		return version, nil
	}
	// Long enough for a heartbeat or two to show where the others are,
	// short enough to stay well inside an all-reduce's stall timeout.
	deadline := time.Now().Add(min(cfg.RoundTimeout/4, 1500*time.Millisecond))
	for {
		vs := vn.Versions()
		var ahead []string
		ready := true
		for _, p := range sampled {
			if p == net.Self() {
				continue
			}
			v, known := vs[p]
			switch {
			case known && v >= r:
				// Round r is already over for p: this peer is late.
				ahead = append(ahead, p)
			case !known || v+1 < r:
				ready = false
			}
		}
		if len(ahead) > 0 {
			fctx, cancel := context.WithTimeout(ctx, cfg.RoundTimeout/4)
			v, err := net.Fetch(fctx, ahead, r, state)
			cancel()
			if err == nil {
				return v, nil
			}
			if ctx.Err() != nil {
				return version, ctx.Err()
			}
		}
		if ready || time.Now().After(deadline) {
			return version, nil
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return version, err
		}
	}
}

// ErrNoState reports that no peer could provide the global state.
var ErrNoState = errors.New("train: no peer provided the global state")

// RoundInfo describes a finished round as one participant saw it.
type RoundInfo struct {
	Round        uint64
	Participants []string // the group whose contributions were averaged
	Sampled      []string
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
// with the other sampled peers weighted by shard size, and applies the
// server optimiser to the averaged delta, identically on every
// participant. onRound, if not nil, is called after each round this peer
// took part in; returning true stops the peer. A peer that stops before
// the last round tells the others so if net is a Leaver. A round that
// fails for this peer leaves it the previous state as that round's
// version; the next round it joins brings it back in line, and after a
// failed last round it takes the others' final state if they have one.
func Federated(ctx context.Context, w *Worker, net FedNet, cfg FedConfig, rec Recorder, onRound func(RoundInfo) bool) error {
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
	if l, ok := net.(Leaver); ok {
		defer func() {
			if !completed && version < uint64(cfg.Rounds) { // stopped early, whatever the reason
				announceStop(ctx, func(ctx context.Context) { l.Leave(ctx, version) })
			}
		}()
	}
	start := time.Now()
	self := net.Self()
	// ref is the membership of the last round this peer completed, else
	// the first view of the others it had (see quorate).
	var ref []string
	if cfg.Resume != nil {
		if len(cfg.Resume.State) != len(state) {
			return fmt.Errorf("%w: checkpointed state has %d values, %s with %s needs %d", ErrStrategy, len(cfg.Resume.State), w.Model.Arch, cfg.Strategy, len(state))
		}
		copy(state, cfg.Resume.State)
		copy(st, state[n:])
		version = cfg.Resume.Version
	}
	if cfg.CatchUp > 0 {
		// A late or restarted peer takes the newest state the others hold.
		// It gives discovery up to CatchUp to show it the others, then asks
		// them without waiting for newer versions.
		deadline := time.Now().Add(cfg.CatchUp)
		for {
			members, err := net.Members(ctx, version+1)
			if err != nil {
				return err
			}
			if others := othersOf(self, members); len(others) > 0 {
				ref = members // see quorate
				if v, err := fetchState(ctx, net, others, version+1, state, 1500*time.Millisecond); err == nil {
					copy(st, state[n:])
					version = v
					if rec != nil {
						rec.Event(Event{Peer: self, At: time.Since(start), Kind: "caught-up", Detail: fmt.Sprintf("version %d", v)})
					}
				}
				break
			}
			if time.Now().After(deadline) {
				break
			}
			if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
				return err
			}
		}
	}
	copy(w.Model.Params, global)
	net.Publish(version, state)
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
		net.Publish(version, state)
		return onRound != nil && onRound(RoundInfo{Round: version, Synced: true, Global: global, State: state, Elapsed: time.Since(start)})
	}
	align := true
	lastFailed := false // the newest version is a failed round's, relabelled
	for r := version + 1; r <= uint64(cfg.Rounds); r++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		if version >= r {
			continue // fetched past this round
		}
		members, err := net.Members(ctx, r)
		if err != nil {
			return fmt.Errorf("round %d: %w", r, err)
		}
		if ref == nil {
			// Before a first completed round, the view at the start of
			// the first round it tries: a peer cut off before that round
			// completes waits for it too.
			ref = members
		}
		if !quorate(net, members, ref) {
			var back bool
			if members, back, err = awaitMajority(ctx, net, cfg, rec, start, r, ref, members); err != nil {
				return err
			}
			if !back {
				ref = members // the others are taken for dead
			}
			align = true // the majority may be rounds ahead
		}
		sampled := Sample(cfg.Seed, r, members, cfg.Fraction)
		if !slices.Contains(sampled, self) {
			continue
		}
		prev := Sample(cfg.Seed, r-1, members, cfg.Fraction)
		if align {
			// After a start or a failed round, line up with the others
			// before joining an all-reduce: take a newer state if someone
			// is ahead, and give laggards a moment to reach round r−1.
			v, err := alignRound(ctx, net, cfg, state, version, r, sampled)
			if err != nil {
				return err
			}
			align = false
			if v > version {
				if adopt(v) {
					return nil
				}
				continue
			}
		}
		rctx, cancel := context.WithTimeout(ctx, cfg.RoundTimeout)
		before := version
		info, synced, err := fedRound(rctx, w, net, cfg, server, state, send, avg, delta, &version, r, prev, sampled)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, ErrDiverged) {
				return err
			}
			// The round failed for this peer: it holds the others' result
			// if they had one (synced), else the unchanged state of r−1
			// as version r.
			if rec != nil {
				rec.Event(Event{Peer: self, At: time.Since(start), Kind: "round-failed", Detail: err.Error()})
			}
			align = true
		}
		if err == nil && !synced {
			// The federation as this peer saw it for a round it
			// completed: the members, not the round's sample (with
			// Fraction < 1 a sample is a few peers, whose loss would
			// look like a partition).
			ref = members
		}
		if version == before {
			continue // no new state (a fetch for round r−1 failed)
		}
		info.Round = version
		info.Failed = err != nil && !synced
		lastFailed = info.Failed
		info.Synced = synced
		info.Err = err
		info.Global = global
		info.State = state
		info.Elapsed = time.Since(start)
		if rec != nil {
			rec.Snapshot(self, info.Elapsed, int(version), global)
			rec.Event(Event{Peer: self, At: info.Elapsed, Kind: "round", Loss: info.Loss, Weight: float64(len(info.Participants))})
		}
		if onRound != nil && onRound(info) {
			return nil
		}
	}
	// A failed round is mended by the next one this peer joins (see
	// fedRound), but the last round has no next one: a peer that failed it
	// while others completed it (it entered late, say) would end with the
	// state of the round before, labelled final. It takes the others'
	// final state instead, if they have one to give.
	if last := uint64(cfg.Rounds); lastFailed && version == last {
		// From the last round's other participants, else the other
		// members; they may still be finishing it.
		members, _ := net.Members(ctx, last) // on error: none, and no fetch
		from := othersOf(self, Sample(cfg.Seed, last, members, cfg.Fraction), members)
		if v, err := fetchState(ctx, net, from, last, state, cfg.RoundTimeout/4); err == nil {
			if rec != nil {
				rec.Event(Event{Peer: self, At: time.Since(start), Kind: "caught-up", Detail: fmt.Sprintf("final version %d", v)})
			}
			if adopt(v) {
				return nil
			}
		}
	}
	// A peer left out of the last rounds by sampling ends behind them; the
	// others, still in those rounds, sample from membership, which must
	// not change under them: it does not Leave.
	completed = true
	return nil
}

// othersOf returns the first of lists that names a peer other than self,
// without self (nil if none does).
func othersOf(self string, lists ...[]string) []string {
	for _, l := range lists {
		if o := slices.DeleteFunc(slices.Clone(l), func(p string) bool { return p == self }); len(o) > 0 {
			return o
		}
	}
	return nil
}

// fetchState fetches the state of version ≥ version from peers into
// state, waiting up to timeout; state is untouched unless it succeeds.
func fetchState(ctx context.Context, net FedNet, peers []string, version uint64, state []float32, timeout time.Duration) (uint64, error) {
	if len(peers) == 0 {
		return 0, ErrNoState
	}
	fctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tmp := make([]float32, len(state))
	v, err := net.Fetch(fctx, peers, version, tmp)
	if err != nil {
		return 0, err
	}
	copy(state, tmp)
	return v, nil
}

// fedRound runs round r for a sampled peer. synced reports that the peer
// took the round's result (or a later state) from others.
func fedRound(ctx context.Context, w *Worker, net FedNet, cfg FedConfig, server ServerOpt, state, send, avg, delta []float32, version *uint64, r uint64, prev, sampled []string) (RoundInfo, bool, error) {
	n := len(w.Model.Params)
	global := state[:n]
	if *version < r-1 {
		// Missed rounds: fetch the state after round r−1 from its
		// participants (they are the ones who have it).
		v, err := net.Fetch(ctx, othersOf(net.Self(), prev, sampled), r-1, state)
		if err != nil {
			return RoundInfo{}, false, fmt.Errorf("round %d: fetching state %d: %w", r, r-1, err)
		}
		copy(server.State(), state[n:])
		*version = v
		net.Publish(v, state)
		if v >= r {
			return RoundInfo{}, true, nil
		}
	}
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
	// Every participant contributes its local model — and, unless the
	// server step is plain averaging, its global state — so the averaged
	// result is the same on all of them even if their bases had drifted
	// apart (a peer that missed a round's result): each successful round
	// re-synchronises its participants.
	copy(send, w.Model.Params)
	if len(send) > n {
		copy(send[n:], state)
	}
	used, err := net.AllReduce(ctx, r, sampled, avg, send, float64(w.ShardSize()))
	if err != nil {
		// No result for round r here: keep the state of r−1 as version r,
		// so later rounds never wait for a state nobody will publish. If
		// others completed the round, the next round this peer joins
		// brings it back in line with them.
		copy(w.Model.Params, global)
		*version = r
		net.Publish(r, state)
		return RoundInfo{}, false, fmt.Errorf("round %d: all-reduce: %w", r, err)
	}
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
	net.Publish(r, state)
	return RoundInfo{Round: r, Participants: used, Sampled: sampled, Loss: lossSum / float64(max(samples, 1))}, false, nil
}
