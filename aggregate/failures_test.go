package aggregate_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/starling-ml/starling/aggregate"
	"github.com/starling-ml/starling/aggregate/aggtest"
	"github.com/starling-ml/starling/aggregate/rule"
	"github.com/starling-ml/starling/peerid"
)

func synctestRun(t *testing.T, f func(t *testing.T)) { synctest.Test(t, f) }

const stall = time.Second // StallTimeout in the failure tests (virtual time)

// failCase is one failure injected into one round.
type failCase struct {
	name   string
	algo   aggregate.Algorithm
	rule   rule.Rule
	n, d   int
	victim int // the victim's rank in the round's group
	// hook builds the failure from the victim's id.
	hook func(v peerid.ID) aggtest.Hook
	// setup may change the victim's inputs or runner instead.
	setup func(s *swarm, victim int, srcs [][]float32, g *aggregate.Group)
	want  error // what the survivors' Result.Excluded says of the victim
	// kept: the victim died after doing its part; survivors commit with its
	// contribution and exclude nobody.
	kept bool
	// victimErr, when set, is what the victim's own AllReduce must return.
	victimErr error
}

func failCases() []failCase {
	B, T, R := aggregate.Butterfly, aggregate.Tree, aggregate.Ring
	krum := rule.Krum{F: 1, M: 2}
	at := func(s aggregate.Step, nth int, act aggtest.Action) func(peerid.ID) aggtest.Hook {
		return func(v peerid.ID) aggtest.Hook { return aggtest.At(v, s, nth, act) }
	}
	corrupt := func(s aggregate.Step, chunk uint32, val float32) func(peerid.ID) aggtest.Hook {
		return func(v peerid.ID) aggtest.Hook {
			return aggtest.Corrupt(v, s, chunk, func(x []float32) { x[len(x)/2] = val })
		}
	}
	nan := float32(math.NaN())
	K, S := aggtest.Kill, aggtest.Stall
	// Butterfly, n=5, d=1000, chunks of 64: shards of 200 values, 4 chunks;
	// a peer sends 4×(1+4) = 20 scatter chunks and 4×4 = 16 gather chunks.
	// Tree, n=7: 0→{1,2}, 1→{3,4}, 2→{5,6}; 16 chunks of the vector.
	// Ring, n=5: segments of 200 values, 4 chunks; a peer sends 32 ring
	// chunks to its right neighbour, 0–3 its own segment, 4–15 partial
	// sums, 16–31 final values.
	return []failCase{
		{name: "butterfly/kill/before-sending", algo: B, n: 5, victim: 2, hook: at(aggregate.StepScatter, 1, K), want: aggregate.ErrStall},
		{name: "butterfly/kill/mid-send", algo: B, n: 5, victim: 0, hook: at(aggregate.StepScatter, 10, K), want: aggregate.ErrStall},
		{name: "butterfly/kill/while-reducing", algo: B, n: 5, victim: 4, hook: at(aggregate.StepGather, 1, K), want: aggregate.ErrStall},
		{name: "butterfly/kill/mid-gather", algo: B, n: 5, victim: 1, hook: at(aggregate.StepGather, 7, K), want: aggregate.ErrStall},
		{name: "butterfly/kill/voting", algo: B, n: 5, victim: 3, hook: at(aggregate.StepVote, 2, K), kept: true},
		{name: "butterfly/stall/before-sending", algo: B, n: 5, victim: 2, hook: at(aggregate.StepScatter, 1, S), want: aggregate.ErrStall},
		{name: "butterfly/stall/mid-send", algo: B, n: 5, victim: 0, hook: at(aggregate.StepScatter, 10, S), want: aggregate.ErrStall},
		{name: "butterfly/stall/while-reducing", algo: B, n: 5, victim: 4, hook: at(aggregate.StepGather, 1, S), want: aggregate.ErrStall},
		{name: "butterfly/stall/mid-gather", algo: B, n: 5, victim: 1, hook: at(aggregate.StepGather, 7, S), want: aggregate.ErrStall},
		{name: "krum/kill/stats", algo: B, rule: krum, n: 6, victim: 1, hook: at(aggregate.StepStats, 1, K), want: aggregate.ErrStall},
		{name: "krum/stall/stats", algo: B, rule: krum, n: 6, victim: 5, hook: at(aggregate.StepStats, 3, S), want: aggregate.ErrStall},
		{name: "krum/kill/gather", algo: B, rule: krum, n: 6, victim: 0, hook: at(aggregate.StepGather, 2, K), want: aggregate.ErrStall},

		{name: "tree/kill/leaf-before-sending", algo: T, n: 7, victim: 5, hook: at(aggregate.StepUp, 1, K), want: aggregate.ErrStall},
		{name: "tree/kill/inner-before-sending", algo: T, n: 7, victim: 1, hook: at(aggregate.StepUp, 1, K), want: aggregate.ErrStall},
		{name: "tree/kill/inner-while-reducing", algo: T, n: 7, victim: 2, hook: at(aggregate.StepUp, 4, K), want: aggregate.ErrStall},
		{name: "tree/kill/inner-mid-broadcast", algo: T, n: 7, victim: 1, hook: at(aggregate.StepDown, 9, K), want: aggregate.ErrStall},
		{name: "tree/kill/root-mid-broadcast", algo: T, n: 7, victim: 0, hook: at(aggregate.StepDown, 5, K), want: aggregate.ErrStall},
		{name: "tree/stall/leaf-mid-send", algo: T, n: 7, victim: 6, hook: at(aggregate.StepUp, 6, S), want: aggregate.ErrStall},
		{name: "tree/stall/inner-while-reducing", algo: T, n: 7, victim: 2, hook: at(aggregate.StepUp, 3, S), want: aggregate.ErrStall},
		{name: "tree/stall/root-before-broadcast", algo: T, n: 7, victim: 0, hook: at(aggregate.StepDown, 1, S), want: aggregate.ErrStall},
		// As above, and the victim's left neighbour hears of the failure
		// late: it times out on its own left, which was stopped moments
		// before its own wait ran out, but starved.
		{name: "ring/stall/late-vote", algo: R, n: 5, victim: 2, hook: at(aggregate.StepRing, 7, S), want: aggregate.ErrStall,
			setup: func(s *swarm, v int, _ [][]float32, g *aggregate.Group) {
				rank := g.Rank(s.ids[v])
				right := slices.Index(s.ids, g.Member((rank+1)%g.Size()))
				left := slices.Index(s.ids, g.Member((rank+g.Size()-1)%g.Size()))
				aggregate.DelayTimers(s.runners[right], stall/2)
				s.runners[left], _ = aggregate.NewRunner(s.ids[left], lateVotes{s.net.Join(s.ids[left]), stall / 10}, s.runners[left].Config())
			}},
		{name: "tree/stall/late-timer", algo: T, n: 7, victim: 1, hook: at(aggregate.StepUp, 3, S), want: aggregate.ErrStall,
			setup: func(s *swarm, v int, _ [][]float32, g *aggregate.Group) {
				aggregate.DelayTimers(s.runners[slices.Index(s.ids, g.Member(0))], stall/2)
			}},
		{name: "butterfly/stall/late-timer", algo: B, n: 5, victim: 1, hook: at(aggregate.StepGather, 2, S), want: aggregate.ErrStall,
			setup: func(s *swarm, v int, _ [][]float32, g *aggregate.Group) {
				aggregate.DelayTimers(s.runners[slices.Index(s.ids, g.Member(2))], stall/2)
			}},
		{name: "tree/kill/voting", algo: T, n: 7, victim: 4, hook: at(aggregate.StepVote, 1, K), kept: true},

		{name: "ring/kill/before-sending", algo: R, n: 5, victim: 2, hook: at(aggregate.StepRing, 1, K), want: aggregate.ErrStall},
		{name: "ring/kill/mid-reduce", algo: R, n: 5, victim: 0, hook: at(aggregate.StepRing, 10, K), want: aggregate.ErrStall},
		{name: "ring/kill/owner-done", algo: R, n: 5, victim: 4, hook: at(aggregate.StepRing, 17, K), want: aggregate.ErrStall},
		{name: "ring/kill/mid-gather", algo: R, n: 5, victim: 1, hook: at(aggregate.StepRing, 27, K), want: aggregate.ErrStall},
		{name: "ring/kill/voting", algo: R, n: 5, victim: 3, hook: at(aggregate.StepVote, 2, K), kept: true},
		{name: "ring/stall/before-sending", algo: R, n: 5, victim: 3, hook: at(aggregate.StepRing, 1, S), want: aggregate.ErrStall},
		{name: "ring/stall/mid-reduce", algo: R, n: 5, victim: 1, hook: at(aggregate.StepRing, 7, S), want: aggregate.ErrStall},
		{name: "ring/stall/mid-gather", algo: R, n: 5, victim: 2, hook: at(aggregate.StepRing, 22, S), want: aggregate.ErrStall},
		{name: "ring/stall/header", algo: R, n: 5, victim: 0, hook: at(aggregate.StepScatter, 3, S), want: aggregate.ErrStall},
		// The victim's right neighbour starves first, but its timers run
		// late (a busy machine): the next rank times out first and blames it.
		{name: "ring/stall/late-timer", algo: R, n: 5, victim: 2, hook: at(aggregate.StepRing, 7, S), want: aggregate.ErrStall,
			setup: func(s *swarm, v int, _ [][]float32, g *aggregate.Group) {
				right := g.Member((g.Rank(s.ids[v]) + 1) % g.Size())
				aggregate.DelayTimers(s.runners[slices.Index(s.ids, right)], stall/2)
			}},

		{name: "butterfly/bad/NaN", algo: B, n: 5, victim: 3, hook: corrupt(aggregate.StepScatter, 2, nan), want: aggregate.ErrBadValue, victimErr: aggregate.ErrBadValue},
		{name: "butterfly/bad/Inf-gather", algo: B, n: 5, victim: 3, hook: corrupt(aggregate.StepGather, 1, float32(math.Inf(1))), want: aggregate.ErrBadValue, victimErr: aggregate.ErrBadValue},
		{name: "tree/bad/NaN-up", algo: T, n: 7, victim: 3, hook: corrupt(aggregate.StepUp, 3, nan), want: aggregate.ErrBadValue, victimErr: aggregate.ErrBadValue},
		{name: "tree/bad/Inf-down", algo: T, n: 7, victim: 2, hook: corrupt(aggregate.StepDown, 3, float32(math.Inf(-1))), want: aggregate.ErrBadValue, victimErr: aggregate.ErrBadValue},
		{name: "ring/bad/NaN-partial", algo: R, n: 5, victim: 3, hook: corrupt(aggregate.StepRing, 6, nan), want: aggregate.ErrBadValue, victimErr: aggregate.ErrBadValue},
		{name: "ring/bad/Inf-own", algo: R, n: 5, victim: 1, hook: corrupt(aggregate.StepRing, 0, float32(math.Inf(1))), want: aggregate.ErrBadValue, victimErr: aggregate.ErrBadValue},
		{name: "ring/bad/Inf-gather", algo: R, n: 5, victim: 4, hook: corrupt(aggregate.StepRing, 25, float32(math.Inf(-1))), want: aggregate.ErrBadValue, victimErr: aggregate.ErrBadValue},
		{name: "ring/bad/own-NaN", algo: R, n: 5, victim: 0, want: aggregate.ErrBadValue, victimErr: aggregate.ErrBadValue,
			setup: func(_ *swarm, v int, srcs [][]float32, _ *aggregate.Group) { srcs[v][500] = nan }},
		// A NaN in the victim's own segment (rank r's is values 200r to
		// 200r+199) that its right neighbour never sees: the hook
		// overwrites it on the way (value 32 of chunk 0). Only the victim's
		// own check finds it: chunk by chunk as the ring sends it with a
		// sum, in one pass before it scales its segment with a mean.
		{name: "ring/bad/own-NaN-hidden", algo: R, rule: rule.Sum{}, n: 5, victim: 1, hook: corrupt(aggregate.StepRing, 0, 1), want: aggregate.ErrBadValue, victimErr: aggregate.ErrBadValue,
			setup: func(_ *swarm, v int, srcs [][]float32, _ *aggregate.Group) { srcs[v][200+32] = nan }},
		{name: "ring/bad/own-NaN-hidden-mean", algo: R, n: 5, victim: 0, hook: corrupt(aggregate.StepRing, 0, 1), want: aggregate.ErrBadValue, victimErr: aggregate.ErrBadValue,
			setup: func(_ *swarm, v int, srcs [][]float32, _ *aggregate.Group) { srcs[v][32] = nan }},
		// Outside its own segment a rank's input is checked where the ring
		// adds it to a partial sum (attempt.ringChecksOwn).
		{name: "ring/bad/own-NaN-reduced", algo: R, n: 5, victim: 2, want: aggregate.ErrBadValue, victimErr: aggregate.ErrBadValue,
			setup: func(_ *swarm, v int, srcs [][]float32, _ *aggregate.Group) { srcs[v][len(srcs[v])-1] = nan }},
		{name: "ring/bad/own-Inf-reduced", algo: R, n: 5, victim: 3, want: aggregate.ErrBadValue, victimErr: aggregate.ErrBadValue,
			setup: func(_ *swarm, v int, srcs [][]float32, _ *aggregate.Group) { srcs[v][0] = float32(math.Inf(1)) }},
		{name: "ring/bad/length", algo: R, n: 5, victim: 2, want: aggregate.ErrBadLength, victimErr: aggregate.ErrBadLength,
			setup: func(_ *swarm, v int, srcs [][]float32, _ *aggregate.Group) { srcs[v] = append(srcs[v], 1, 2) }},
		{name: "ring/bad/algorithm", algo: R, n: 5, victim: 3, want: aggregate.ErrConfigMismatch, victimErr: aggregate.ErrConfigMismatch,
			setup: func(s *swarm, v int, _ [][]float32, _ *aggregate.Group) {
				cfg := s.runners[v].Config()
				cfg.Algorithm = aggregate.Butterfly
				s.runners[v], _ = aggregate.NewRunner(s.ids[v], s.net.Join(s.ids[v]), cfg)
			}},
		{name: "ring/bad/group-view", algo: R, n: 5, victim: 4, want: aggregate.ErrGroupMismatch, victimErr: aggregate.ErrGroupMismatch,
			setup: func(s *swarm, v int, _ [][]float32, g *aggregate.Group) {
				*g, _ = aggregate.Form(g.Round(), append(g.Members(), "ghost"))
			}},
		{name: "butterfly/bad/own-NaN", algo: B, n: 5, victim: 2, want: aggregate.ErrBadValue, victimErr: aggregate.ErrBadValue,
			setup: func(_ *swarm, v int, srcs [][]float32, _ *aggregate.Group) { srcs[v][7] = nan }},
		// Krum at its minimum group (2F+3): the liar's exclusion leaves
		// too few for F, and the survivors run the Krum the group allows
		// (rule.Fit) instead of failing every round.
		{name: "krum/bad/own-NaN-at-minimum", algo: B, rule: krum, n: 5, victim: 2, want: aggregate.ErrBadValue, victimErr: aggregate.ErrBadValue,
			setup: func(_ *swarm, v int, srcs [][]float32, _ *aggregate.Group) { srcs[v][7] = nan }},
		{name: "tree/bad/own-Inf", algo: T, n: 7, victim: 1, want: aggregate.ErrBadValue, victimErr: aggregate.ErrBadValue,
			setup: func(_ *swarm, v int, srcs [][]float32, _ *aggregate.Group) { srcs[v][7] = float32(math.Inf(1)) }},
		{name: "butterfly/bad/length", algo: B, n: 5, victim: 1, want: aggregate.ErrBadLength, victimErr: aggregate.ErrBadLength,
			setup: func(_ *swarm, v int, srcs [][]float32, _ *aggregate.Group) { srcs[v] = append(srcs[v], 1) }},
		{name: "tree/bad/length", algo: T, n: 7, victim: 5, want: aggregate.ErrBadLength, victimErr: aggregate.ErrBadLength,
			setup: func(_ *swarm, v int, srcs [][]float32, _ *aggregate.Group) { srcs[v] = srcs[v][:len(srcs[v])-3] }},
		{name: "butterfly/bad/rule", algo: B, n: 5, victim: 4, want: aggregate.ErrConfigMismatch, victimErr: aggregate.ErrConfigMismatch,
			setup: func(s *swarm, v int, _ [][]float32, _ *aggregate.Group) {
				cfg := s.runners[v].Config()
				cfg.Rule = rule.Median{}
				s.runners[v], _ = aggregate.NewRunner(s.ids[v], s.net.Join(s.ids[v]), cfg)
			}},
		{name: "tree/bad/model", algo: T, n: 5, victim: 2, want: aggregate.ErrConfigMismatch, victimErr: aggregate.ErrConfigMismatch,
			setup: func(s *swarm, v int, _ [][]float32, _ *aggregate.Group) {
				cfg := s.runners[v].Config()
				cfg.Model = "charlm-0123456789abcdef"
				s.runners[v], _ = aggregate.NewRunner(s.ids[v], s.net.Join(s.ids[v]), cfg)
			}},
		{name: "butterfly/bad/group-view", algo: B, n: 5, victim: 0, want: aggregate.ErrGroupMismatch, victimErr: aggregate.ErrGroupMismatch,
			setup: func(s *swarm, v int, _ [][]float32, g *aggregate.Group) {
				*g, _ = aggregate.Form(g.Round(), append(g.Members(), "ghost"))
			}},
		{name: "tree/bad/group-view", algo: T, n: 7, victim: 3, want: aggregate.ErrGroupMismatch, victimErr: aggregate.ErrGroupMismatch,
			setup: func(s *swarm, v int, _ [][]float32, g *aggregate.Group) {
				*g, _ = aggregate.Form(g.Round(), g.Members()[:6])
			}},
	}
}

func TestFailures(t *testing.T) {
	for _, tc := range failCases() {
		t.Run(tc.name, func(t *testing.T) {
			synctestRun(t, func(t *testing.T) { runFailCase(t, tc) })
		})
	}
}

func runFailCase(t *testing.T, tc failCase) {
	if tc.rule == nil {
		tc.rule = rule.Mean{}
	}
	if tc.d == 0 {
		tc.d = 1000
	}
	cfg := aggregate.DefaultConfig()
	cfg.Rule, cfg.Algorithm, cfg.ChunkElems, cfg.StallTimeout = tc.rule, tc.algo, 64, stall
	s := newSwarm(t, tc.n, aggtest.Config{Latency: time.Millisecond, Bandwidth: 1e9}, cfg)
	g := s.group(t, 42)
	v := slices.Index(s.ids, g.Member(tc.victim)) // victim's index in s
	vid := s.ids[v]
	srcs, w := randVecs(rand.New(rand.NewPCG(uint64(tc.n), uint64(tc.victim))), tc.n, tc.d)
	clean := make([][]float32, tc.n)
	for i := range srcs {
		clean[i] = slices.Clone(srcs[i])
	}
	victimGroup := g
	if tc.setup != nil {
		tc.setup(s, v, srcs, &victimGroup)
	}
	if tc.hook != nil {
		s.net.SetHook(tc.hook(vid))
	}

	ctx, cancel := context.WithTimeout(t.Context(), 300*stall)
	defer cancel()
	outs := make([]aggtest.Outcome, tc.n)
	done := make(chan int, tc.n)
	start := time.Now()
	for i, r := range s.runners {
		gi := g
		if i == v {
			gi = victimGroup
		}
		outs[i].Out = make([]float32, len(srcs[i]))
		go func() {
			outs[i].Result, outs[i].Err = r.AllReduce(ctx, gi, outs[i].Out, srcs[i], w[i])
			outs[i].Elapsed = time.Since(start)
			done <- i
		}()
	}
	for range tc.n {
		<-done
	}

	var survivors []int
	for i := range tc.n {
		if i != v {
			survivors = append(survivors, i)
		}
	}
	// The worst case: detection after the longest wait, a full vote window,
	// then a clean re-run.
	mult := 2
	if tc.algo == aggregate.Tree {
		mult = 2 + treeHeight(tc.n)
	}
	bound := time.Duration(2*mult+3) * stall
	if strings.Contains(tc.name, "/stall/") && tc.setup == nil {
		// A frozen member answers no probe (aggtest.Endpoint.Probe): it is
		// out after half a stall timeout of silence and a stall timeout's
		// unanswered probe, whatever the wait on it depends on, and its
		// vote is not waited for (kindStall silences it).
		bound = 2 * stall
	}
	var slowest time.Duration
	for _, i := range survivors {
		o := outs[i]
		if o.Err != nil {
			t.Fatalf("survivor %s: %v", s.ids[i], o.Err)
		}
		slowest = max(slowest, o.Elapsed)
		if o.Elapsed > bound {
			t.Errorf("survivor %s took %v, bound %v", s.ids[i], o.Elapsed, bound)
		}
		res := o.Result
		if tc.kept {
			if res.Group.Size() != tc.n || len(res.Excluded) != 0 || res.Attempts != 1 {
				t.Fatalf("survivor %s: %+v, want the full group in one attempt", s.ids[i], res)
			}
			continue
		}
		if res.Group.Rank(vid) >= 0 || res.Group.Size() != tc.n-1 {
			t.Fatalf("survivor %s: final group %v still has the victim or lost others: %v", s.ids[i], res.Group, res.Group.Members())
		}
		if len(res.Excluded) != 1 || res.Excluded[0].Peer != vid || !errors.Is(res.Excluded[0], tc.want) {
			t.Fatalf("survivor %s: Excluded %v, want %s for %v", s.ids[i], res.Excluded, vid, tc.want)
		}
		if res.Attempts != 2 {
			t.Errorf("survivor %s: %d attempts, want 2", s.ids[i], res.Attempts)
		}
	}
	final := outs[survivors[0]].Result.Group
	want := expected(t, rule.Fit(tc.rule, final.Size()), final, s.ids, clean, w)
	checkSame(t, outs, survivors, want, tc.algo == aggregate.Butterfly && tc.rule.Local())

	vo := outs[v]
	if vo.Err == nil && !tc.kept {
		t.Fatalf("victim %s succeeded: %+v", vid, vo.Result)
	}
	if tc.victimErr != nil {
		var pe *aggregate.PeerError
		if !errors.Is(vo.Err, aggregate.ErrExcluded) || !errors.Is(vo.Err, tc.victimErr) || !errors.As(vo.Err, &pe) || pe.Peer != vid {
			t.Errorf("victim: %v, want ErrExcluded for %s with %v", vo.Err, vid, tc.victimErr)
		}
	}
	t.Logf("survivors done within %v (bound %v); victim: %v after %v", slowest, bound, vo.Err, vo.Elapsed)
}

// lateVotes hands its member every vote late, so that its data phase
// stops after the others'.
type lateVotes struct {
	*aggtest.Endpoint
	delay time.Duration
}

func (l lateVotes) Recv(ctx context.Context, from peerid.ID, tag aggregate.Tag, dst []float32) error {
	err := l.Endpoint.Recv(ctx, from, tag, dst)
	if err == nil && tag.Step == aggregate.StepVote {
		select {
		case <-time.After(l.delay):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return err
}

func treeHeight(n int) int {
	h := 0
	for c := 1; c < n; c = 2*c + 1 {
		h++
	}
	return h
}

// TestOutsiderRejected: a peer outside the group pushes chunks into the
// round; members refuse them (its Send fails with ErrNotMember naming it),
// report it in Result.Rejected, and complete the round untouched. A rogue
// that runs the whole protocol with a group of its own making fails.
func TestOutsiderRejected(t *testing.T) {
	for _, algo := range []aggregate.Algorithm{aggregate.Tree, aggregate.Butterfly} {
		t.Run(algo.String(), func(t *testing.T) {
			synctestRun(t, func(t *testing.T) {
				cfg := aggregate.DefaultConfig()
				cfg.Algorithm, cfg.StallTimeout = algo, stall
				s := newSwarm(t, 4, aggtest.Config{Latency: time.Millisecond}, cfg)
				g := s.group(t, 3)
				rogueEP := s.net.Join("rogue")
				rogue, err := aggregate.NewRunner("rogue", rogueEP, cfg)
				if err != nil {
					t.Fatal(err)
				}
				rg, _ := aggregate.Form(3, append(s.ids, "rogue"))
				srcs, w := randVecs(rand.New(rand.NewPCG(9, 9)), 5, 100)
				rogueErr := make(chan error, 1)
				go func() {
					time.Sleep(time.Millisecond / 2) // members have scoped the round
					for _, id := range s.ids {
						for _, st := range []aggregate.Step{aggregate.StepScatter, aggregate.StepUp} {
							tag := aggregate.Tag{Round: 3, Digest: g.Digest(), Step: st, Chunk: 1}
							err := rogueEP.Send(t.Context(), id, tag, srcs[4])
							var pe *aggregate.PeerError
							if !errors.Is(err, aggregate.ErrNotMember) || !errors.As(err, &pe) || pe.Peer != "rogue" {
								t.Errorf("rogue's Send to %s: %v", id, err)
							}
						}
					}
					_, err := rogue.AllReduce(t.Context(), rg, make([]float32, 100), srcs[4], 1e6)
					rogueErr <- err
				}()
				outs := aggtest.RunRound(t.Context(), s.runners, g, srcs[:4], w[:4])
				checkSame(t, outs, all(4), expected(t, rule.Mean{}, g, s.ids, srcs, w), algo == aggregate.Butterfly)
				for i, o := range outs {
					if o.Result.Attempts != 1 || len(o.Result.Excluded) != 0 {
						t.Errorf("result %+v", o.Result)
					}
					if len(o.Result.Rejected) != 1 || o.Result.Rejected[0].Peer != "rogue" || !errors.Is(o.Result.Rejected[0], aggregate.ErrNotMember) {
						t.Errorf("%s: Rejected %v, want rogue", s.ids[i], o.Result.Rejected)
					}
				}
				if err := <-rogueErr; err == nil {
					t.Error("the rogue peer's round succeeded")
				}
			})
		})
	}
}

func TestTooFewSurvivors(t *testing.T) {
	synctestRun(t, func(t *testing.T) {
		cfg := aggregate.DefaultConfig()
		cfg.Algorithm, cfg.StallTimeout = aggregate.Butterfly, stall
		s := newSwarm(t, 4, aggtest.Config{Latency: time.Millisecond}, cfg)
		g := s.group(t, 1)
		alive := g.Member(0)
		s.net.SetHook(func(from, _ peerid.ID, _ aggregate.Tag, _ []float32) aggtest.Action {
			if from != alive {
				return aggtest.Kill
			}
			return aggtest.Deliver
		})
		srcs, w := randVecs(rand.New(rand.NewPCG(1, 1)), 4, 100)
		outs := aggtest.RunRound(t.Context(), s.runners, g, srcs, w)
		o := outs[slices.Index(s.ids, alive)]
		if !errors.Is(o.Err, aggregate.ErrTooFewPeers) {
			t.Fatalf("lone survivor: %v", o.Err)
		}
		if o.Elapsed > 10*stall {
			t.Errorf("took %v", o.Elapsed)
		}
	})
}

// TestDeadlineNoHang: the caller's deadline is shorter than failure
// detection; every peer returns by it.
func TestDeadlineNoHang(t *testing.T) {
	for _, algo := range []aggregate.Algorithm{aggregate.Tree, aggregate.Butterfly} {
		t.Run(algo.String(), func(t *testing.T) {
			synctestRun(t, func(t *testing.T) {
				cfg := aggregate.DefaultConfig()
				cfg.Algorithm, cfg.StallTimeout = algo, 10*time.Second
				s := newSwarm(t, 5, aggtest.Config{Latency: time.Millisecond}, cfg)
				g := s.group(t, 1)
				s.net.Stall(g.Member(1))
				ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
				defer cancel()
				srcs, w := randVecs(rand.New(rand.NewPCG(1, 1)), 5, 100)
				for i, o := range aggtest.RunRound(ctx, s.runners, g, srcs, w) {
					if !errors.Is(o.Err, context.DeadlineExceeded) || o.Elapsed > 3*time.Second+10*time.Millisecond {
						t.Errorf("peer %d: %v after %v", i, o.Err, o.Elapsed)
					}
				}
			})
		})
	}
}

// TestFailureDuringRerun: one peer dies in attempt 0, another in attempt 1;
// the rest complete in attempt 2.
func TestFailureDuringRerun(t *testing.T) {
	for _, algo := range []aggregate.Algorithm{aggregate.Tree, aggregate.Butterfly} {
		t.Run(algo.String(), func(t *testing.T) {
			synctestRun(t, func(t *testing.T) {
				cfg := aggregate.DefaultConfig()
				cfg.Algorithm, cfg.StallTimeout, cfg.ChunkElems = algo, stall, 32
				s := newSwarm(t, 8, aggtest.Config{Latency: time.Millisecond}, cfg)
				g := s.group(t, 7)
				v1, v2 := g.Member(3), g.Member(1)
				s.net.SetHook(func(from, _ peerid.ID, tag aggregate.Tag, _ []float32) aggtest.Action {
					if (from == v1 && tag.Attempt == 0 && tag.Step != aggregate.StepVote && tag.Chunk == 2) ||
						(from == v2 && tag.Attempt == 1 && tag.Step != aggregate.StepVote) {
						return aggtest.Kill
					}
					return aggtest.Deliver
				})
				srcs, w := randVecs(rand.New(rand.NewPCG(2, 2)), 8, 500)
				outs := aggtest.RunRound(t.Context(), s.runners, g, srcs, w)
				var surv []int
				for i, id := range s.ids {
					if id == v1 || id == v2 {
						continue
					}
					surv = append(surv, i)
					r := outs[i].Result
					if outs[i].Err != nil || r.Attempts != 3 || r.Group.Size() != 6 || len(r.Excluded) != 2 {
						t.Fatalf("%s: %v %+v", id, outs[i].Err, r)
					}
				}
				checkSame(t, outs, surv, expected(t, rule.Mean{}, outs[surv[0]].Result.Group, s.ids, srcs, w), algo == aggregate.Butterfly)
			})
		})
	}
}

func ExampleRunner() {
	net := aggtest.NewNetwork(aggtest.Config{})
	ids := []peerid.ID{"a", "b", "c"}
	var runners []*aggregate.Runner
	for _, id := range ids {
		r, err := aggregate.NewRunner(id, net.Join(id), aggregate.DefaultConfig())
		if err != nil {
			panic(err)
		}
		runners = append(runners, r)
	}
	g, _ := aggregate.Form(1, ids)
	srcs := [][]float32{{1, 2}, {3, 4}, {5, 6}}
	weights := []float64{1, 1, 2} // sample counts
	for i, o := range aggtest.RunRound(context.Background(), runners, g, srcs, weights) {
		fmt.Println(ids[i], o.Out, o.Err)
	}
	// Output:
	// a [3.5 4.5] <nil>
	// b [3.5 4.5] <nil>
	// c [3.5 4.5] <nil>
}

// failRoundForBoth runs round 51 between two peers, one with a NaN: it is
// excluded, and the other is below the quorum.
func failRoundForBoth(t *testing.T, algo aggregate.Algorithm) (*swarm, aggregate.Group, *rand.Rand) {
	cfg := aggregate.DefaultConfig()
	cfg.Algorithm, cfg.ChunkElems, cfg.StallTimeout = algo, 16, stall
	s := newSwarm(t, 2, aggtest.Config{Latency: time.Millisecond}, cfg)
	g := s.group(t, 51)
	rng := rand.New(rand.NewPCG(51, uint64(algo)))
	srcs, w := randVecs(rng, 2, 100)
	srcs[1][3] = float32(math.NaN())
	for i, o := range aggtest.RunRound(t.Context(), s.runners, g, srcs, w) {
		if o.Err == nil {
			t.Fatalf("peer %d: the poisoned round succeeded", i)
		}
	}
	return s, g, rng
}

// TestRetryFailedRound: a round that failed for all (two peers, one with a
// NaN: it is excluded, the other is below the quorum) is called again
// with new inputs, as synchronous training retries a step. The retry must
// use the new inputs only, not chunks of the failed call that were still
// parked, and must not block on them.
func TestRetryFailedRound(t *testing.T) {
	retryCase(t, func(t *testing.T, s *swarm, g aggregate.Group, srcs [][]float32, w []float64) []aggtest.Outcome {
		outs := aggtest.RunRound(t.Context(), s.runners, g, srcs, w)
		for i, o := range outs {
			if o.Err != nil {
				t.Fatalf("peer %d: retry: %v", i, o.Err)
			}
			if o.Result.Group.Size() != 2 || o.Result.Group.Attempt() == 0 {
				t.Fatalf("peer %d: retry ran in %v, want both peers after the failed call's attempts", i, o.Result.Group)
			}
		}
		return outs
	})
}

// retryCase runs, for each linear algorithm, failRoundForBoth and then
// retry with new inputs; the retry's outcomes must be the mean of those.
func retryCase(t *testing.T, retry func(t *testing.T, s *swarm, g aggregate.Group, srcs [][]float32, w []float64) []aggtest.Outcome) {
	for _, algo := range []aggregate.Algorithm{aggregate.Tree, aggregate.Butterfly, aggregate.Ring} {
		t.Run(algo.String(), func(t *testing.T) {
			synctestRun(t, func(t *testing.T) {
				s, g, rng := failRoundForBoth(t, algo)
				srcs, w := randVecs(rng, 2, 100)
				outs := retry(t, s, g, srcs, w)
				checkSame(t, outs, all(2), expected(t, rule.Mean{}, g, s.ids, srcs, w), algo == aggregate.Butterfly)
			})
		})
	}
}

// TestRetryJoinsAMemberAhead: after a round failed for both peers, one
// retries it alone (the other is busy) and fails again; when both retry,
// the one that tried fewer times joins the other's attempt.
func TestRetryJoinsAMemberAhead(t *testing.T) {
	retryCase(t, func(t *testing.T, s *swarm, g aggregate.Group, srcs [][]float32, w []float64) []aggtest.Outcome {
		if _, err := s.runners[0].AllReduce(t.Context(), g, make([]float32, 100), srcs[0], w[0]); err == nil {
			t.Fatal("a retry alone succeeded")
		}
		outs := make([]aggtest.Outcome, 2)
		done := make(chan struct{}, 2)
		for i, r := range s.runners {
			outs[i].Out = make([]float32, 100)
			go func() {
				time.Sleep(time.Duration(i) * 10 * time.Millisecond) // peer 1 comes later
				outs[i].Result, outs[i].Err = r.AllReduce(t.Context(), g, outs[i].Out, srcs[i], w[i])
				done <- struct{}{}
			}()
		}
		<-done
		<-done
		for i, o := range outs {
			if o.Err != nil {
				t.Fatalf("peer %d: %v", i, o.Err)
			}
		}
		if a, b := outs[0].Result.Group, outs[1].Result.Group; a.Digest() != b.Digest() || a.Attempt() != 2 {
			t.Fatalf("retries ran in %v and %v, want both in attempt 2", a, b)
		}
		return outs
	})
}
