package train

import (
	"context"
	"errors"
	"fmt"
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
// and its result is merged (the last two lines) after them.
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
// synchronisation (cfg.Fraction is not used). A synchronisation that fails
// (too few peers, a timeout), also when tried again with fresh member
// lists (fragmentRetries), leaves the fragment as it was and the next
// outer step synchronises it again. onRound, if not nil, is called after
// every outer step with the global model in the worker's model (which it
// may evaluate; training resumes from the local model afterwards);
// returning true stops the peer.
func Streaming(ctx context.Context, w *Worker, net Net, cfg FedConfig, rec Recorder, onRound func(RoundInfo) bool) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if cfg.Resume != nil {
		return fmt.Errorf("%w: streaming-diloco does not resume from a checkpoint yet", ErrStrategy)
	}
	params := w.Model.Params
	global := make([]float32, len(params))
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
	completed := false
	outerDone := 0
	defer func() {
		if !completed {
			announceStop(ctx, func(ctx context.Context) { net.SetStatus(ctx, Status{Version: uint64(outerDone), Done: true}) })
		}
	}()
	net.SetStatus(ctx, Status{})

	seen := map[peerid.ID]bool{} // every member seen: the reference for a majority
	var pending *fragSync
	var lastUsed []peerid.ID
	// merge applies a finished synchronisation: the outer step on the
	// fragment's global parameters, then the mix into the local ones.
	merge := func(s *fragSync, r fragResult) error {
		fr := frags[s.frag]
		if r.err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			fr.bad++
			event("sync-failed", fmt.Sprintf("outer step %d fragment %d: %v", s.outer, s.frag, r.err))
			return nil
		}
		fr.syncs++
		lastUsed = r.used
		fr.server.Apply(fr.global, fr.avg)
		scatter(global, fr.global, fr.spans)
		if delayed {
			j := 0
			for _, sp := range fr.spans {
				l, g := params[sp[0]:sp[1]], global[sp[0]:sp[1]]
				for i := range l {
					l[i] = g[i] + (l[i] - fr.anchor[j])
					j++
				}
			}
			return nil
		}
		a := cfg.Alpha
		for _, sp := range fr.spans {
			l, g := params[sp[0]:sp[1]], global[sp[0]:sp[1]]
			for i := range l {
				l[i] = a*l[i] + (1-a)*g[i]
			}
		}
		return nil
	}
	wait := func() error {
		if pending == nil {
			return nil
		}
		s := pending
		pending = nil
		return merge(s, <-s.done)
	}
	defer func() {
		if pending != nil {
			<-pending.done // the all-reduce honours ctx; never leave it running
		}
	}()

	weight := float64(w.ShardSize())
	var lossSum float64
	samples := 0
	local := make([]float32, len(params))
	total := cfg.Rounds * h
	for t := 1; t <= total; t++ {
		endCompute := trace.Start(ctx, trace.Train, "compute", int64(t))
		loss, k, err := w.Grad(ctx)
		if err != nil {
			return err
		}
		w.Apply(k)
		endCompute()
		lossSum += loss * float64(k)
		samples += k
		if pending != nil && t >= pending.due {
			if err := wait(); err != nil {
				return err
			}
		}
		if outer, p, ok := syncAt(t, h, f); ok {
			if err := wait(); err != nil { // never two in flight
				return err
			}
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
			round, group := fragmentRound(outer, p, f), net.Members()
			for _, m := range group {
				seen[m] = true
			}
			seenN := len(seen)
			run := func() {
				end := trace.StartArgs(ctx, trace.Net, "allreduce", int64(t), trace.Args{"outer": outer, "fragment": p, "floats": len(fr.send)})
				begin := time.Now()
				used, err := net.AllReduce(ctx, round, group, fr.avg, fr.send, weight)
				for try := 1; try <= fragmentRetries && cfg.FragmentRetry > 0 && retryFragment(err) && ctx.Err() == nil; try++ {
					if ctxtime.Sleep(ctx, time.Until(begin.Add(time.Duration(try)*cfg.FragmentRetry))) != nil {
						break
					}
					g := net.Members()
					if 2*len(g) <= seenN {
						break
					}
					used, err = net.AllReduce(ctx, round, g, fr.avg, fr.send, weight)
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
				pending = s
				go run()
			}
		}
		if t%h != 0 {
			continue
		}
		// The end of outer step t/h.
		if t == total {
			if err := wait(); err != nil {
				return err
			}
		}
		outerDone = t / h
		net.SetStatus(ctx, Status{Version: uint64(outerDone)})
		info := RoundInfo{Round: uint64(outerDone), Participants: lastUsed, Loss: lossSum / float64(max(samples, 1)),
			Global: global, State: global, Elapsed: time.Since(start)}
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
