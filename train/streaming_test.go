package train_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/starling-ml/starling/aggregate"
	"github.com/starling-ml/starling/aggregate/aggtest"
	"github.com/starling-ml/starling/compression"
	"github.com/starling-ml/starling/data"
	"github.com/starling-ml/starling/peerid"
	"github.com/starling-ml/starling/train"
	"github.com/starling-ml/starling/train/traintest"
)

// streamRun is the outcome of runStreaming: each peer's error, its final
// global model and the participants of each of its outer steps.
type streamRun struct {
	errs    map[peerid.ID]error
	finals  map[peerid.ID][]float32
	parts   map[peerid.ID][][]peerid.ID
	rounds  map[peerid.ID][]uint64      // the outer steps each reported
	synced  map[peerid.ID][]bool        // whether each was taken from others
	elapsed map[peerid.ID]time.Duration // at its last outer step (virtual)
	states  map[peerid.ID][]float32     // RoundInfo.State of its last outer step
	params  map[peerid.ID][]float32     // the worker's parameters at the end
}

// runStreaming runs n peers of Streaming DiLoCo on logistic regression
// over IID shares of 1200 MNIST images, in one process over aggtest with
// the board's membership, in a synctest bubble (stall timeouts in virtual
// time). wrap, if not nil, wraps each peer's Net; it gets the network,
// the board and a cancel of the peer's context, to make peers misbehave.
func runStreaming(t *testing.T, n int, cfg train.FedConfig, acfg aggregate.Config, ncfg aggtest.Config,
	wrap func(id peerid.ID, net train.Net, netw *aggtest.Network, board *traintest.Board, cancel context.CancelFunc) train.Net) streamRun {
	t.Helper()
	tr, _ := mnist(t)
	small := tr.Head(1200)
	shards, _ := data.IID(small.Len(), n, 2)
	out := streamRun{errs: map[peerid.ID]error{}, finals: map[peerid.ID][]float32{}, parts: map[peerid.ID][][]peerid.ID{},
		rounds: map[peerid.ID][]uint64{}, synced: map[peerid.ID][]bool{}, elapsed: map[peerid.ID]time.Duration{}, states: map[peerid.ID][]float32{},
		params: map[peerid.ID][]float32{}}
	synctest.Test(t, func(t *testing.T) {
		netw := aggtest.NewNetwork(ncfg)
		board := traintest.NewBoard()
		var mu sync.Mutex
		var wg sync.WaitGroup
		ids := make([]peerid.ID, n)
		for i := range ids {
			ids[i] = peerid.ID(fmt.Sprintf("peer%02d", i))
			board.Join(ids[i]) // all live before any starts, as after WaitPeers
			// and pending until its strategy runs (swarm.WithJoinPending)
			board.SetStatus(ids[i], train.Status{JoinAt: train.JoinPending})
		}
		for i, id := range ids {
			r, err := aggregate.NewRunner(id, netw.Join(id), acfg)
			if err != nil {
				t.Fatal(err)
			}
			wc := train.DefaultWorkerConfig()
			wc.Model, wc.Optimizer, wc.DataSeed = "logreg", "sgd", uint64(i+1)
			w, err := train.NewWorker(wc, small.Subset(shards[i]))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			var net train.Net = &traintest.Net{ID: id, Runner: r, Board: board}
			if wrap != nil {
				net = wrap(id, net, netw, board, cancel)
			}
			wg.Go(func() {
				defer cancel()
				err := train.Federated(ctx, w, net, cfg, nil, func(ri train.RoundInfo) bool {
					mu.Lock()
					defer mu.Unlock()
					out.parts[id] = append(out.parts[id], slices.Clone(ri.Participants))
					out.finals[id] = slices.Clone(ri.Global)
					out.rounds[id] = append(out.rounds[id], ri.Round)
					out.synced[id] = append(out.synced[id], ri.Synced)
					out.elapsed[id] = ri.Elapsed
					out.states[id] = slices.Clone(ri.State)
					return false
				})
				mu.Lock()
				out.errs[id] = err
				out.params[id] = slices.Clone(w.Model.Params)
				mu.Unlock()
			})
		}
		wg.Wait()
	})
	return out
}

func streamingConfig(t *testing.T, strategy string, rounds int) train.FedConfig {
	t.Helper()
	cfg := train.DefaultFedConfig()
	if err := cfg.ParseStrategy(strategy); err != nil {
		t.Fatal(err)
	}
	cfg.Rounds, cfg.Fraction, cfg.RoundTimeout = rounds, 1, 20*time.Second
	cfg.FragmentRetry = 5 * time.Second // the tests' stall timeout is 2 s
	return cfg
}

// testAccuracy evaluates a logistic-regression model on 2000 test images.
func testAccuracy(t *testing.T, params []float32) float64 {
	t.Helper()
	tr, te := mnist(t)
	wc := train.DefaultWorkerConfig()
	wc.Model = "logreg"
	w, err := train.NewWorker(wc, tr.Head(10))
	if err != nil {
		t.Fatal(err)
	}
	copy(w.Model.Params, params)
	_, acc := w.Evaluate(te.Head(2000))
	return acc
}

// agreed checks that every peer but skip ended without error and with
// the same global model, and returns it.
func agreed(t *testing.T, run streamRun, skip peerid.ID) []float32 {
	t.Helper()
	var ref []float32
	for id, err := range run.errs {
		if id == skip {
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		g := run.finals[id]
		if ref == nil {
			ref = g
		} else if !slices.Equal(ref, g) {
			t.Fatalf("%s ended with another global model (%d values, %d outer steps)", id, len(g), len(run.parts[id]))
		}
	}
	return ref
}

// Streaming DiLoCo learns, and its peers end bit-identical: in fp32, and
// with fp4 outer gradients and a fragment all-reduce that overlaps two
// inner steps, or five (two fragments in flight at once).
func TestStreamingDiLoCoLearnsAndAgrees(t *testing.T) {
	for _, tc := range []struct {
		name, strategy, codec string
	}{
		{"fp32", "streaming-diloco:h=8,fragments=2,alpha=0", ""},
		{"fp4-overlap", "streaming-diloco:h=8,fragments=2,overlap=2", "fp4"},
		// τ above H/F: fragment 1's all-reduce starts while fragment 0's
		// still runs.
		{"fp4-overlap-two-in-flight", "streaming-diloco:h=8,fragments=2,overlap=5", "fp4"},
		{"async-diloco", "async-diloco:h=8", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			acfg := aggregate.DefaultConfig()
			acfg.StallTimeout = 2 * time.Second
			if tc.codec != "" {
				acfg.Compress = compression.MustSpec(tc.codec)
			}
			run := runStreaming(t, 3, streamingConfig(t, tc.strategy, 4), acfg, aggtest.Config{}, nil)
			g := agreed(t, run, "")
			for id, ps := range run.parts {
				if len(ps) != 4 || len(ps[3]) != 3 {
					t.Fatalf("%s: outer steps %d, last with %v", id, len(ps), ps[len(ps)-1])
				}
			}
			if acc := testAccuracy(t, g); acc < 0.75 {
				t.Fatalf("accuracy %.3f after 4 outer steps", acc)
			}
		})
	}
}

// async-diloco alone, with an outer step that takes the mean Δ as it is
// (lr 1, no momentum), is local training: each outer step's update,
// landing one outer step late, replaces the peer's own progress of that
// step, and the progress made meanwhile is kept. Mixing the global model
// in, or restarting from it, would lose H steps at each merge.
func TestAsyncDiLoCoAloneIsLocalTraining(t *testing.T) {
	const h, rounds = 4, 3
	acfg := aggregate.DefaultConfig()
	acfg.StallTimeout = 2 * time.Second
	run := runStreaming(t, 1, streamingConfig(t, fmt.Sprintf("async-diloco:h=%d,lr=1,momentum=0", h), rounds), acfg, aggtest.Config{}, nil)
	got := agreed(t, run, "")

	tr, _ := mnist(t)
	wc := train.DefaultWorkerConfig()
	wc.Model, wc.Optimizer, wc.DataSeed = "logreg", "sgd", 1
	w, err := train.NewWorker(wc, tr.Head(1200))
	if err != nil {
		t.Fatal(err)
	}
	for range h * rounds {
		_, k, err := w.Grad(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		w.Apply(k)
	}
	var worst float64
	for i, x := range w.Model.Params {
		worst = max(worst, math.Abs(float64(got[i]-x)))
	}
	if worst > 1e-5 {
		t.Fatalf("async-diloco alone is %g away from local training", worst)
	}
}

// behindNet sends every fragment from the second outer step on under the
// round of the same fragment one outer step earlier: a peer whose
// fragments are of the wrong (an old) version.
type behindNet struct {
	train.Net
	f int
}

func (b behindNet) AllReduce(ctx context.Context, round uint64, group []peerid.ID, dst, src []float32, weight float64) ([]peerid.ID, error) {
	if round > uint64(b.f) {
		round -= uint64(b.f)
	}
	return b.Net.AllReduce(ctx, round, group, dst, src, weight)
}

// A peer that sends fragments of an older outer step is refused: from the
// second outer step on, the others' syncs hold only each other, and they
// agree; the stale peer's syncs fail and it finishes without hanging.
func TestStreamingRefusesFragmentsOfAnotherOuterStep(t *testing.T) {
	const f = 2
	acfg := aggregate.DefaultConfig()
	acfg.StallTimeout = 2 * time.Second
	stale := peerid.ID("peer02")
	run := runStreaming(t, 3, streamingConfig(t, "streaming-diloco:h=8,fragments=2", 3), acfg, aggtest.Config{},
		func(id peerid.ID, net train.Net, _ *aggtest.Network, _ *traintest.Board, _ context.CancelFunc) train.Net {
			if id == stale {
				return behindNet{net, f}
			}
			return net
		})
	agreed(t, run, stale)
	for id, ps := range run.parts {
		if id == stale {
			continue
		}
		if len(ps) != 3 || !slices.Contains(ps[0], stale) {
			t.Fatalf("%s: outer steps %v; the first should hold the stale peer", id, ps)
		}
		for o, p := range ps[1:] {
			if slices.Contains(p, stale) || len(p) != 2 {
				t.Fatalf("%s: outer step %d mixed in %v", id, o+2, p)
			}
		}
	}
	if err := run.errs[stale]; err != nil {
		t.Fatalf("stale peer: %v", err)
	}
}

// leaveNet is a peer that dies in the middle of a fragment's all-reduce:
// once it has sent its chunks of round at, its node leaves the network
// (with before, as it enters the round, having sent nothing).
type leaveNet struct {
	train.Net
	id     peerid.ID
	at     uint64
	before bool
	netw   *aggtest.Network
	board  *traintest.Board
	cancel context.CancelFunc
}

func (l leaveNet) AllReduce(ctx context.Context, round uint64, group []peerid.ID, dst, src []float32, weight float64) ([]peerid.ID, error) {
	if round != l.at {
		return l.Net.AllReduce(ctx, round, group, dst, src, weight)
	}
	if l.before {
		l.netw.Kill(l.id)
		l.board.Leave(l.id)
		l.cancel()
		return nil, fmt.Errorf("cut off at round %d", round)
	}
	go func() {
		time.Sleep(15 * time.Millisecond) // virtual
		l.netw.Kill(l.id)
		l.board.Leave(l.id)
		l.cancel()
	}()
	_, err := l.Net.AllReduce(ctx, round, group, dst, src, weight)
	if err == nil {
		err = errors.New("left")
	}
	return nil, err
}

// A peer leaving in the middle of a fragment's all-reduce does not hang
// the others: they finish every outer step, agree, and hold only each
// other from that fragment on.
func TestStreamingPeerLeavesMidFragment(t *testing.T) {
	acfg := aggregate.DefaultConfig()
	acfg.StallTimeout = 2 * time.Second
	gone := peerid.ID("peer01")
	// Chunks take 10 ms (virtual) a hop: the peer leaves after its first
	// hop's chunks went out, before the all-reduce's second hop.
	run := runStreaming(t, 4, streamingConfig(t, "streaming-diloco:h=8,fragments=2", 3), acfg, aggtest.Config{Latency: 10 * time.Millisecond},
		func(id peerid.ID, net train.Net, netw *aggtest.Network, board *traintest.Board, cancel context.CancelFunc) train.Net {
			if id == gone {
				return leaveNet{Net: net, id: id, at: 3, netw: netw, board: board, cancel: cancel}
			}
			return net
		})
	agreed(t, run, gone)
	if !errors.Is(run.errs[gone], context.Canceled) {
		t.Fatalf("the peer that left: %v", run.errs[gone])
	}
	for id, ps := range run.parts {
		if id == gone {
			continue
		}
		if len(ps) != 3 || len(ps[0]) != 4 || len(ps[1]) != 3 || len(ps[2]) != 3 {
			t.Fatalf("%s: outer steps %v", id, ps)
		}
	}
}

// startsLate is a peer that starts late: its first look at the statuses
// (where Streaming starts) waits until every other peer has done after
// outer steps.
type startsLate struct {
	train.Net
	board   *traintest.Board
	others  []peerid.ID
	after   uint64
	started *bool
}

func (l startsLate) Statuses() map[peerid.ID]train.Status {
	for !*l.started {
		ready := true
		for _, p := range l.others {
			st, _ := l.board.Status(p)
			ready = ready && st.JoinAt != train.JoinPending && st.Version >= l.after
		}
		if ready {
			*l.started = true
			break
		}
		time.Sleep(10 * time.Millisecond) // virtual
	}
	return l.Net.Statuses()
}

// A peer that starts while the others run is not taken into their groups
// until the outer step it declares, fetches their state for it and from
// then on takes part in every fragment: all four end with the same model,
// and the others never wait for it (no stall timeout in their run).
func TestStreamingPeerJoinsBetweenOuterSteps(t *testing.T) {
	acfg := aggregate.DefaultConfig()
	acfg.StallTimeout = 2 * time.Second
	cfg := streamingConfig(t, "streaming-diloco:h=8,fragments=2,overlap=1", 8)
	late := peerid.ID("peer03")
	run := runStreaming(t, 4, cfg, acfg, aggtest.Config{Latency: 5 * time.Millisecond},
		func(id peerid.ID, net train.Net, netw *aggtest.Network, board *traintest.Board, cancel context.CancelFunc) train.Net {
			if id == late {
				return startsLate{Net: net, board: board, others: []peerid.ID{"peer00", "peer01", "peer02"}, after: 2, started: new(bool)}
			}
			return net
		})
	agreed(t, run, "")
	rs := run.rounds[late]
	if len(rs) == 0 || rs[0] < 4 || rs[len(rs)-1] != 8 {
		t.Fatalf("the late peer reported outer steps %v", rs)
	}
	joined := rs[0] // the first outer step it took part in, one-based
	for id, ps := range run.parts {
		for k, p := range ps {
			r := run.rounds[id][k]
			if want := 3 + btoi(r >= joined); len(p) != want || slices.Contains(p, late) != (r >= joined) {
				t.Fatalf("%s: outer step %d with %v, want %d peers (the late one joined at %d)", id, r, p, want, joined)
			}
		}
		if el := run.elapsed[id]; el > cfg.CatchUp+acfg.StallTimeout {
			t.Fatalf("%s took %v (virtual): it waited for someone", id, el)
		}
	}
}

// Peers resume from a checkpointed state ([global | outer momenta]): they
// go on from its outer step, start from its global model, and agree; a
// state of the wrong length is refused.
func TestStreamingResumes(t *testing.T) {
	acfg := aggregate.DefaultConfig()
	acfg.StallTimeout = 2 * time.Second
	first := runStreaming(t, 2, streamingConfig(t, "streaming-diloco:h=8,fragments=2", 2), acfg, aggtest.Config{}, nil)
	g2 := agreed(t, first, "")
	st := first.states["peer00"]
	if len(st) != 2*len(g2) || !slices.Equal(st[:len(g2)], g2) || !slices.Equal(st, first.states["peer01"]) {
		t.Fatalf("state of %d values, want [global | momenta] of %d, the same on both peers", len(st), 2*len(g2))
	}
	// Resumed at its last outer step, a peer ends at once with the
	// checkpoint's global model.
	cfg := streamingConfig(t, "streaming-diloco:h=8,fragments=2", 2)
	cfg.Resume = &train.FedState{Version: 2, State: st}
	if done := runStreaming(t, 1, cfg, acfg, aggtest.Config{}, nil); done.errs["peer00"] != nil || !slices.Equal(done.params["peer00"], g2) {
		t.Fatalf("resumed at the end: %v, model equal to the checkpoint's: %v", done.errs["peer00"], slices.Equal(done.params["peer00"], g2))
	}
	cfg.Rounds = 4
	second := runStreaming(t, 2, cfg, acfg, aggtest.Config{}, nil)
	g4 := agreed(t, second, "")
	for id, rs := range second.rounds {
		if !slices.Equal(rs, []uint64{3, 4}) {
			t.Fatalf("%s resumed with outer steps %v, want [3 4]", id, rs)
		}
	}
	if a2, a4 := testAccuracy(t, g2), testAccuracy(t, g4); a4 < a2-0.02 {
		t.Fatalf("accuracy %.3f after resuming at %.3f: did not start from the checkpoint", a4, a2)
	}
	cfg.Resume = &train.FedState{Version: 2, State: st[:len(st)-1]}
	bad := runStreaming(t, 1, cfg, acfg, aggtest.Config{}, nil)
	if err := bad.errs["peer00"]; !errors.Is(err, train.ErrCheckpoint) {
		t.Fatalf("a short state: %v", err)
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// splitView is a survivor whose member list, in the first try of round
// at, differs from the others': with remember it still lists the peer
// gone (it has not noticed the departure yet), without it it has
// already forgotten it. Later calls see the board as it is.
type splitView struct {
	train.Net
	at       uint64
	gone     peerid.ID
	remember bool
	tried    *bool
}

func (v splitView) AllReduce(ctx context.Context, round uint64, group []peerid.ID, dst, src []float32, weight float64) ([]peerid.ID, error) {
	if round == v.at && !*v.tried {
		*v.tried = true
		group = slices.DeleteFunc(slices.Clone(group), func(p peerid.ID) bool { return p == v.gone })
		if v.remember {
			group = append(group, v.gone)
			slices.Sort(group)
		}
	}
	return v.Net.AllReduce(ctx, round, group, dst, src, weight)
}

// A peer vanishes as the last fragment's all-reduce begins, and the
// survivors' member lists for it differ (one has forgotten the peer, two
// still list it), as they do over gossip for half a second: the round
// fails on all three, and they try it again with the lists of a moment
// later, complete it among themselves and agree.
func TestStreamingMembersDifferAfterLeave(t *testing.T) {
	acfg := aggregate.DefaultConfig()
	acfg.StallTimeout = 2 * time.Second
	gone, last := peerid.ID("peer01"), uint64(4) // outer step 2, fragment 1
	run := runStreaming(t, 4, streamingConfig(t, "streaming-diloco:h=4,fragments=2", 2), acfg, aggtest.Config{Latency: 10 * time.Millisecond},
		func(id peerid.ID, net train.Net, netw *aggtest.Network, board *traintest.Board, cancel context.CancelFunc) train.Net {
			if id == gone {
				return leaveNet{Net: net, id: id, at: last, before: true, netw: netw, board: board, cancel: cancel}
			}
			return splitView{Net: net, at: last, gone: gone, remember: id != "peer00", tried: new(bool)}
		})
	agreed(t, run, gone)
	for id, ps := range run.parts {
		if id == gone {
			continue
		}
		if len(ps) != 2 || len(ps[1]) != 3 || slices.Contains(ps[1], gone) {
			t.Fatalf("%s: outer steps %v", id, ps)
		}
	}
}

// gateNet holds a peer before round at until gate is closed; the opener
// closes it as it enters that round.
type gateNet struct {
	train.Net
	at     uint64
	gate   chan struct{}
	opener bool
	once   *sync.Once
}

func (g gateNet) AllReduce(ctx context.Context, round uint64, group []peerid.ID, dst, src []float32, weight float64) ([]peerid.ID, error) {
	if round == g.at {
		if g.opener {
			g.once.Do(func() { close(g.gate) })
		} else {
			select {
			case <-g.gate:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	}
	return g.Net.AllReduce(ctx, round, group, dst, src, weight)
}

// A peer that comes to a fragment's all-reduce after the others completed
// it without it (later than the stall timeout; retrying does not help, as
// they have gone on) takes their state of that outer step instead of
// keeping a global model of its own, which would differ from theirs from
// then on. With the others still at that step (they wait in the next
// one), it merges their state into its own and takes part in the next
// outer steps; with the others outer steps ahead, or at the run's last
// fragment, it jumps to their newest state. All four end with the same
// model.
func TestStreamingLatePeerTakesTheOthersState(t *testing.T) {
	for _, tc := range []struct {
		name, strategy string
		at             uint64 // the round the late peer comes 7 s late to
		rounds         int
		// hold has the others wait for the late peer before round at+1;
		// without it they finish the run before it catches up, and it
		// jumps to their final state.
		hold bool
	}{
		{"last-fragment", "streaming-diloco:h=4,fragments=2", 4, 2, false},
		{"mid-run", "streaming-diloco:h=4,fragments=2", 2, 3, true},
		{"mid-run-others-ahead", "streaming-diloco:h=4,fragments=2", 2, 3, false},
		{"overlap", "streaming-diloco:h=4,fragments=2,overlap=1", 1, 3, true},
		{"overlap-others-ahead", "streaming-diloco:h=4,fragments=2,overlap=1", 3, 3, false},
		{"async-diloco", "async-diloco:h=4", 2, 4, true},
		{"async-diloco-others-ahead", "async-diloco:h=4", 2, 4, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			acfg := aggregate.DefaultConfig()
			acfg.StallTimeout = 2 * time.Second
			late := peerid.ID("peer02")
			var gate chan struct{} // made in the bubble, which waits on it
			once := new(sync.Once)
			run := runStreaming(t, 4, streamingConfig(t, tc.strategy, tc.rounds), acfg, aggtest.Config{Latency: 10 * time.Millisecond},
				func(id peerid.ID, net train.Net, _ *aggtest.Network, _ *traintest.Board, _ context.CancelFunc) train.Net {
					if id == late {
						net = lateNet{Net: net, round: tc.at, delay: 7 * time.Second}
					}
					if gate == nil {
						gate = make(chan struct{})
					}
					if tc.hold {
						net = gateNet{Net: net, at: tc.at + 1, gate: gate, opener: id == late, once: once}
					}
					return net
				})
			agreed(t, run, "")
			for id, rs := range run.rounds {
				if len(rs) == 0 || rs[len(rs)-1] != uint64(tc.rounds) {
					t.Fatalf("%s reported outer steps %v", id, rs)
				}
				var synced []uint64
				for k, ok := range run.synced[id] {
					if ok {
						synced = append(synced, rs[k])
					}
				}
				if id != late {
					if len(synced) > 0 {
						t.Fatalf("%s took the others' state at outer steps %v", id, synced)
					}
					continue
				}
				if len(synced) != 1 {
					t.Fatalf("the late peer took the others' state at outer steps %v", synced)
				}
				if final := synced[0] == uint64(tc.rounds); final != (!tc.hold) {
					t.Fatalf("the late peer took the others' state at outer step %d of %d", synced[0], tc.rounds)
				}
				if ps := run.parts[id]; synced[0] < uint64(tc.rounds) && len(ps[len(ps)-1]) != 4 {
					t.Fatalf("the late peer did not take part again: its outer steps %v", ps)
				}
			}
		})
	}
}
