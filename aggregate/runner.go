package aggregate

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/starling-ml/starling/aggregate/rule"
	"github.com/starling-ml/starling/device"
	"github.com/starling-ml/starling/peerid"
)

// Result describes a completed round.
type Result struct {
	// Group is the group whose contributions the result aggregates: the
	// round's group less the peers excluded along the way.
	Group Group
	// Algorithm is the algorithm that ran.
	Algorithm Algorithm
	// Attempts is how many times the round ran (1 when nothing failed).
	Attempts int
	// Weight is the sum of the weights of Group's contributions.
	Weight float64
	// Excluded lists the peers dropped from the round and why; each
	// *PeerError wraps ErrStall, ErrUnreachable, ErrBadLength, ErrBadValue,
	// ErrGroupMismatch or ErrConfigMismatch.
	Excluded []*PeerError
	// Rejected lists peers outside the group whose chunks were refused
	// (each wraps ErrNotMember). Only transports that implement Scoper
	// report them.
	Rejected []*PeerError
}

// Runner is one peer's all-reduce driver. It owns the goroutines of a
// round, and none between rounds. A Runner runs one round at a time:
// concurrent AllReduce calls are serialised.
type Runner struct {
	self peerid.ID
	t    Transport
	cfg  Config
	be   device.Backend
	comp *Compression // nil without Config.Compress

	log *slog.Logger

	mu        sync.Mutex // held for a whole round
	bufs      map[string][]float32
	voteSends sync.WaitGroup // vote sends of the current round

	late time.Duration // tests: how late every watchdog fires (a busy machine)

	// The round of the last call and, if it failed, the attempt after its
	// last one (0 after a success; see AllReduce).
	lastRound uint64
	retryFrom uint16
}

// Option is an extra for NewRunner.
type Option func(*Runner)

// WithLogger makes the runner log failed rounds at warn level, rounds
// completed without some peers at info level, and each attempt's blames and
// votes at debug level. The default logs nothing.
func WithLogger(l *slog.Logger) Option { return func(r *Runner) { r.log = l } }

// WithBackend makes the runner reduce and scale on be (device.Default()
// when not given).
func WithBackend(be device.Backend) Option { return func(r *Runner) { r.be = be } }

// NewRunner returns a driver for peer self over t.
func NewRunner(self peerid.ID, t Transport, cfg Config, opts ...Option) (*Runner, error) {
	if self == "" {
		return nil, fmt.Errorf("%w: empty self id", ErrInvalidConfig)
	}
	if t == nil {
		return nil, fmt.Errorf("%w: nil transport", ErrInvalidConfig)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &Runner{self: self, t: t, cfg: cfg, be: device.Default(), bufs: map[string][]float32{}, log: discardLogger()}
	if !cfg.Compress.IsZero() {
		var err error
		if r.comp, err = newCompression(cfg.Compress); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
	}
	for _, o := range opts {
		o(r)
	}
	return r, nil
}

// Config returns the runner's configuration.
func (r *Runner) Config() Config { return r.cfg }

// Compression returns the runner's compression state, nil without
// Config.Compress.
func (r *Runner) Compression() *Compression { return r.comp }

// buf returns a reusable buffer of n values named name; valid until the
// round ends.
func (r *Runner) buf(name string, n int) []float32 {
	b := r.bufs[name]
	if cap(b) < n {
		b = make([]float32, n)
		r.bufs[name] = b
	}
	return b[:n]
}

// AllReduceAmong forms the group of members for round (Form: the same
// order on every peer that calls it with the same set) and runs AllReduce
// with it. Result.Group names the peers whose contributions dst holds.
func (r *Runner) AllReduceAmong(ctx context.Context, round uint64, members []peerid.ID, dst, src []float32, weight float64) (Result, error) {
	g, err := Form(round, members)
	if err != nil {
		return Result{}, err
	}
	return r.AllReduce(ctx, g, dst, src, weight)
}

// AllReduce runs one round with group g: every member contributes its src
// with its weight (a sample count; see the rule), and on success dst holds
// the rule applied to the contributions of Result.Group, the same bits on
// every member that succeeds. src is not modified; dst must not overlap it
// unless it is the same slice. On error dst holds no result.
//
// Failures of other members (a peer that dies, stalls, or sends a wrong
// length, NaN/Inf, or another group or setting) are detected within the
// stall timeouts; the survivors re-form the group without the culprits and
// run the round again, up to Config.MaxAttempts times and while more than
// Config.Quorum of the group remains. Errors wrap ErrNotMember (g does not
// name this peer), ErrExcluded (with a *PeerError naming this peer),
// ErrTooFewPeers, ErrRoundFailed, ErrOverflow, ErrZeroWeight,
// ErrTooFewInputs, ErrClosed, or ctx's error.
//
// Calling AllReduce again for the round of a call that failed (a retry of
// a training step) runs it from the attempt after that call's last one, not
// from g's: chunks of the failed call may still be in flight or parked
// under its tags. The members that failed together ended in the same
// attempt and so agree on the next. A member that tried the round more
// often (alone, while this peer was stuck) sent chunks of a later attempt
// that the transport saw (LatestAttempt): the retry joins it there. (If
// that member has moved on again by then, the two miss each other and try
// again.)
func (r *Runner) AllReduce(ctx context.Context, g Group, dst, src []float32, weight float64) (res Result, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	defer r.voteSends.Wait()
	res = Result{Group: g, Algorithm: r.cfg.resolve(len(src), g.Size())}
	if len(dst) != len(src) {
		return res, fmt.Errorf("%w: dst has %d values, src %d", ErrBadInput, len(dst), len(src))
	}
	if !rule.ValidWeight(weight) || weight > math.MaxFloat32 {
		return res, fmt.Errorf("%w: weight %v not in [0, MaxFloat32]", ErrBadInput, weight)
	}
	if g.Rank(r.self) < 0 {
		return res, &PeerError{Peer: r.self, Err: fmt.Errorf("%w: %v", ErrNotMember, g)}
	}
	if r.comp != nil {
		r.comp.mu.Lock()
		defer r.comp.mu.Unlock()
		if err := r.comp.check(len(src), r.cfg.ChunkElems); err != nil {
			return res, err
		}
	}
	if len(src) > 0 && len(dst) > 0 && &dst[0] == &src[0] {
		cp := r.buf("src", len(src))
		copy(cp, src)
		src = cp
	}
	sc, _ := r.t.(Scoper)
	defer func() {
		if sc != nil {
			res.Rejected = append(res.Rejected, sc.Rejected(g.round)...)
		}
		if err != nil {
			r.log.Warn("aggregate: round failed", "self", r.self, "round", g.round, "attempts", res.Attempts, "err", err)
		} else if res.Attempts > 1 || len(res.Rejected) > 0 {
			r.log.Info("aggregate: round completed without some peers", "self", r.self, "group", res.Group.String(),
				"excluded", fmt.Sprint(res.Excluded), "rejected", fmt.Sprint(res.Rejected))
		}
	}()
	if next := r.retryFrom; next > 0 && g.round == r.lastRound {
		// A retry of a round that failed: its chunks may still be in
		// flight or parked under the failed call's tags.
		if as, ok := r.t.(attemptSeer); ok {
			if a, ok := as.LatestAttempt(g.round); ok && a > next {
				next = a // a member went on to attempt a: join it there
			}
		}
		if g.attempt < next {
			g = g.at(next)
		}
	}
	defer func() {
		r.lastRound, r.retryFrom = res.Group.round, 0
		if err != nil {
			r.retryFrom = res.Group.attempt + 1
		}
	}()
	orig := g.Size()
	for {
		res.Group = g
		res.Attempts++
		if fit := r.ruleFor(g); g.Size() < fit.MinInputs() {
			return res, fmt.Errorf("%w: %s needs %d peers, %v has %d", ErrTooFewInputs, fit, fit.MinInputs(), g, g.Size())
		} else if fmt.Sprint(fit) != fmt.Sprint(r.cfg.Rule) {
			r.log.Info("aggregate: group too small for the rule: running the one it allows", "self", r.self, "group", g.String(), "rule", r.cfg.Rule, "running", fit)
		}
		if sc != nil {
			sc.Scope(g)
		}
		a := r.newAttempt(g, dst, src, weight, res.Attempts > 1)
		res.Algorithm = a.algo // a smaller group may run another
		out, err := a.run(ctx)
		if err != nil {
			return res, err
		}
		if out.commit {
			res.Weight = a.total
			if r.comp != nil {
				r.comp.commit()
			}
			return res, nil
		}
		drop := make([]peerid.ID, len(out.excluded))
		for i, pe := range out.excluded {
			drop[i] = pe.Peer
		}
		res.Excluded = append(res.Excluded, out.excluded...)
		if res.Attempts >= r.cfg.MaxAttempts {
			return res, fmt.Errorf("%w: %v: %d attempts: %w", ErrRoundFailed, g, res.Attempts, out.cause())
		}
		g = g.Without(drop...)
		if left := g.Size(); float64(left) <= r.cfg.Quorum*float64(orig) || left == 0 {
			return res, fmt.Errorf("%w: %d of %d peers left (quorum > %v): %w", ErrTooFewPeers, left, orig, r.cfg.Quorum, out.cause())
		}
	}
}

// configHash identifies the settings every member of a round must share.
func configHash(model string, rule rule.Rule, algo Algorithm, chunk int, d int, comp *Compression) uint64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "starling/aggregate/v1|%s|%s|%d|%d", rule, algo, chunk, d)
	if model != "" {
		fmt.Fprintf(h, "|model=%q", model)
	}
	if comp != nil {
		fmt.Fprintf(h, "|%s", comp.spec)
	}
	return h.Sum64()
}

// attempt is one run of a round over one group.
type attempt struct {
	r      *Runner
	g      Group
	n      int
	rank   int
	algo   Algorithm
	chunk  int // values per chunk (Config.chunkElems)
	cfg    uint64
	src    []float32
	dst    []float32
	weight float64
	stall  time.Duration
	rule   rule.Rule // the rule this group runs (Runner.ruleFor)
	start  int64     // unix ns
	base   int64     // unix ns from which silence counts
	total  float64

	dataCtx  context.Context
	stopData context.CancelFunc

	mu        sync.Mutex
	blame     []kind
	fault     groupFault
	fatal     error
	lastHeard []atomic.Int64
	// sends[j] counts Sends to rank j begun, sending[j] those not yet
	// returned: a probe of j is conclusive only if none was in flight when
	// it began and none began while it ran (see probe).
	sends, sending []atomic.Int64
	lanes          atomic.Int64 // lanes still to complete
	bad            atomic.Bool  // a lane failed

	votes []peerVote
}

func (r *Runner) newAttempt(g Group, dst, src []float32, weight float64, rerun bool) *attempt {
	n := g.Size()
	algo := r.cfg.resolve(len(src), n)
	a := &attempt{
		r: r, g: g, n: n, rank: g.Rank(r.self), algo: algo, chunk: r.cfg.chunkElems(len(src), n, algo),
		cfg: configHash(r.cfg.Model, r.cfg.Rule, algo, r.cfg.ChunkElems, len(src), r.comp),
		src: src, dst: dst, weight: weight, stall: r.cfg.StallTimeout, rule: r.ruleFor(g),
		blame: make([]kind, n), lastHeard: make([]atomic.Int64, n), votes: make([]peerVote, n),
		sends: make([]atomic.Int64, n), sending: make([]atomic.Int64, n),
	}
	a.start = time.Now().UnixNano()
	a.base = a.start
	if rerun {
		// Members leave the previous attempt's vote at different times:
		// each heard of the failure within moments of the others, then
		// waited at most two stall timeouts for missing votes.
		a.base += int64(rerunGrace * a.stall)
	}
	return a
}

// ruleFor returns the rule group g runs: the configured one fitted to
// the group's size (rule.Fit). Groups shrink below Krum's 2F+3 when
// members fail or are excluded: at 5 members with f=1, one liar sending
// NaN would otherwise fail the round, and with it every later round whose
// group leaves the liar out, for good. Every member of g fits alike.
func (r *Runner) ruleFor(g Group) rule.Rule { return rule.Fit(r.cfg.Rule, g.Size()) }

// rerunGrace is how many stall timeouts after its start a re-run counts
// silence from (see newAttempt).
const rerunGrace = 3

// maxMult is the largest timeout multiple any member waits in this attempt.
func (a *attempt) maxMult() int {
	if a.algo == Tree {
		return max(2*treeHeight(0, a.n), 1)
	}
	return 2
}

// voteWait is how long a member waits for votes after its data phase: long
// enough for every other member to time out its own waits and say so.
func (a *attempt) voteWait() time.Duration { return time.Duration(a.maxMult()+1) * a.stall }

func (a *attempt) tag(s Step, chunk uint32) Tag {
	return Tag{Round: a.g.round, Digest: a.g.digest, Attempt: a.g.attempt, Step: s, Chunk: chunk}
}

// accuse records that rank j failed this peer in way k and stops the data
// phase. A hard kind replaces a soft one; otherwise the first stands (an
// accusation replaces kindStarved).
func (a *attempt) accuse(j int, k kind) {
	a.r.log.Debug("aggregate: blame", "self", a.r.self, "group", a.g.String(), "peer", a.g.members[j], "kind", k.err(), "hard", k.hard())
	a.mu.Lock()
	if old := a.blame[j]; old == kindNone || old == kindStarved || (!old.hard() && k.hard()) {
		a.blame[j] = k
	}
	a.mu.Unlock()
	a.bad.Store(true)
	a.stopData()
}

// starvedBy records, once the data phase has stopped, that this peer was
// then waiting on rank j for input with nothing left to send. In a
// pipeline (the ring) silence spreads from a stalled member to all others
// within moments, so several time out together, in an order that timer and
// scheduling noise decide; this mark tells decide that this member is not
// where the silence began, whoever timed out on it. Only the data phase's
// end sets it, so an OK vote never carries it.
func (a *attempt) starvedBy(j int) {
	a.mu.Lock()
	if a.blame[j] == kindNone {
		a.blame[j] = kindStarved
	}
	a.mu.Unlock()
}

func (a *attempt) setFault(f groupFault) {
	a.mu.Lock()
	if a.fault == faultNone {
		a.fault = f
	}
	a.mu.Unlock()
	a.bad.Store(true)
	a.stopData()
}

func (a *attempt) setFatal(err error) {
	a.mu.Lock()
	if a.fatal == nil {
		a.fatal = err
	}
	a.mu.Unlock()
	a.bad.Store(true)
	a.stopData()
}

func (a *attempt) heard(j int) { a.lastHeard[j].Store(time.Now().UnixNano()) }

// laneDone marks one lane of the data phase complete.
func (a *attempt) laneDone() { a.lanes.Add(-1) }

// errSilent is the cause with which a watchdog ends a lane's context.
var errSilent = errors.New("aggregate: no progress from the peer within the stall timeout")

// errUnresponsive is the cause with which a probe ends a lane's context:
// the peer sent nothing and did not answer a probe within a stall timeout.
var errUnresponsive = errors.New("aggregate: the peer did not answer a probe within the stall timeout")

// watch returns a context for waiting on rank j that ends (with cause
// errSilent) once nothing has been heard from j for mult stall timeouts,
// counted from the attempt's base at the earliest. Progress on any lane
// from j keeps it alive. Unlike a deadline per chunk, a watchdog never
// cancels a Recv while its chunk is arriving from a live peer, which some
// transports (node/) answer by resetting the sender's stream.
func (a *attempt) watch(j, mult int) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(a.dataCtx)
	span := int64(mult) * int64(a.stall)
	var (
		mu    sync.Mutex
		timer *time.Timer
		done  bool
	)
	check := func() {
		mu.Lock()
		defer mu.Unlock()
		if done {
			return
		}
		if left := a.due(j, mult) + int64(a.r.late) - time.Now().UnixNano(); left > 0 {
			timer.Reset(time.Duration(left))
			return
		}
		done = true
		cancel(errSilent)
	}
	mu.Lock()
	timer = time.AfterFunc(time.Duration(max(a.base, time.Now().UnixNano())+span+int64(a.r.late)-time.Now().UnixNano()), check)
	mu.Unlock()
	if p, ok := a.r.t.(Prober); ok && mult > 1 {
		go a.probe(ctx, p, j, func() {
			mu.Lock()
			defer mu.Unlock()
			if !done {
				done = true
				timer.Stop()
				cancel(errUnresponsive)
			}
		})
	}
	return ctx, func() {
		mu.Lock()
		done = true
		timer.Stop()
		mu.Unlock()
		cancel(nil)
	}
}

// probe runs beside a wait of several stall timeouts on rank j (one that
// depends on other members too, so that a silence there is only a soft
// timeout, see kindTimeout) until ctx ends. Whenever j has been silent for
// half a stall timeout it probes j, once a stall timeout at most; if j
// neither answers nor sends anything within a stall timeout, j is not
// starved but stalled itself (frozen, or cut off), and unresponsive ends
// the wait, which blames j with kindStall: a hard blame, which lets the
// others stop waiting for its vote. So a frozen member is out after 1.5
// stall timeouts instead of a dependent wait's two and a vote window's
// two more. Only silence convicts: a probe that fails at once as
// ErrUnreachable (no connection) is tried again a stall timeout later,
// since a closed connection is the transport's to report (kindGone, which
// is soft); one that cannot be made (another error) ends the probing;
// one that overlapped a Send of ours to j proves nothing (on a slow link
// it may have waited behind our data, which j may be reading) and the wait
// goes on as without probes.
func (a *attempt) probe(ctx context.Context, p Prober, j int, unresponsive func()) {
	last := int64(0) // when the last probe began
	for {
		heard := max(a.base, a.lastHeard[j].Load())
		next := max(heard+int64(a.stall)/2, last+int64(a.stall)) + int64(a.r.late)
		if d := time.Duration(next - time.Now().UnixNano()); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return
			}
		}
		if max(a.base, a.lastHeard[j].Load()) != heard {
			continue // j was heard from meanwhile
		}
		last = time.Now().UnixNano()
		sends := a.sends[j].Load()
		idle := a.sending[j].Load() == 0
		pctx, cancel := context.WithTimeout(ctx, a.stall+a.r.late)
		err := p.Probe(pctx, a.g.members[j])
		timedOut := pctx.Err() != nil
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err == nil:
			continue
		case !timedOut && errors.Is(err, ErrUnreachable):
			// No connection: the transport's own disconnect handling
			// (ErrDisconnected) or the watchdog speaks for a gone peer,
			// and a connection that comes back is probed again.
			continue
		case !timedOut:
			a.r.log.Debug("aggregate: probe failed", "self", a.r.self, "peer", a.g.members[j], "err", err)
			return
		case !idle || a.sends[j].Load() != sends:
			// Our own data to j was on the way: the probe may have
			// queued behind it on a slow link. Inconclusive.
			continue
		}
		if max(a.base, a.lastHeard[j].Load()) == heard {
			a.r.log.Debug("aggregate: unresponsive", "self", a.r.self, "group", a.g.String(), "peer", a.g.members[j], "err", err)
			unresponsive()
			return
		}
	}
}

// recvOne waits for chunk (s, c) from rank j into dst on a watched context
// of mult stall timeouts; k is the blame if the watchdog fires. It returns
// false when the data phase is over for any reason.
func (a *attempt) recvOne(ctx context.Context, j int, s Step, c uint32, dst []float32, mult int, k kind) bool {
	ok, _ := a.recvChecked(ctx, j, s, c, dst, mult, k, nil)
	return ok
}

// fused is a partial sum that the transport may add our contribution
// alpha·x to as it arrives (AxpyReceiver); the receive sets the rest.
type fused struct {
	alpha          float32
	x              []float32 // nil: the chunk is received, not summed
	summed, in, ok bool      // in, ok: as device.AxpyFinite's, when summed
	sums           Checksums // for AxpyReceiver.SendReceived
}

// recvChecked is recvOne; finite reports that the transport checked dst
// for NaN and ±Inf already (FiniteReceiver). With f, an AxpyReceiver may
// sum the chunk on arrival (f.summed; finite is then f.in).
func (a *attempt) recvChecked(ctx context.Context, j int, s Step, c uint32, dst []float32, mult int, k kind, f *fused) (ok, finite bool) {
	var err error
	from, tag := a.g.members[j], a.tag(s, c)
	ar, sums := a.r.t.(AxpyReceiver)
	fr, checks := a.r.t.(FiniteReceiver)
	switch {
	case f != nil && sums:
		var r Received
		r, err = ar.RecvAxpy(ctx, from, tag, dst, f.alpha, f.x)
		f.summed, f.in, f.ok, f.sums = r.Summed, r.In, r.Out, r.Sums
		finite = f.in
	case checks:
		finite, err = fr.RecvFinite(ctx, from, tag, dst)
	default:
		err = a.r.t.Recv(ctx, from, tag, dst)
	}
	switch {
	case err == nil:
		a.heard(j)
		return true, finite
	case a.dataCtx.Err() != nil:
		if a.overdue(j, mult) {
			a.accuse(j, k) // what the watchdog would have said, had it fired on time
		}
		return false, false
	case context.Cause(ctx) == errSilent:
		a.accuse(j, k)
		return false, false
	case context.Cause(ctx) == errUnresponsive:
		a.accuse(j, kindStall)
		return false, false
	}
	a.recvFailed(j, err)
	return false, false
}

// due is when a wait of mult stall timeouts on rank j runs out: mult stall
// timeouts after we last heard of j, or after the attempt's base.
func (a *attempt) due(j, mult int) int64 {
	return max(a.base, a.lastHeard[j].Load()) + int64(mult)*int64(a.stall)
}

// overdue reports whether a wait of mult stall timeouts on rank j has run
// out (see due). When the data phase stops (another member's FAIL
// vote, say) while a wait on j is overdue, its watchdog was late, as timers
// are on a busy machine, and the wait counts as timed out: the member that
// fired first may be downstream of the silence and blame this one for
// starving it, and only this blame shows that this one was starved too.
func (a *attempt) overdue(j, mult int) bool { return time.Now().UnixNano() >= a.due(j, mult) }

// recv is recvOne on a watchdog of its own.
func (a *attempt) recv(j int, s Step, c uint32, dst []float32, mult int, k kind) bool {
	ctx, stop := a.watch(j, mult)
	defer stop()
	return a.recvOne(ctx, j, s, c, dst, mult, k)
}

// recvWindow is how many Recvs a lane keeps posted: posted ahead, a chunk
// is copied into its place as it arrives (node/ does so) instead of being
// parked in a buffer of its own and copied later.
const recvWindow = 16

// recvLane receives count chunks of step s from rank j, chunk k under tag
// chunk first+k into buf(k), keeping up to recvWindow Recvs posted. It
// blames j for non-finite values in each chunk k for which check(k) (nil:
// none); a chunk it does not check is the caller's to check. fuse(k)
// (fuse nil: none) is chunk k's partial sum to add our contribution to on
// arrival where the transport can (recvChecked). It calls
// done(k) for each chunk in order (under a lock: done must not block) and
// returns whether all arrived.
func (a *attempt) recvLane(j int, s Step, first uint32, count int, buf func(k int) []float32, mult int, k kind, check func(k int) bool, fuse func(k int) *fused, done func(k int)) bool {
	if count == 0 {
		return true
	}
	ctx, stop := a.watch(j, mult)
	defer stop()
	var (
		mu     sync.Mutex
		fin    = make([]bool, count)
		next   int
		failed atomic.Bool
		wg     sync.WaitGroup
	)
	w := min(recvWindow, count)
	for i := range w {
		wg.Go(func() {
			for c := i; c < count; c += w {
				dst := buf(c)
				if failed.Load() {
					return
				}
				var f *fused
				if fuse != nil {
					f = fuse(c)
				}
				if ok, finite := a.recvChecked(ctx, j, s, first+uint32(c), dst, mult, k, f); !ok || (check != nil && check(c) && !finite && !a.checkFinite(j, dst)) {
					failed.Store(true)
					return
				}
				mu.Lock()
				for fin[c] = true; next < count && fin[next]; next++ {
					if done != nil {
						done(next)
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return !failed.Load() && next == count
}

func (a *attempt) recvFailed(j int, err error) {
	a.r.log.Debug("aggregate: recv failed", "self", a.r.self, "peer", a.g.members[j], "err", err)
	switch {
	case errors.Is(err, ErrClosed):
		a.setFatal(err)
	case errors.Is(err, ErrGroupMismatch):
		a.accuse(j, kindMismatch)
	case errors.Is(err, ErrBadLength):
		a.accuse(j, kindBadLength)
	case errors.Is(err, ErrBadValue):
		a.accuse(j, kindBadValue)
	case errors.Is(err, ErrDisconnected):
		a.accuse(j, kindGone)
	default:
		a.accuse(j, kindUnreachable)
	}
}

// send sends chunk (s, c) to rank j, giving it mult stall timeouts.
func (a *attempt) send(j int, s Step, c uint32, data []float32, mult int) bool {
	return a.sendSums(j, s, c, data, mult, nil)
}

// sendSums is send, of a chunk received with sums (AxpyReceiver) and sent
// on unchanged.
func (a *attempt) sendSums(j int, s Step, c uint32, data []float32, mult int, sums Checksums) bool {
	// A send blocks only while the receiver does not read (flow control):
	// give it mult stall timeouts, counted from the attempt's base at the
	// earliest, like a wait.
	start := max(time.Now().UnixNano(), a.base)
	deadline := time.Unix(0, start+int64(mult)*int64(a.stall))
	ctx, cancel := context.WithDeadline(a.dataCtx, deadline.Add(a.r.late))
	a.sends[j].Add(1)
	a.sending[j].Add(1)
	var err error
	if ar, ok := a.r.t.(AxpyReceiver); ok && sums != nil {
		err = ar.SendReceived(ctx, a.g.members[j], a.tag(s, c), data, sums)
	} else {
		err = a.r.t.Send(ctx, a.g.members[j], a.tag(s, c), data)
	}
	a.sending[j].Add(-1)
	cancel()
	if err == nil {
		return true
	}
	if a.dataCtx.Err() != nil {
		if !time.Now().Before(deadline) {
			a.accuse(j, kindTimeout) // the deadline was late (see overdue)
		}
		return false
	}
	a.r.log.Debug("aggregate: send failed", "self", a.r.self, "peer", a.g.members[j], "err", err)
	switch {
	case errors.Is(err, ErrClosed):
		a.setFatal(err)
	case errors.Is(err, ErrNotMember), errors.Is(err, ErrGroupMismatch):
		a.accuse(j, kindMismatch) // j's group leaves us out
	case errors.Is(err, context.DeadlineExceeded):
		a.accuse(j, kindTimeout)
	default:
		a.accuse(j, kindUnreachable)
	}
	return false
}

// wait takes a token from ch, or returns false when the data phase ends.
func (a *attempt) wait(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	case <-a.dataCtx.Done():
		return false
	}
}

// recvHeader waits for the header that opens rank j's lane of step s in
// pass p (on a watchdog of mult stall timeouts blaming k) and checks it
// against p. It returns false when the data phase is over for any reason.
func (a *attempt) recvHeader(j int, s Step, p *pass, mult int, k kind) (header, bool) {
	var buf [encHeaderLen]float32
	w := buf[:p.headerLen()]
	if !a.recv(j, s, p.tag(s, -1), w, mult, k) {
		return header{}, false
	}
	h, err := decodeHeader(w)
	switch {
	case err != nil:
		a.accuse(j, kindBadValue)
		return h, false
	case h.d != uint64(p.d):
		a.accuse(j, kindBadLength)
		return h, false
	case h.cfg != a.cfg:
		a.accuse(j, kindConfig)
		return h, false
	}
	return h, true
}

// every is the check of recvLane that checks every chunk.
func every(int) bool { return true }

// checkFinite blames rank j for a non-finite value in x.
func (a *attempt) checkFinite(j int, x []float32) bool {
	if rule.FirstNonFinite(x) >= 0 {
		a.accuse(j, kindBadValue)
		return false
	}
	return true
}

// outcome is an attempt's decision.
type outcome struct {
	commit   bool
	excluded []*PeerError
}

func (o outcome) cause() error {
	if len(o.excluded) == 0 {
		return errors.New("a member failed without blaming anyone")
	}
	errs := make([]error, len(o.excluded))
	for i, pe := range o.excluded {
		errs[i] = pe
	}
	return errors.Join(errs...)
}

// ringChecksOwn reports whether run goes to the ring, which checks this
// rank's own input where it reads it.
func (a *attempt) ringChecksOwn() bool { return a.r.comp == nil && a.algo == Ring && a.n > 1 }

// run runs the data phase and the vote, and decides.
func (a *attempt) run(ctx context.Context) (outcome, error) {
	a.dataCtx, a.stopData = context.WithCancel(ctx)
	defer a.stopData()
	voteCtx, stopVotes := context.WithCancel(ctx)
	defer stopVotes()

	// Own input: vote to be left out. The ring checks it as it reads it
	// (ring, ringSend), which saves a pass over src.
	if !a.ringChecksOwn() && rule.FirstNonFinite(a.src) >= 0 {
		a.accuse(a.rank, kindBadValue)
	}

	// Votes double as the abort signal: a FAIL vote stops the data phase.
	var votes sync.WaitGroup
	arrived := make(chan int, a.n)
	vl := voteLen(a.n)
	vbuf := a.r.buf("votes", a.n*vl)
	for j := range a.n {
		if j == a.rank {
			continue
		}
		votes.Go(func() {
			a.recvVote(voteCtx, j, vbuf[j*vl:(j+1)*vl])
			arrived <- j
		})
	}

	if !a.bad.Load() {
		switch {
		case a.r.comp != nil:
			a.compressed()
		case a.algo == Tree:
			a.tree(a.plainPass())
		case a.algo == Ring:
			a.ring()
		default:
			a.butterfly(a.plainPass())
		}
	}
	ok := !a.bad.Load() && a.lanes.Load() == 0
	a.stopData()
	a.mu.Lock()
	fatal := a.fatal
	own := vote{ok: ok, cfg: a.cfg, d: uint64(len(a.src)), fault: a.fault, blame: slices.Clone(a.blame)}
	a.mu.Unlock()
	if err := ctx.Err(); err != nil {
		fatal = fmt.Errorf("aggregate: %v: %w", a.g, err)
	}
	if fatal != nil {
		stopVotes()
		votes.Wait()
		return outcome{}, fatal
	}
	a.votes[a.rank] = peerVote{state: voteGot, v: own, digest: a.g.digest, known: true}
	a.r.log.Debug("aggregate: data phase over", "self", a.r.self, "group", a.g.String(), "ok", ok, "after", time.Since(time.Unix(0, a.start)))

	// Send our vote to everyone, then wait for theirs: until all are in,
	// or every missing one is from a member some vote already blames, or
	// the vote window closes.
	sends := &a.r.voteSends
	vw := make([]float32, vl)
	own.encode(vw)
	for j := range a.n {
		if j == a.rank {
			continue
		}
		sends.Go(func() {
			sctx, cancel := context.WithTimeout(ctx, a.stall)
			defer cancel()
			// A lost vote reads as silence.
			if err := a.r.t.Send(sctx, a.g.members[j], a.tag(StepVote, 0), vw); err != nil {
				a.r.log.Debug("aggregate: vote not sent", "self", a.r.self, "peer", a.g.members[j], "err", err)
			}
		})
	}
	//
	// The window is long (voteWait) while the attempt may have succeeded: a
	// member still in its data phase may yet time out on a dependent wait.
	// Once any vote says FAIL, every live member has been told (votes go to
	// all) and stops its data phase at once, so two stall timeouts from
	// then are enough for the remaining votes.
	// Both windows count from the attempt's base at the earliest: members
	// may have entered a re-run up to its grace apart.
	base := time.Unix(0, a.base)
	long := later(time.Now(), base).Add(a.voteWait())
	timer := time.AfterFunc(time.Until(long), stopVotes)
	failed := !own.ok
	shorten := func() {
		if short := later(time.Now(), base).Add(2 * a.stall); short.Before(long) {
			timer.Reset(time.Until(short))
		}
	}
	if failed {
		shorten()
	}
	pending := make([]bool, a.n)
	for j := range pending {
		pending[j] = j != a.rank
	}
	for left := a.n - 1; left > 0; left-- {
		j := <-arrived
		pending[j] = false
		if !failed && (a.votes[j].state != voteGot || !a.votes[j].v.ok) {
			failed = true
			shorten()
		}
		if a.onlyBlamedMissing(pending) {
			stopVotes()
		}
	}
	timer.Stop()
	stopVotes()
	votes.Wait()
	// The vote sends are not waited for here (one to a dead or frozen
	// member may take a stall timeout); AllReduce waits for them on return.
	if err := ctx.Err(); err != nil {
		return outcome{}, fmt.Errorf("aggregate: %v: %w", a.g, err)
	}
	return a.decide()
}

// onlyBlamedMissing reports whether every member whose vote is pending is
// blamed with a hard kind (which excludes it whatever it votes) by a vote
// already in (ours included) from a member that shares our group and
// settings. Blame for a disagreement (another group, other settings, another
// length) does not count: there the accused is alive and its vote is what
// tells which side is the odd one out.
func (a *attempt) onlyBlamedMissing(pending []bool) bool {
	for j, p := range pending {
		if !p {
			continue
		}
		blamed := false
		for i := range a.n {
			if !pending[i] && a.votes[i].state == voteGot && a.votes[i].v.cfg == a.cfg && a.votes[i].v.blame[j].silences() {
				blamed = true
				break
			}
		}
		if !blamed {
			return false
		}
	}
	return true
}

// peerVote is what this peer learned of one member's vote.
type peerVote struct {
	state  uint8 // voteMissing, voteGot, voteOther
	v      vote
	digest uint64 // the voter's group digest
	known  bool   // v decoded
}

const (
	voteMissing uint8 = iota
	voteGot
	voteOther // the voter formed another group or sent a malformed vote
)

func (a *attempt) recvVote(ctx context.Context, j int, buf []float32) {
	pv := &a.votes[j]
	err := a.r.t.Recv(ctx, a.g.members[j], a.tag(StepVote, 0), buf)
	var me *MismatchError
	switch {
	case err == nil:
		a.heard(j)
		if decodeVote(buf, a.n, &pv.v) != nil {
			pv.state, pv.digest = voteOther, 0
			return
		}
		pv.state, pv.digest, pv.known = voteGot, a.g.digest, true
		if !pv.v.ok {
			a.stopData()
		}
	case errors.As(err, &me):
		pv.state, pv.digest = voteOther, me.Got
		pv.known = decodeVote(buf, a.n, &pv.v) == nil
		a.stopData()
	case ctx.Err() != nil, errors.Is(err, ErrDisconnected):
		// missing (a dead peer's vote will not come)
	case errors.Is(err, ErrClosed):
		a.setFatal(err)
	default:
		pv.state = voteOther
		a.stopData()
	}
}

// decide turns the votes into a commit, a list of peers to exclude, or an
// error for this peer. All members that hold the same votes decide alike.
//
//   - Voters are split into classes by (group digest, settings hash); the
//     largest class wins (ties to the smaller key). A peer outside it
//     returns an error; the class excludes everyone outside it.
//   - A group-wide fault (overflow, zero total weight) in the class ends
//     the round with that error for everyone.
//   - If every class vote is OK, commit: the data phase completed for every
//     voter, so the result includes every member's contribution. (Members
//     whose votes are missing died after doing their part.)
//   - Otherwise exclude the members that did not vote, those outside the
//     class, those a class voter blames with a hard kind, and those blamed
//     for a timeout on a wait that depends on others whose own vote blames
//     nobody: a member that can blame no one is where the chain of waiting
//     ends. Blame for an unreachable peer (a failed send, a reset stream)
//     alone excludes no voter: a member that stops its data phase cancels
//     its sends, and some transports reset the receivers' streams.
func (a *attempt) decide() (outcome, error) {
	if a.r.log.Enabled(context.Background(), slog.LevelDebug) {
		for j := range a.n {
			pv := &a.votes[j]
			a.r.log.Debug("aggregate: vote", "self", a.r.self, "group", a.g.String(), "voter", a.g.members[j],
				"state", pv.state, "ok", pv.v.ok, "cfg", pv.v.cfg, "digest", pv.digest, "blame", fmt.Sprint(pv.v.blame))
		}
	}
	type key struct{ digest, cfg uint64 }
	mine := key{a.g.digest, a.cfg}
	counts := map[key]int{}
	keyOf := func(j int) (key, bool) {
		pv := &a.votes[j]
		switch {
		case pv.state == voteGot:
			return key{pv.digest, pv.v.cfg}, true
		case pv.state == voteOther && pv.known:
			return key{pv.digest, pv.v.cfg}, true
		case pv.state == voteOther && pv.digest != 0:
			// Another group (its vote may not even fit ours): settings
			// unknown, so all such voters of one digest count together.
			return key{pv.digest, 0}, true
		}
		return key{}, false
	}
	for j := range a.n {
		if k, ok := keyOf(j); ok {
			counts[k]++
		}
	}
	best := mine
	for k, c := range counts {
		if c > counts[best] || (c == counts[best] && (k.digest < best.digest || (k.digest == best.digest && k.cfg < best.cfg))) {
			best = k
		}
	}
	if best != mine {
		// We are the odd one out. Say why as precisely as the votes allow.
		why := ErrGroupMismatch
		if best.digest == mine.digest {
			why = ErrConfigMismatch
			for j := range a.n {
				if k, ok := keyOf(j); ok && k == best && a.votes[j].v.d != uint64(len(a.src)) {
					why = ErrBadLength
					break
				}
			}
		}
		return outcome{}, fmt.Errorf("%w: %w", ErrExcluded, &PeerError{Peer: a.r.self, Err: fmt.Errorf("%w: %d of %d members formed another view of %v", why, counts[best], a.n, a.g)})
	}
	inClass := func(j int) bool { k, ok := keyOf(j); return ok && k == mine && a.votes[j].state == voteGot }

	allOK := true
	for j := range a.n {
		if !inClass(j) {
			continue
		}
		v := &a.votes[j].v
		if v.fault != faultNone {
			return outcome{}, fmt.Errorf("aggregate: %v: %w (reported by %s)", a.g, v.fault.err(), a.g.members[j])
		}
		allOK = allOK && v.ok
	}
	if allOK {
		return outcome{commit: true}, nil
	}

	why := make([]kind, a.n)
	note := func(j int, k kind) {
		if old := why[j]; old == kindNone || (!old.hard() && k.hard()) || (old == kindStall && k.hard() && k != kindStall) {
			why[j] = k
		}
	}
	for j := range a.n {
		switch {
		case a.votes[j].state == voteMissing:
			note(j, kindStall)
		case !inClass(j):
			k := kindMismatch
			if a.votes[j].known && a.votes[j].digest == a.g.digest {
				k = kindConfig
				if a.votes[j].v.d != uint64(len(a.src)) {
					k = kindBadLength
				}
			}
			note(j, k)
		}
	}
	for i := range a.n {
		if !inClass(i) {
			continue
		}
		for j, k := range a.votes[i].v.blame {
			switch {
			case k == kindNone:
			case k.hard():
				note(j, k)
			case k == kindTimeout && (!inClass(j) || !a.votes[j].v.blames()):
				note(j, k)
			}
		}
	}
	var out outcome
	for j, k := range why {
		if k == kindNone {
			continue
		}
		pe := &PeerError{Peer: a.g.members[j], Err: fmt.Errorf("%w in %v", k.err(), a.g)}
		if j == a.rank {
			return outcome{}, fmt.Errorf("%w: %w", ErrExcluded, pe)
		}
		out.excluded = append(out.excluded, pe)
	}
	return out, nil
}

func sortPeerErrors(pes []*PeerError) {
	slices.SortFunc(pes, func(a, b *PeerError) int { return cmp.Compare(a.Peer, b.Peer) })
}

// isFinite reports whether f is neither NaN nor ±Inf.
func isFinite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }

func discardLogger() *slog.Logger { return slog.New(discard{}) }

// discard is a slog.Handler that drops everything.
type discard struct{}

func (discard) Enabled(context.Context, slog.Level) bool  { return false }
func (discard) Handle(context.Context, slog.Record) error { return nil }
func (d discard) WithAttrs([]slog.Attr) slog.Handler      { return d }
func (d discard) WithGroup(string) slog.Handler           { return d }

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
