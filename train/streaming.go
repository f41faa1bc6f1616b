package train

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/starling-ml/starling/aggregate"
	"github.com/starling-ml/starling/internal/ctxtime"
	"github.com/starling-ml/starling/nn"
	"github.com/starling-ml/starling/peerid"
	"github.com/starling-ml/starling/trace"
)

// Streaming DiLoCo (Douillard et al. 2025, arXiv 2501.18512): DiLoCo whose
// outer step synchronises one fragment of the model at a time. The
// model's tensors are split into F strided fragments (tensor i belongs to
// fragment i mod F); in every outer step of H inner steps fragment p is
// synchronised after inner step (p+1)·H/F of the step, so the F fragments
// take turns and the peak traffic is 1/F of DiLoCo's. A synchronisation
// of fragment p in outer step o:
//
//	Δ_p  = θ_local,p − θ_global,p               (fp32)
//	Δ̄_p  = mean over the peers of Δ_p           (all-reduce; the runner's
//	                                              codec, e.g. fp4, on the wire)
//	θ_global,p ← Nesterov_p(θ_global,p, Δ̄_p)    (one outer optimiser per fragment)
//	θ_local,p  ← α·θ_local,p + (1−α)·θ_global,p
//
// With overlap τ > 0 the all-reduce runs while τ more inner steps go on,
// and its result is merged (the last two lines) after them. τ may reach
// H − 1: past H/F, the next fragments' all-reduces queue behind the
// running one (one at a time, in launch order), so a slow link or a
// late peer holds the training loop only once a fragment is due.
//
// async-diloco (PCCL's async DiLoCo, one-step-delayed outer updates) is
// the case F = 1, τ = H: outer step o's all-reduce runs during all of
// outer step o+1's inner steps, and its merge keeps those steps' progress
// instead of mixing: θ_local ← θ_global + (θ_local − θ_local at the
// launch). Every peer's Δ of outer step o+1 is then its own progress in
// that step, taken from a point one outer update behind.
//
// Each all-reduce runs as round fragmentRound(o, p, F) of the runner, a
// key unique to (outer step, fragment) that grows with both: chunks of
// another outer step or fragment are another round's and never mixed in
// (a runner refuses chunks of older rounds outright), and the fragment's
// length is part of the round's configuration hash.

// fragmentSpans returns, for each of f fragments, the [lo, hi) ranges of
// the flat parameter vector its tensors cover: tensor i goes to fragment
// i mod f. A fragment may be empty (fewer tensors than fragments).
func fragmentSpans(views []nn.View, f int) [][][2]int {
	out := make([][][2]int, f)
	for i, v := range views {
		out[i%f] = append(out[i%f], [2]int{v.Offset, v.Offset + v.Len})
	}
	return out
}

// spansLen returns the number of values spans cover.
func spansLen(spans [][2]int) int {
	n := 0
	for _, s := range spans {
		n += s[1] - s[0]
	}
	return n
}

// gather copies the values of spans of src into dst (packed).
func gather(dst, src []float32, spans [][2]int) {
	k := 0
	for _, s := range spans {
		k += copy(dst[k:], src[s[0]:s[1]])
	}
}

// scatter copies packed src back into the spans of dst.
func scatter(dst, src []float32, spans [][2]int) {
	k := 0
	for _, s := range spans {
		k += copy(dst[s[0]:s[1]], src[k:])
	}
}

// syncAt reports whether a fragment synchronises after inner step t
// (1-based, counted over the whole run) with H inner steps an outer step
// and f fragments, and which fragment of which outer step (0-based).
// Fragment p syncs after step (p+1)·h/f of each outer step; h ≥ f.
func syncAt(t, h, f int) (outer, frag int, ok bool) {
	if t <= 0 {
		return 0, 0, false
	}
	outer, within := (t-1)/h, (t-1)%h+1
	for p := range f {
		if (p+1)*h/f == within {
			return outer, p, true
		}
	}
	return 0, 0, false
}

// fragmentRound is the all-reduce round of fragment frag in outer step
// outer with f fragments: 1, 2, … in the order of synchronisation.
func fragmentRound(outer, frag, f int) uint64 {
	return uint64(outer)*uint64(f) + uint64(frag) + 1
}

// fragmentOf inverts fragmentRound.
func fragmentOf(round uint64, f int) (outer, frag int) {
	return int((round - 1) / uint64(f)), int((round - 1) % uint64(f))
}

// A fragment's all-reduce that fails because its members did not agree
// on the group, or too few were left, is tried again fragmentRetries
// times, at cfg.FragmentRetry intervals from the first try's start, each
// with the member list of then. After a peer leaves, each survivor
// forgets it on its own clock (gossip keeps a disconnected peer for
// 0.5 s), so for a moment their lists differ and the round fails on all
// of them, some at once (excluded as the odd one out) and some after
// waiting out the stall timeouts; retrying on a schedule counted from
// the round's start, not from each one's failure, makes them meet again.
const fragmentRetries = 2

// retryFragment reports whether a fragment's all-reduce that ended with
// err may succeed with a fresh member list.
func retryFragment(err error) bool {
	return errors.Is(err, aggregate.ErrTooFewPeers) || errors.Is(err, aggregate.ErrRoundFailed) || errors.Is(err, aggregate.ErrExcluded)
}

// errLeftBehind says the others completed a fragment's outer step
// without this peer: an all-reduce of it would find nobody.
var errLeftBehind = errors.New("the others have completed this outer step")

// leftBehind returns the peers of group, self aside, whose statuses say
// they completed outer step outer (0-based) of a run of rounds outer
// steps, and so every fragment of it: they completed the next one too (a
// fragment's result is merged within the next outer step), or outer was
// the last one. Statuses lag and never lead, so they did so without this
// peer if it has not yet completed the fragment (overtaken).
func leftBehind(self peerid.ID, outer, rounds uint64, group []peerid.ID, statuses map[peerid.ID]Status) []peerid.ID {
	return overtaken(self, min(outer+2, rounds), group, liveVersions(statuses))
}

// fragSync is one fragment's synchronisation in flight.
type fragSync struct {
	outer, frag int
	due         int // inner step after which its result is merged
	done        chan fragResult
}

type fragResult struct {
	used []peerid.ID
	err  error
}

// streamingFragment holds one fragment's buffers and outer optimiser.
type streamingFragment struct {
	spans      [][2]int
	send, avg  []float32 // the outer gradient and its mean
	global     []float32 // θ_global of the fragment, packed
	anchor     []float32 // θ_local at the launch (async-diloco), packed
	server     *NesterovServer
	syncs, bad int
}

// Streaming runs Streaming DiLoCo for one peer (cfg.Strategy
// "streaming-diloco"; Federated calls it): cfg.Rounds outer steps of
// cfg.LocalSteps inner steps, with cfg.Fragments fragments, mixing
// cfg.Alpha and overlap cfg.Overlap. Every live member takes part in every
// synchronisation (cfg.Fraction is not used) from the outer step it
// declared it joins (Status.JoinAt, one-based as federated rounds are):
// a peer that starts while the others run fetches their state for that
// outer step (streamJoin), and until then no group takes it in. A
// synchronisation that fails here (too few peers, a timeout, left out as
// too late), also when tried again with fresh member lists
// (fragmentRetries), leaves the fragment as it was; after the outer
// step's last fragment the peer takes the others' state of that step, or
// of a later one they have reached (catchUp), since they may have
// completed the fragment without it (RoundInfo.Synced says so). After
// each outer step's last fragment is merged the peer publishes its state,
// [θ_global | each fragment's outer momentum], which RoundInfo.State
// carries and cfg.Resume takes back. onRound, if not nil, is called after
// every outer step with the global model in the worker's model (which it
// may evaluate; training resumes from the local model afterwards);
// returning true stops the peer.
func Streaming(ctx context.Context, w *Worker, net Net, cfg FedConfig, rec Recorder, onRound func(RoundInfo) bool) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	params := w.Model.Params
	n := len(params)
	global := make([]float32, n)
	copy(global, params)
	h, f := cfg.LocalSteps, cfg.Fragments
	delayed := cfg.Strategy == "async-diloco"
	frags := make([]*streamingFragment, f)
	for p, spans := range fragmentSpans(w.Model.Views(), f) {
		k := spansLen(spans)
		frags[p] = &streamingFragment{spans: spans, send: make([]float32, k), avg: make([]float32, k),
			global: make([]float32, k), server: NewNesterovServer(cfg.ServerLR, cfg.ServerMomentum, k)}
		if delayed {
			frags[p].anchor = make([]float32, k)
		}
	}
	self, start := net.Self(), time.Now()
	event := func(kind, detail string) {
		if rec != nil {
			rec.Event(Event{Peer: string(self), At: time.Since(start), Kind: kind, Detail: detail})
		}
	}
	// state is [θ_global | each fragment's outer momentum, in order].
	state := make([]float32, 2*n)
	pack := func() {
		copy(state, global)
		off := n
		for _, fr := range frags {
			off += copy(state[off:], fr.server.State())
		}
	}
	// unpackGlobal takes θ_global and the momenta from state; unpack also
	// restarts the local model from θ_global.
	unpackGlobal := func() {
		copy(global, state[:n])
		off := n
		for _, fr := range frags {
			off += copy(fr.server.State(), state[off:])
		}
	}
	unpack := func() {
		unpackGlobal()
		copy(params, global)
	}
	var version uint64
	if r := cfg.Resume; r != nil {
		if len(r.State) != len(state) {
			return fmt.Errorf("%w: a %s checkpoint of %d values, this model's state has %d", ErrCheckpoint, cfg.Strategy, len(r.State), len(state))
		}
		copy(state, r.State)
		unpack()
		version = r.Version
	}
	completed := false
	outerDone := int(version)
	defer func() {
		if !completed {
			announceStop(ctx, func(ctx context.Context) { net.SetStatus(ctx, Status{Version: uint64(outerDone), Done: true}) })
		}
	}()
	pack()
	joinAt, err := streamJoin(ctx, net, cfg, version, state, event)
	if err != nil {
		return err
	}
	if joinAt-1 != version {
		unpack()
		version = joinAt - 1
		outerDone = int(version)
	}
	if version >= uint64(cfg.Rounds) {
		copy(params, global) // nothing left to do: the final state
		completed = true
		return nil
	}

	seen := map[peerid.ID]bool{} // every member seen: the reference for a majority
	// pending lists the fragments whose all-reduce runs, in launch order,
	// which is the order of their due steps. τ < H keeps a fragment from
	// being in flight twice.
	var pending []*fragSync
	var lastUsed []peerid.ID
	// missed lists, by outer step, the fragments whose synchronisation
	// failed here; synced says the state of the outer step reported next
	// was taken from the others.
	missed := map[int][]int{}
	synced := false
	// ahead is, when not 0, the version of a state fetched into state
	// that is outer steps past this peer's: it jumps to it (jumpAhead).
	var ahead uint64
	// mix merges fragment fr's global values into the local ones:
	// θ_local ← α·θ_local + (1−α)·θ_global, or for async-diloco
	// θ_local ← θ_global + (θ_local − θ_local at the launch).
	mix := func(fr *streamingFragment) {
		j := 0
		for _, sp := range fr.spans {
			l, g := params[sp[0]:sp[1]], global[sp[0]:sp[1]]
			if delayed {
				for i := range l {
					l[i] = g[i] + (l[i] - fr.anchor[j+i])
				}
			} else {
				a := cfg.Alpha
				for i := range l {
					l[i] = a*l[i] + (1-a)*g[i]
				}
			}
			j += len(l)
		}
	}
	// catchUp runs after outer step o's last fragment if a fragment of o
	// failed here: the others may have completed it without this peer
	// (it came too late, it was excluded), and its global model would then
	// differ from theirs in every later outer step. It takes their state
	// of o, waiting up to cfg.FragmentRetry (or a quarter of the round
	// timeout) for one; a state of a later outer step is left in state for
	// the loop to jump to. The failed fragments' local values are merged
	// with the others' global ones as a synchronisation would have, the
	// others shift with their global values; fragments in flight take the
	// new global values as their base.
	catchUp := func(o int) error {
		wait := cfg.FragmentRetry
		if wait <= 0 {
			wait = cfg.RoundTimeout / 4
		}
		// fetchState leaves state as it was unless it succeeds.
		v, err := fetchState(ctx, net, othersOf(self, net.Members()), uint64(o+1), state, wait)
		if err != nil {
			if e := ctxtime.Ended(ctx); e != nil {
				return e
			}
			event("catch-up-failed", fmt.Sprintf("outer step %d: the others' state: %v", o+1, err))
			return nil
		}
		synced, lastUsed = true, nil
		if v > uint64(o+1) {
			event("catch-up", fmt.Sprintf("outer step %d: the others are at %d; jumping there", o+1, v))
			ahead = v
			return nil
		}
		event("catch-up", fmt.Sprintf("outer step %d: took the others' state", v))
		for q, fr := range frags {
			if slices.Contains(missed[o], q) {
				continue
			}
			for _, sp := range fr.spans {
				l, g, gn := params[sp[0]:sp[1]], global[sp[0]:sp[1]], state[sp[0]:sp[1]]
				for i := range l {
					l[i] += gn[i] - g[i]
				}
			}
		}
		unpackGlobal()
		for q, fr := range frags {
			if slices.Contains(missed[o], q) {
				// anchor (async-diloco) is still the fragment's launch
				// value: the next launch, which overwrites it, comes after.
				mix(fr)
			}
			gather(fr.global, global, fr.spans)
		}
		return nil
	}
	// mergeOne applies a finished synchronisation: the outer step on the
	// fragment's global parameters, then the mix into the local ones.
	mergeOne := func(s *fragSync, r fragResult) error {
		fr := frags[s.frag]
		if r.err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			fr.bad++
			missed[s.outer] = append(missed[s.outer], s.frag)
			event("sync-failed", fmt.Sprintf("outer step %d fragment %d: %v", s.outer, s.frag, r.err))
			return nil
		}
		fr.syncs++
		lastUsed = r.used
		fr.server.Apply(fr.global, fr.avg)
		scatter(global, fr.global, fr.spans)
		mix(fr)
		return nil
	}
	// merge applies a finished synchronisation (mergeOne). After an outer
	// step's last fragment the peer catches up with the others if it
	// missed a fragment of the step, and publishes its state (for peers
	// that join and for checkpoints).
	merge := func(s *fragSync, r fragResult) error {
		if err := mergeOne(s, r); err != nil {
			return err
		}
		if s.frag != f-1 {
			return nil
		}
		if len(missed[s.outer]) > 0 {
			if err := catchUp(s.outer); err != nil {
				return err
			}
		}
		delete(missed, s.outer)
		if ahead == 0 {
			pack()
			net.Publish(uint64(s.outer+1), state)
		}
		return nil
	}
	// wait merges the oldest pending fragment, blocking until its
	// all-reduce ends (a "wait" span: the communication that overlap did
	// not hide).
	wait := func() error {
		s := pending[0]
		pending = pending[1:]
		end := trace.StartArgs(ctx, trace.Train, "wait", int64(s.due), trace.Args{"outer": s.outer, "fragment": s.frag})
		r := <-s.done
		end()
		return merge(s, r)
	}
	// waitUntil merges the pending fragments while ok says so of the
	// oldest, and no catch-up found the others outer steps ahead.
	waitUntil := func(ok func(*fragSync) bool) error {
		for len(pending) > 0 && ok(pending[0]) && ahead == 0 {
			if err := wait(); err != nil {
				return err
			}
		}
		return nil
	}
	all := func(*fragSync) bool { return true }
	// comm runs the overlapped all-reduces one at a time, in launch
	// order: the runner takes one round at a time, and every peer must
	// take the fragments in the same order (a runner in a later round
	// refuses an earlier round's chunks). They run under commCtx, which a
	// jump ahead cancels.
	commCtx, commCancel := context.WithCancel(ctx)
	defer func() { commCancel() }()
	comm := make(chan func(), f)
	commDone := make(chan struct{})
	go func() {
		defer close(commDone)
		for run := range comm {
			run()
		}
	}()
	defer func() {
		close(comm)
		<-commDone
	}()
	defer func() {
		for _, s := range pending {
			<-s.done // the all-reduce honours ctx; never leave it running
		}
	}()

	weight := float64(w.ShardSize())
	var lossSum float64
	samples := 0
	// jumpAhead takes the state of outer step ahead that catchUp left
	// in state: the fragments in flight are abandoned, and the peer goes
	// on from the global model after that step. It returns the inner step
	// the step was at, and whether the run is over.
	jumpAhead := func() (at int, over bool) {
		commCancel()
		for _, s := range pending {
			<-s.done
		}
		pending = nil
		commCtx, commCancel = context.WithCancel(ctx)
		v := ahead
		ahead = 0
		clear(missed)
		unpack()
		outerDone = int(v)
		net.SetStatus(ctx, Status{Version: v})
		net.Publish(v, state)
		lossSum, samples = 0, 0
		if v < uint64(cfg.Rounds) {
			return int(v) * h, false
		}
		completed, synced = true, false
		if onRound != nil {
			onRound(RoundInfo{Round: v, Global: global, State: state, Synced: true, Elapsed: time.Since(start)})
		}
		return 0, true
	}
	local := make([]float32, len(params))
	total := cfg.Rounds * h
	for t := int(version)*h + 1; t <= total; t++ {
		endCompute := trace.Start(ctx, trace.Train, "compute", int64(t))
		loss, k, err := w.Grad(ctx)
		if err != nil {
			return err
		}
		w.Apply(k)
		endCompute()
		lossSum += loss * float64(k)
		samples += k
		if err := waitUntil(func(s *fragSync) bool { return t >= s.due }); err != nil {
			return err
		}
		if outer, p, ok := syncAt(t, h, f); ok && ahead == 0 {
			fr := frags[p]
			gather(fr.send, params, fr.spans)
			if delayed {
				copy(fr.anchor, fr.send)
			}
			gather(fr.global, global, fr.spans)
			for i, g := range fr.global {
				fr.send[i] -= g
			}
			s := &fragSync{outer: outer, frag: p, due: t + cfg.Overlap, done: make(chan fragResult, 1)}
			round, group := fragmentRound(outer, p, f), admitted(self, joinAt, uint64(outer)+1, net.Members(), net.Statuses())
			for _, m := range group {
				seen[m] = true
			}
			seenN, cctx := len(seen), commCtx
			run := func() {
				end := trace.StartArgs(ctx, trace.Net, "allreduce", int64(t), trace.Args{"outer": outer, "fragment": p, "floats": len(fr.send)})
				begin := time.Now()
				behind := func(g []peerid.ID) []peerid.ID {
					return leftBehind(self, uint64(outer), uint64(cfg.Rounds), g, net.Statuses())
				}
				// allReduce gives the all-reduce up once peers of g have
				// been seen past the outer step for overtakeGrace: they
				// answer its probes but will never send this round's data.
				allReduce := func(g []peerid.ID) ([]peerid.ID, error) {
					if len(behind(g)) > 0 {
						return nil, errLeftBehind
					}
					var watch overtakeWatch
					wctx, stop := watchCtx(cctx, alignPoll, func(now time.Time) error {
						if watch.look(now, behind(g), overtakeGrace) {
							return errLeftBehind
						}
						return nil
					})
					used, err := net.AllReduce(wctx, round, g, fr.avg, fr.send, weight)
					if err != nil && errors.Is(context.Cause(wctx), errLeftBehind) {
						err = fmt.Errorf("%w (%w)", errLeftBehind, err)
					}
					stop()
					return used, err
				}
				used, err := allReduce(group)
				for try := 1; try <= fragmentRetries && cfg.FragmentRetry > 0 && retryFragment(err) && cctx.Err() == nil; try++ {
					if len(behind(group)) > 0 {
						err = fmt.Errorf("%w (%w)", errLeftBehind, err)
						break
					}
					if ctxtime.Sleep(cctx, time.Until(begin.Add(time.Duration(try)*cfg.FragmentRetry))) != nil {
						break
					}
					g := admitted(self, joinAt, uint64(outer)+1, net.Members(), net.Statuses())
					if 2*len(g) <= seenN {
						break
					}
					used, err = allReduce(g)
				}
				end()
				s.done <- fragResult{used, err}
			}
			if 2*len(group) <= len(seen) {
				// Cut off from most of the peers ever seen: syncing with
				// the few left would fork the global model.
				fr.bad++
				event("minority", fmt.Sprintf("outer step %d fragment %d: %d of %d peers seen; not synchronised", outer, p, len(group), len(seen)))
			} else if cfg.Overlap == 0 {
				run()
				if err := merge(s, <-s.done); err != nil {
					return err
				}
			} else {
				pending = append(pending, s)
				comm <- run
			}
		}
		if ahead > 0 {
			// A catch-up found the others outer steps ahead.
			at, over := jumpAhead()
			if over {
				return nil
			}
			t = at
			continue
		}
		if t%h != 0 {
			continue
		}
		// The end of outer step t/h.
		if t == total {
			if err := waitUntil(all); err != nil {
				return err
			}
			if ahead > 0 {
				jumpAhead() // to the others' final state
				return nil
			}
		}
		outerDone = t / h
		net.SetStatus(ctx, Status{Version: uint64(outerDone)})
		info := RoundInfo{Round: uint64(outerDone), Participants: lastUsed, Loss: lossSum / float64(max(samples, 1)),
			Global: global, State: state, Synced: synced, Elapsed: time.Since(start)}
		synced = false
		pack()
		if rec != nil {
			rec.Snapshot(string(self), info.Elapsed, outerDone, global)
			rec.Event(Event{Peer: string(self), At: info.Elapsed, Kind: "round", Loss: info.Loss, Weight: float64(len(lastUsed))})
		}
		lossSum, samples = 0, 0
		if t == total {
			copy(params, global) // the result is the global model
			completed = true
			if onRound != nil {
				onRound(info)
			}
			return nil
		}
		if onRound != nil {
			copy(local, params)
			copy(params, global)
			stop := onRound(info)
			copy(params, local)
			if stop {
				return nil
			}
		}
	}
	completed = true
	return nil
}

// streamJoin chooses the outer step (one-based, joinRound) a peer at
// version starts with, declares it in its status, and returns it. At a
// fresh start, or with nobody running ahead, that is version+1, from the
// peer's own state; founding peers then give the others still starting
// up cfg.CatchUp to declare theirs, so that the first groups hold them
// all. Otherwise the others run ahead: the peer joins joinLead outer
// steps past the newest version it sees and fetches their state of the
// step before into state (waiting for it up to cfg.RoundTimeout); no
// group takes it in before that step, so the others never wait for it.
// It returns the step after the state it fetched, which is later than
// declared if it was slower than they.
func streamJoin(ctx context.Context, net Net, cfg FedConfig, version uint64, state []float32, event func(kind, detail string)) (uint64, error) {
	st := net.Statuses()
	j := joinRound(version, st)
	if err := declare(ctx, net, Status{Version: version, JoinAt: j}); err != nil {
		return 0, err
	}
	if j == version+1 {
		deadline := time.Now().Add(cfg.CatchUp)
		for anyPending(net.Statuses()) && time.Now().Before(deadline) {
			if err := ctxtime.Sleep(ctx, 20*time.Millisecond); err != nil {
				return 0, err
			}
		}
		return j, nil
	}
	var from []peerid.ID
	for p, s := range st {
		if !s.Done && s.JoinAt != JoinPending {
			from = append(from, p)
		}
	}
	slices.Sort(from)
	event("join", fmt.Sprintf("outer step %d (others at %d): fetching their state from %v", j, j-joinLead, from))
	v, err := fetchState(ctx, net, from, j-1, state, cfg.RoundTimeout)
	if err != nil {
		if e := ctxtime.Ended(ctx); e != nil {
			return 0, e
		}
		return 0, fmt.Errorf("%w: streaming: the state of outer step %d from %v within %v: %v", ErrNoState, j-1, from, cfg.RoundTimeout, err)
	}
	if v+1 != j {
		event("join-late", fmt.Sprintf("declared outer step %d, got the state of %d", j, v))
		if err := declare(ctx, net, Status{Version: v, JoinAt: v + 1}); err != nil {
			return 0, err
		}
	}
	event("joined", fmt.Sprintf("state of outer step %d", v))
	return v + 1, nil
}

// declare sends st (which names a JoinAt, so it goes out at once).
func declare(ctx context.Context, net Net, st Status) error {
	if err := net.SetStatus(ctx, st); err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return nil
}
