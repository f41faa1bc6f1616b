package train

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/starling-ml/starling/aggregate"
	"github.com/starling-ml/starling/internal/ctxtime"
	"github.com/starling-ml/starling/peerid"
	"github.com/starling-ml/starling/trace"
)

// Synchronous data-parallel SGD.
//
// Every peer trains on its own shard with the same model and optimiser.
// Each step it computes the gradient of its next batch, all-reduces it with
// the other members of the step's group (a mean weighted by batch size, so
// the result is the gradient of the union of the batches), and applies the
// same optimiser step; the members therefore hold the same parameters after
// every step, as one peer with the union batch would.
//
// Who takes part. The group of step s is the group whose gradients step
// s−1 averaged (every member learns it, identically, from its all-reduce),
// plus the peers that declared they join at step s. A member that dies or
// stalls during step s is left out by the all-reduce itself (aggregate's
// votes) and the survivors apply step s without it. A peer that starts
// late, or that was left out of a step, (re)joins:
//
//  1. it looks at the others' statuses (Net.Statuses): if no
//     running peer is ahead of it, it starts (or continues) from its own
//     state with the peers at its own step — a fresh job starts this way;
//  2. otherwise it picks a step T ahead of the most advanced running peer
//     by JoinLead at their current pace, declares "joining at T"
//     (SetStatus, sent at once), and fetches the state after step T−1
//     (parameters and optimiser state), which the running peers publish
//     when they see a declaration for T;
//  3. it enters step T's all-reduce with the running peers and the other
//     joiners of T. If the running peers did not all see the declaration in
//     time, the all-reduce's group vote leaves the minority out, and it
//     tries again with a longer lead.
//
// A Fixed job has none of this: every member starts together and a peer
// left out of a step stops with an error.

// SyncConfig configures synchronous data-parallel SGD. Every peer of a job
// uses the same settings, the same model and optimiser (WorkerConfig) and
// the same batch size.
type SyncConfig struct {
	// Steps is the number of optimiser steps of the job (the global step
	// count at which every peer stops).
	Steps int
	// StepTimeout bounds one step's all-reduce on top of the all-reduce's
	// own failure detection (aggregate's stall timeouts). 2 min.
	StepTimeout time.Duration
	// JoinLead is how far ahead, in time at the running peers' pace, a
	// joining peer declares the step at which it joins: long enough for the
	// declaration to reach every running peer (gossip heartbeats carry the
	// pace with up to one heartbeat interval of delay). 2 s. It doubles
	// after each failed attempt.
	JoinLead time.Duration
	// JoinTimeout bounds how long a peer tries to (re)join before it gives
	// up with ErrNoState. 5 min.
	JoinTimeout time.Duration
	// SnapshotEvery records a snapshot of the parameters (Recorder) every
	// that many steps; 0 records only the last.
	SnapshotEvery int
	// Fixed runs a fixed job: the members at the start take every step
	// together, nobody joins, and a peer left out of a step stops with an
	// error instead of rejoining. Simulations that compare strategies use
	// it: the job's timing is then the steps', not the joins'.
	Fixed bool
	// Discover is how long a starting peer that knows of no other member
	// waits for one to show up (and their statuses with it) before it
	// starts alone: a restarted peer must not start a job of its own
	// beside the running one. 2 s (two gossip heartbeats).
	Discover time.Duration
	// DeMo, when on, exchanges DeMo's sparse momentum coefficients instead
	// of the gradients and hands the optimiser their sign (see DeMo): the
	// worker's optimiser should be plain SGD, and the all-reduce's codec
	// "sparse". Its momentum is this peer's own: a peer that (re)joins
	// starts it at zero.
	DeMo DeMoConfig
	// GroupSize bounds the all-reduce groups. A step whose group holds
	// more peers splits it into groups of at most GroupSize, drawn afresh
	// each step from (step, group) by aggregate.Partition, so every peer
	// derives the same groups without a message; each group averages its
	// members' gradients and their parameters (which then differ between
	// groups until later steps mix them: the spread shrinks by about
	// 1/GroupSize a step). 0: one group however large. 16.
	GroupSize int
	// AgreeEvery makes every AgreeEvery-th step (steps 1, 1+AgreeEvery, …)
	// of a job in bounded groups an agreement step: the whole group
	// all-reduces, and that all-reduce's votes fix, identically on every
	// peer, the set the groups of the next steps are drawn from (peers'
	// views of the members differ for a heartbeat or so, and groups drawn
	// from different sets do not meet). Peers join at agreement steps; a
	// peer that dies is left out of its group's steps by a stall timeout
	// each until the next one. 1: every step is one (no bounded groups).
	// 20.
	AgreeEvery int
}

// DefaultSyncConfig returns the defaults documented on SyncConfig, for a
// 1000-step job.
func DefaultSyncConfig() SyncConfig {
	return SyncConfig{Steps: 1000, StepTimeout: 2 * time.Minute, JoinLead: 2 * time.Second, JoinTimeout: 5 * time.Minute,
		SnapshotEvery: 100, Discover: 2 * time.Second, GroupSize: 16, AgreeEvery: 20}
}

// ErrSync reports synchronous settings that cannot work.
var ErrSync = errors.New("train: bad synchronous SGD settings")

// Validate reports settings that cannot work, wrapping ErrSync.
func (c SyncConfig) Validate() error {
	switch {
	case c.Steps <= 0:
		return fmt.Errorf("%w: steps must be positive, got %d", ErrSync, c.Steps)
	case c.StepTimeout <= 0 || c.JoinLead <= 0 || c.JoinTimeout <= 0:
		return fmt.Errorf("%w: step timeout, join lead and join timeout must be positive", ErrSync)
	case c.SnapshotEvery < 0 || c.Discover < 0:
		return fmt.Errorf("%w: snapshot interval and discovery wait must not be negative", ErrSync)
	case c.GroupSize < 0:
		return fmt.Errorf("%w: group size must not be negative, got %d", ErrSync, c.GroupSize)
	case c.GroupSize > 0 && c.AgreeEvery < 1:
		return fmt.Errorf("%w: agreement interval must be at least 1 step with bounded groups, got %d", ErrSync, c.AgreeEvery)
	}
	return c.DeMo.Validate()
}

// StepInfo describes a step as one peer saw it.
type StepInfo struct {
	// Step is the number of steps applied: the model version.
	Step uint64
	// Group lists the peers whose gradients step Step averaged (sorted):
	// with bounded groups (SyncConfig.GroupSize), this peer's group.
	Group []peerid.ID
	// Loss and Samples are this peer's batch loss and size for the step.
	Loss    float64
	Samples int
	Elapsed time.Duration
	// Joined reports a state fetched from the running peers: this peer
	// (re)joined the job and holds the state after step Step.
	Joined bool
	// Failed reports that this peer was left out of step Step+1; its state
	// is still that after step Step, and it will rejoin.
	Failed bool
	// Err is why the step failed.
	Err error
}

// Sync runs synchronous data-parallel SGD for one peer until the job's
// step count is reached, ctx ends or onStep returns true. The worker's
// optimiser must be fresh or hold the state of w.Steps global steps (a
// restored checkpoint): the peer starts at step w.Steps. onStep, if not
// nil, is called after every step this peer applied, after it (re)joined,
// and after a step it was left out of, from Sync's goroutine; it must not
// keep the Group slice. Stopping before the last step, whatever the
// reason, Sync tells the other peers that this one is Done (taking at
// most stopNotice).
func Sync(ctx context.Context, w *Worker, net Net, cfg SyncConfig, rec Recorder, onStep func(StepInfo) bool) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if w.Steps < 0 || w.Steps > cfg.Steps {
		return fmt.Errorf("%w: the worker is at step %d of %d", ErrSync, w.Steps, cfg.Steps)
	}
	st, err := newSyncState(w)
	if err != nil {
		return err
	}
	s := &syncPeer{w: w, net: net, cfg: cfg, rec: rec, st: st, self: net.Self(), start: time.Now(),
		avg: make([]float32, len(w.Model.Params)), version: uint64(w.Steps)}
	if cfg.DeMo.On() {
		if s.demo, err = NewDeMo(cfg.DeMo, w.Model.Views(), w.Model.Backend()); err != nil {
			return err
		}
		s.send = make([]float32, len(w.Model.Params))
	}
	err = s.run(ctx, onStep)
	switch {
	case cfg.Fixed:
	case s.version < uint64(cfg.Steps):
		// Whatever ended the run (ctx included), tell the others: a peer
		// whose node stays up would otherwise be waited for at every step,
		// and in a pair, whose quorum needs both, forever.
		announceStop(ctx, func(ctx context.Context) {
			net.SetStatus(ctx, Status{Version: s.version, Done: true, Rate: s.rate})
		})
	default:
		// Finished, perhaps by taking the final state as a late joiner
		// (whose status still shows its declaration): peers that finished
		// stay up while others are on their way (peer run's linger) and
		// need not wait for this one.
		net.SetStatus(ctx, Status{Version: s.version, Rate: s.rate})
	}
	return err
}

// stopNotice bounds the announcement that a peer stopped.
const stopNotice = 2 * time.Second

// announceStop runs announce with a context that outlives ctx (a run that
// ended because ctx did must still say so) but ends after stopNotice.
func announceStop(ctx context.Context, announce func(context.Context)) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopNotice)
	defer cancel()
	announce(actx)
}

// syncPeer is one peer's synchronous loop.
type syncPeer struct {
	w     *Worker
	net   Net
	cfg   SyncConfig
	rec   Recorder
	st    *syncState
	self  peerid.ID
	start time.Time
	avg   []float32
	demo  *DeMo     // nil: plain data-parallel SGD
	send  []float32 // DeMo's coefficients
	// mix and mixAvg are [gradients | parameters], for bounded groups.
	mix, mixAvg []float32

	version uint64 // steps applied
	// group is the job's group at the last step (all its bounded groups
	// together); nil: (re)join first.
	group    []peerid.ID
	rate     float64   // steps per second (moving average)
	lastStep time.Time // when the last step was applied
	left     bool      // the last attempt failed: equal peers may be ahead
	started  bool      // the first join (with its discovery wait) is done
}

func (s *syncPeer) run(ctx context.Context, onStep func(StepInfo) bool) error {
	total := uint64(s.cfg.Steps)
	call := func(si StepInfo) bool {
		si.Elapsed = time.Since(s.start)
		return onStep != nil && onStep(si)
	}
	s.snapshot()
	for s.version < total {
		if err := ctx.Err(); err != nil {
			return err
		}
		if s.group == nil {
			joined, err := s.join(ctx)
			if err != nil {
				return err
			}
			if joined && call(StepInfo{Step: s.version, Group: s.group, Joined: true}) {
				return nil
			}
			continue
		}
		info, err := s.step(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			var fatal *syncFatal
			if errors.As(err, &fatal) {
				return fatal.err
			}
			s.event("step-failed", err.Error())
			if s.cfg.Fixed {
				return fmt.Errorf("train: sync step %d: %w", s.version+1, err)
			}
			s.group, s.left, s.lastStep = nil, true, time.Time{}
			if call(StepInfo{Step: s.version, Failed: true, Err: err}) {
				return nil
			}
			continue
		}
		if (s.cfg.SnapshotEvery > 0 && s.version%uint64(s.cfg.SnapshotEvery) == 0) || s.version == total {
			s.snapshot()
		}
		if s.version == total && !s.cfg.Fixed {
			// Peers that come too late to take part can still end with
			// the job's result.
			s.net.Publish(s.version, s.st.pack(s.w))
		}
		if call(info) {
			return nil
		}
	}
	return nil
}

// errAhead sends a peer to rejoin the group ahead of its own.
var errAhead = errors.New("train: another group of the job is ahead")

// syncFatal marks errors that end the peer's training (not a step it can
// rejoin after).
type syncFatal struct{ err error }

func (e *syncFatal) Error() string { return e.err.Error() }

// step runs step version+1 with the current group, and the peers that
// declared they join at it (admit).
func (s *syncPeer) step(ctx context.Context) (StepInfo, error) {
	w := s.w
	next := s.version + 1
	endCompute := trace.Start(ctx, trace.Train, "compute", int64(next))
	loss, k, err := w.Grad(ctx)
	endCompute()
	if err != nil {
		return StepInfo{}, &syncFatal{err}
	}
	group := s.group
	if !s.cfg.Fixed {
		a := admit(next, uint64(s.cfg.Steps), group, s.net.Members(), s.net.Statuses())
		if a.ahead != "" {
			return StepInfo{}, fmt.Errorf("%w: %s runs outside our group at step %d", errAhead, a.ahead, a.aheadAt)
		}
		if len(a.joining) > 0 {
			s.net.Publish(s.version, s.st.pack(w))
			s.event("admit", fmt.Sprintf("%v at step %d", a.joining, next))
		}
		group = a.group
	}
	// DeMo sends its coefficients in place of the gradients.
	grads := w.Model.Grads
	if s.demo != nil {
		endDeMo := trace.Start(ctx, trace.Train, "encode", int64(next))
		s.demo.Prepare(s.send, w.Model.Grads)
		endDeMo()
		grads = s.send
	}
	// In bounded groups (and at their agreement steps) the parameters are
	// averaged with the gradients: the groups' models differ.
	mine, src, dst := group, grads, s.avg
	bounded := s.cfg.GroupSize > 0 && len(group) > s.cfg.GroupSize
	grouped := groupedStep(next, group, s.cfg.GroupSize, s.cfg.AgreeEvery)
	if grouped {
		mine = aggregate.GroupOf(0, next, group, s.cfg.GroupSize, s.self)
	}
	if bounded {
		n := len(w.Model.Params)
		if len(s.mix) != 2*n {
			s.mix, s.mixAvg = make([]float32, 2*n), make([]float32, 2*n)
		}
		copy(s.mix[:n], grads)
		copy(s.mix[n:], w.Model.Params)
		src, dst = s.mix, s.mixAvg
	}
	sctx, cancel := context.WithTimeout(ctx, s.cfg.StepTimeout)
	endAR := trace.StartArgs(ctx, trace.Net, "allreduce", int64(next), trace.Args{"floats": len(src), "group": len(mine)})
	used, err := s.net.AllReduce(sctx, next, mine, dst, src, float64(k))
	endAR()
	cancel()
	if err != nil {
		if errors.Is(err, aggregate.ErrOverflow) || errors.Is(err, aggregate.ErrZeroWeight) {
			// The whole group got it: the mean gradient is not finite.
			return StepInfo{}, &syncFatal{fmt.Errorf("%w: step %d: %w", ErrDiverged, next, err)}
		}
		if !grouped || ctx.Err() != nil {
			return StepInfo{}, err
		}
		// A failed group is not a failed job: the groups' models differ
		// anyway, so this peer takes the step on its own gradient, as a
		// hivemind peer whose averaging fails does, and the next steps'
		// groups mix it back in. Leaving to rejoin would change the set
		// the groups are drawn from mid-interval.
		s.event("group-failed", fmt.Sprintf("step %d: stepping alone: %v", next, err))
		copy(dst, src)
		used = []peerid.ID{s.self}
	}
	endApply := trace.Start(ctx, trace.Train, "apply", int64(next))
	n := len(w.Model.Params)
	if s.demo != nil {
		s.demo.Commit()
		s.demo.Finish(w.Model.Grads, dst[:n])
	} else {
		copy(w.Model.Grads, dst[:n])
	}
	job := used
	if bounded {
		// The group's mean parameters, then its mean gradient's step.
		copy(w.Model.Params, dst[n:])
	}
	if grouped {
		// Losses in this peer's group are news to the others: the set
		// changes at the next agreement step.
		job = group
	}
	w.Apply(k)
	endApply()
	s.version, s.group, s.left = next, job, false
	now := time.Now()
	s.rate, s.lastStep = pace(s.rate, s.lastStep, now), now
	if !s.cfg.Fixed {
		if err := s.net.SetStatus(ctx, Status{Version: next, Rate: s.rate}); err != nil && ctx.Err() != nil {
			return StepInfo{}, ctx.Err()
		}
	}
	return StepInfo{Step: next, Group: used, Loss: loss, Samples: k}, nil
}

// join brings the peer into the job, look by look (planJoin): it either
// starts from its own state with the peers at the same step, or fetches
// the running peers' state and joins them at a declared step, until
// JoinTimeout. joined reports a fetched state.
func (s *syncPeer) join(ctx context.Context) (joined bool, err error) {
	if s.cfg.Fixed {
		s.group = s.net.Members()
		return false, nil
	}
	steps := uint64(s.cfg.Steps)
	lead := s.cfg.JoinLead
	now := time.Now()
	deadline := now.Add(s.cfg.JoinTimeout)
	var discover time.Time // only the first join waits for discovery
	if !s.started {
		s.started, discover = true, now.Add(s.cfg.Discover)
	}
	stale := now.Add(staleStatuses)
	buf := make([]float32, s.st.size())
	for {
		if err := ctx.Err(); err != nil {
			return false, err
		}
		plan := planJoin(joinView{self: s.self, version: s.version, steps: steps, left: s.left, lead: lead,
			groupSize: s.cfg.GroupSize, agreeEvery: s.cfg.AgreeEvery,
			members: s.net.Members(), statuses: s.net.Statuses(), now: time.Now(), discover: discover, stale: stale})
		var want uint64 // the version to fetch
		switch plan.action {
		case joinLook:
			if err := ctxtime.Sleep(ctx, plan.pause); err != nil {
				return false, err
			}
			continue
		case joinStart:
			if err := s.net.SetStatus(ctx, Status{Version: s.version, Rate: s.rate}); err != nil {
				return false, err
			}
			s.group, s.left = plan.group, false
			return false, nil
		case joinDeclare:
			if err := s.net.SetStatus(ctx, Status{JoinAt: plan.at, Rate: s.rate}); err != nil {
				return false, err
			}
			s.event("join", fmt.Sprintf("declared step %d (others at %d, %.1f steps/s)", plan.at, plan.top, plan.rate))
			want = plan.at - 1
		case joinFinal:
			want = plan.at
		}
		fctx, cancel := context.WithTimeout(ctx, min(plan.wait, time.Until(deadline)+time.Second))
		v, err := s.net.Fetch(fctx, plan.from, want, buf)
		cancel()
		if err == nil && v == want {
			if err := s.st.unpack(s.w, buf, v); err != nil {
				return false, &syncFatal{err}
			}
			s.version, s.left = v, false
			if plan.action == joinFinal {
				s.group = nil // nothing left to take part in
				s.event("joined", fmt.Sprintf("final state of step %d", v))
			} else {
				s.group = joinGroup(s.self, plan.at, steps, s.net.Members(), s.net.Statuses())
				s.event("joined", fmt.Sprintf("state of step %d", v))
			}
			return true, nil
		}
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		if time.Now().After(deadline) {
			if plan.action == joinFinal {
				return false, fmt.Errorf("%w: the job's final state (step %d) from %v within %v: %v", ErrNoState, s.cfg.Steps, plan.from, s.cfg.JoinTimeout, err)
			}
			return false, fmt.Errorf("%w: could not join the running peers %v within %v (last: version %d, %v)", ErrNoState, plan.from, s.cfg.JoinTimeout, v, err)
		}
		s.left = false // peers at our own step no longer count as ahead
		if plan.action == joinDeclare {
			// Missed it: the others were faster than we thought, or nobody
			// runs any more.
			s.event("join-missed", fmt.Sprintf("step %d: got version %d: %v", plan.at, v, err))
			lead = nextLead(lead, s.cfg.JoinLead)
		}
	}
}

func (s *syncPeer) event(kind, detail string) {
	if s.rec != nil {
		s.rec.Event(Event{Peer: string(s.self), At: time.Since(s.start), Kind: kind, Detail: detail})
	}
}

func (s *syncPeer) snapshot() {
	if s.rec != nil {
		s.rec.Snapshot(string(s.self), time.Since(s.start), int(s.version), s.w.Model.Params)
	}
}

// syncState is the layout of a synchronous peer's state vector: the
// parameters, then the optimiser's vectors in the order of their names.
// The optimiser's step count is the global step (the state's version).
type syncState struct {
	n    int
	keys []string
	buf  []float32
}

// newSyncState fixes the layout for w. An optimiser that creates its
// vectors at its first step (momentum, Adam) is made to create them now,
// as zeros, which is the same state as a fresh one.
func newSyncState(w *Worker) (*syncState, error) {
	n := len(w.Model.Params)
	steps, vecs := w.Opt.State()
	if len(vecs) == 0 && steps == 0 {
		scratch := slices.Clone(w.Model.Params)
		w.Opt.Step(scratch, make([]float32, n), 0)
		_, made := w.Opt.State()
		zero := make(map[string][]float32, len(made))
		for k, v := range made {
			zero[k] = make([]float32, len(v))
		}
		if err := w.Opt.SetState(0, zero); err != nil {
			return nil, err
		}
		_, vecs = w.Opt.State()
	}
	st := &syncState{n: n}
	for k, v := range vecs {
		if len(v) != n {
			return nil, fmt.Errorf("%w: optimiser vector %q has %d values, the model %d", ErrSync, k, len(v), n)
		}
		st.keys = append(st.keys, k)
	}
	sort.Strings(st.keys)
	return st, nil
}

func (st *syncState) size() int { return st.n * (1 + len(st.keys)) }

// pack returns w's state in the layout; the slice is reused by the next
// call.
func (st *syncState) pack(w *Worker) []float32 {
	st.buf = append(st.buf[:0], w.Model.Params...)
	_, vecs := w.Opt.State()
	for _, k := range st.keys {
		st.buf = append(st.buf, vecs[k]...)
	}
	return st.buf
}

// unpack loads a state of version steps into w.
func (st *syncState) unpack(w *Worker, state []float32, version uint64) error {
	if len(state) != st.size() {
		return fmt.Errorf("%w: state of %d values, want %d", ErrNoState, len(state), st.size())
	}
	copy(w.Model.Params, state[:st.n])
	vecs := make(map[string][]float32, len(st.keys))
	for i, k := range st.keys {
		vecs[k] = state[(i+1)*st.n : (i+2)*st.n]
	}
	if err := w.Opt.SetState(int(version), vecs); err != nil {
		return err
	}
	w.Steps = int(version)
	return nil
}
