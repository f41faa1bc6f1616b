package train

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/starling-ml/starling/compression"
	"github.com/starling-ml/starling/gossip/wire"
	"github.com/starling-ml/starling/peerid"
	"github.com/starling-ml/starling/staleness"
)

func TestPlanPayload(t *testing.T) {
	for _, c := range []struct {
		mode   string
		robust bool
		want   payloadPlan
	}{
		{ModeFedAsync, false, payloadPlan{kind: wire.KindModel, tick: true}},
		{ModeFedBuff, true, payloadPlan{kind: wire.KindModel, buffer: true}},
		{ModeFedBuff, false, payloadPlan{kind: wire.KindDelta, delta: true, buffer: true}},
	} {
		got := planPayload(c.mode, c.robust)
		if got != c.want {
			t.Errorf("%s robust=%v: %+v, want %+v", c.mode, c.robust, got, c.want)
		}
		// Models supersede each other in the pull queue; deltas do not.
		if want := c.mode == ModeFedAsync || c.robust; got.coalesce() != want {
			t.Errorf("%s robust=%v: coalesce %v, want %v", c.mode, c.robust, got.coalesce(), want)
		}
	}
}

func TestNextRound(t *testing.T) {
	for _, c := range []struct {
		steps, local, max int
		want              int
		ok                bool
	}{
		{0, 10, 0, 10, true},    // no limit
		{500, 10, 0, 10, true},  // no limit
		{0, 10, 25, 10, true},   // a whole round
		{20, 10, 25, 5, true},   // the last round is cut short
		{25, 10, 25, 0, false},  // done
		{30, 10, 25, 0, false},  // past it (a restored worker)
		{24, 10, 25, 1, true},   // one step left
		{0, 100, 12, 12, true},  // MaxSteps below LocalSteps
		{11, 100, 12, 1, true},  // MaxSteps below LocalSteps, last step
		{12, 100, 12, 0, false}, // and done
	} {
		got, ok := nextRound(c.steps, c.local, c.max)
		if got != c.want || ok != c.ok {
			t.Errorf("nextRound(%d, %d, %d) = %d, %v, want %d, %v", c.steps, c.local, c.max, got, ok, c.want, c.ok)
		}
	}
}

func TestRoundOver(t *testing.T) {
	const rt = 100 * time.Millisecond
	for _, c := range []struct {
		i, k      int
		el, round time.Duration
		want      bool
	}{
		{0, 10, 0, 0, false},
		{9, 10, time.Hour, 0, false}, // no RoundTime: steps only
		{10, 10, 0, 0, true},
		{0, 10, time.Hour, rt, false}, // at least one step
		{1, 10, rt - 1, rt, false},
		{1, 10, rt, rt, true}, // a straggler publishes after one step
		{3, 10, time.Nanosecond, time.Nanosecond, true},
		{10, 10, 0, rt, true},
	} {
		if got := roundOver(c.i, c.k, c.el, c.round); got != c.want {
			t.Errorf("roundOver(%d, %d, %v, %v) = %v, want %v", c.i, c.k, c.el, c.round, got, c.want)
		}
	}
}

func TestSnapshotDue(t *testing.T) {
	const ms = time.Millisecond
	for _, c := range []struct {
		force           bool
		at, last, every time.Duration
		want            bool
	}{
		{true, 10 * ms, 10 * ms, time.Hour, true},
		{false, 10 * ms, 10 * ms, 0, true}, // every 0: every time
		{false, 260 * ms, 10 * ms, 250 * ms, true},
		{false, 259 * ms, 10 * ms, 250 * ms, false},
	} {
		if got := snapshotDue(c.force, c.at, c.last, c.every); got != c.want {
			t.Errorf("snapshotDue(%v, %v, %v, %v) = %v, want %v", c.force, c.at, c.last, c.every, got, c.want)
		}
	}
}

func TestBufferQuorum(t *testing.T) {
	// live other peers → votes needed, this peer's included
	for live, want := range []int{1, 2, 2, 3, 3, 4, 4, 5} {
		if got := bufferQuorum(live); got != want {
			t.Errorf("bufferQuorum(%d) = %d, want %d", live, got, want)
		}
		// A strict majority of the live peers and this one.
		if n := live + 1; 2*bufferQuorum(live) <= n {
			t.Errorf("bufferQuorum(%d) = %d is no majority of %d", live, bufferQuorum(live), n)
		}
	}
	// Two of three other peers stop: the quorum counts them until PeerTTL
	// has passed since they were last heard from.
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	vc := staleness.NewVersionClock(0, 100*time.Millisecond)
	for _, p := range []string{"a", "b", "c"} {
		vc.Observe(p, 5, t0)
	}
	for _, s := range []struct {
		at   time.Duration
		want int
	}{{0, 3}, {50 * time.Millisecond, 3}, {99 * time.Millisecond, 3}, {100 * time.Millisecond, 2}, {time.Second, 2}} {
		now := t0.Add(s.at)
		vc.Observe("a", 9, now) // a is still there
		if got := bufferQuorum(vc.Live(now)); got != s.want {
			t.Errorf("at %v: quorum %d, want %d", s.at, got, s.want)
		}
	}
}

// TestGateWaits drives the SSP gate (bound 3, PeerTTL 1 s, stall 3 s)
// through a run: peers behind and catching up, a peer that stops (it
// expires), a peer heard from but stuck (it stalls), and one that moves
// again.
func TestGateWaits(t *testing.T) {
	const ttl = time.Second
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	ssp, _ := staleness.Parse("poly:0.5+ssp:3")
	free, _ := staleness.Parse("poly:0.5")
	vc := staleness.NewVersionClock(0, ttl)
	vc.SetStall(3 * ttl)
	for _, s := range []struct {
		name  string
		at    time.Duration
		local staleness.Version
		seen  map[string]staleness.Version // observations at this time
		pol   staleness.Policy
		want  bool
	}{
		{"no peers", 0, 10, nil, ssp, false},
		{"a peer within the bound", 0, 10, map[string]staleness.Version{"a": 7}, ssp, false},
		{"a peer beyond it", 0, 11, nil, ssp, true},
		{"no bound", 0, 11, nil, free, false},
		{"another peer behind", 100 * time.Millisecond, 11, map[string]staleness.Version{"b": 9}, ssp, true},
		{"a catches up", 200 * time.Millisecond, 11, map[string]staleness.Version{"a": 8}, ssp, false},
		{"a stops: its version holds the gate", 900 * time.Millisecond, 12, map[string]staleness.Version{"b": 11}, ssp, true},
		{"until it expires (PeerTTL)", 1200 * time.Millisecond, 12, map[string]staleness.Version{"b": 11}, ssp, false},
		{"b stuck at 11, heard from", 2500 * time.Millisecond, 16, map[string]staleness.Version{"b": 11}, ssp, true},
		{"b stuck for 3×PeerTTL: it no longer counts", 3900 * time.Millisecond, 16, map[string]staleness.Version{"b": 11}, ssp, false},
		{"b grows again: it counts", 4000 * time.Millisecond, 16, map[string]staleness.Version{"b": 12}, ssp, true},
	} {
		for p, v := range s.seen {
			vc.Observe(p, v, at(s.at))
		}
		vc.Set(s.local)
		if got := gateWaits(s.pol, vc, at(s.at)); got != s.want {
			t.Errorf("%s: gateWaits = %v, want %v (lag %d)", s.name, got, s.want, vc.Lag(at(s.at)))
		}
	}
}

func TestScreen(t *testing.T) {
	ssp4, _ := staleness.Parse("poly:0.5+ssp:4")
	free, _ := staleness.Parse("poly:0.5")
	v := screenView{model: "m", kind: wire.KindModel, dim: 100, local: 10, maxAhead: 1024, localSteps: 5, policy: ssp4}
	ann := func(peer peerid.ID, seq, base uint64, mut func(*wire.Announcement)) *wire.Announcement {
		a := &wire.Announcement{Peer: peer, Seq: seq, Model: "m", Kind: wire.KindModel, Elems: 100, Base: base, Version: base + 1}
		if mut != nil {
			mut(a)
		}
		return a
	}
	seen := map[peerid.ID]*seqWindow{}
	pull := screening{pull: true, observe: true}
	for _, c := range []struct {
		name string
		a    *wire.Announcement
		view func(*screenView)
		want screening
	}{
		{"fresh", ann("a", 100, 10, nil), nil, pull},
		{"behind within the bound", ann("a", 101, 6, nil), nil, screening{pull: true, observe: true, tau: 4}},
		{"ahead within MaxAhead", ann("a", 102, 500, nil), nil, pull},
		{"foreign model", ann("a", 103, 10, func(a *wire.Announcement) { a.Model = "other" }), nil, screening{drop: DropModel}},
		{"wrong kind", ann("a", 104, 10, func(a *wire.Announcement) { a.Kind = wire.KindDelta }), nil, screening{drop: DropKind}},
		{"gradient", ann("a", 105, 10, func(a *wire.Announcement) { a.Kind = wire.KindGradient }), nil, screening{drop: DropKind}},
		{"wrong length", ann("a", 106, 3, func(a *wire.Announcement) { a.Elems = 99 }), nil, screening{drop: DropShape, tau: 7}},
		// Announcements dropped before the replay check do not use up
		// their numbers.
		{"seq of a dropped one, now good", ann("a", 106, 10, nil), nil, pull},
		{"replay", ann("a", 100, 10, nil), nil, screening{drop: DropReplay}},
		{"out of order, not seen yet", ann("a", 99, 10, nil), nil, pull},
		{"replay, out of order", ann("a", 99, 10, nil), nil, screening{drop: DropReplay}},
		{"older than the window", ann("a", 106-64, 10, nil), nil, screening{drop: DropReplay}},
		{"another peer's numbers are its own", ann("b", 100, 10, nil), nil, pull},
		{"beyond the SSP bound", ann("a", 107, 5, nil), nil, screening{drop: DropStale, observe: true, tau: 5}},
		{"far beyond it", ann("a", 108, 0, nil), nil, screening{drop: DropStale, observe: true, tau: 10}},
		{"no bound", ann("a", 109, 0, nil), func(v *screenView) { v.policy = free }, screening{pull: true, observe: true, tau: 10}},
		{"base at MaxAhead", ann("a", 110, 10+1024, nil), nil, pull},
		{"base beyond MaxAhead", ann("a", 111, 10+1025, nil), nil, screening{drop: DropFuture}},
		{"version beyond MaxAhead and a round", ann("a", 112, 10, func(a *wire.Announcement) { a.Version = 10 + 1024 + 5 + 2 }), nil,
			screening{drop: DropFuture, observe: true}},
		{"version at MaxAhead and a round", ann("a", 113, 10, func(a *wire.Announcement) { a.Version = 10 + 1024 + 5 + 1 }), nil, pull},
	} {
		view := v
		if c.view != nil {
			c.view(&view)
		}
		if got := screen(c.a, view, seen); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
	// Foreign, mistyped and misshapen announcements leave no window
	// behind, whoever claims to send them.
	for i := range 100 {
		screen(ann(peerid.ID(fmt.Sprint("x", i)), 1, 10, func(a *wire.Announcement) { a.Model = "other" }), v, seen)
	}
	if len(seen) != 2 {
		t.Errorf("%d replay windows, want 2 (a and b)", len(seen))
	}
}

func TestSeqWindow(t *testing.T) {
	var w seqWindow
	for _, tc := range []struct {
		seq  uint64
		want bool
	}{{10, true}, {10, false}, {12, true}, {11, true}, {11, false}, {9, true}, {100, true}, {36, false}, {37, true}, {37, false}, {12, false}, {200, true}, {100, false}} {
		if got := w.admit(tc.seq); got != tc.want {
			t.Fatalf("admit(%d) = %v, want %v", tc.seq, got, tc.want)
		}
	}
}

func TestPlanMerge(t *testing.T) {
	v := mergeView{dim: 4, kind: wire.KindModel, local: 10, maxAhead: 100}
	c := func(n int, kind wire.PayloadKind, base uint64) *contribution {
		return &contribution{from: "a", kind: kind, base: base, vec: make([]float32, n)}
	}
	for _, tc := range []struct {
		name string
		c    *contribution
		view func(*mergeView)
		want mergePlan
	}{
		{"current", c(4, wire.KindModel, 10), nil, mergePlan{merge: true}},
		{"stale (the policy decides)", c(4, wire.KindModel, 2), nil, mergePlan{merge: true}},
		{"ahead: the version moves to it", c(4, wire.KindModel, 60), nil, mergePlan{merge: true, advance: true}},
		{"at MaxAhead", c(4, wire.KindModel, 110), nil, mergePlan{merge: true, advance: true}},
		{"beyond MaxAhead", c(4, wire.KindModel, 111), nil, mergePlan{drop: DropFuture}},
		{"decoded length", c(3, wire.KindModel, 10), nil, mergePlan{drop: DropShape}},
		{"kind", c(4, wire.KindDelta, 10), nil, mergePlan{drop: DropKind}},
		{"shape before kind", c(5, wire.KindDelta, 500), nil, mergePlan{drop: DropShape}},
		{"FedAsync with clipping: the first model of a round", c(4, wire.KindModel, 10),
			func(v *mergeView) { v.once = true }, mergePlan{merge: true, clip: true}},
		{"FedAsync with clipping: another from the same peer", c(4, wire.KindModel, 10),
			func(v *mergeView) { v.once, v.merged = true, true }, mergePlan{drop: DropRepeat}},
		{"a repeat from ahead still moves the version", c(4, wire.KindModel, 50),
			func(v *mergeView) { v.once, v.merged = true, true }, mergePlan{drop: DropRepeat, advance: true}},
		{"merged before, once off (FedBuff, own deltas)", c(4, wire.KindModel, 10),
			func(v *mergeView) { v.merged = true }, mergePlan{merge: true}},
	} {
		view := v
		if tc.view != nil {
			tc.view(&view)
		}
		if got := planMerge(tc.c, view); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

func TestMergeOutcome(t *testing.T) {
	accept := staleness.Decision{Action: staleness.Accept, Tau: 2, Weight: 0.5}
	reject := staleness.Decision{Action: staleness.Reject, Tau: 9}
	wrap := func(err error) error { return fmt.Errorf("buffer: %w", err) }
	for _, c := range []struct {
		d    staleness.Decision
		err  error
		want DropReason
		ok   bool
	}{
		{accept, nil, 0, true},
		{reject, nil, DropStale, false},
		{staleness.Decision{Action: staleness.Reject}, wrap(staleness.ErrShape), DropShape, false},
		{staleness.Decision{Action: staleness.Reject}, wrap(staleness.ErrNonFinite), DropNonFinite, false},
		{staleness.Decision{Action: staleness.Reject}, wrap(staleness.ErrFutureVersion), DropFuture, false},
		{staleness.Decision{}, errors.New("something else"), DropDecode, false},
	} {
		if r, ok := mergeOutcome(c.d, c.err); r != c.want || ok != c.ok {
			t.Errorf("mergeOutcome(%v, %v) = %v, %v, want %v, %v", c.d, c.err, r, ok, c.want, c.ok)
		}
	}
}

func TestDecodeDrop(t *testing.T) {
	if r := decodeDrop(fmt.Errorf("fp32: %w", compression.ErrLength)); r != DropShape {
		t.Errorf("length: %v", r)
	}
	if r := decodeDrop(errors.New("corrupt")); r != DropDecode {
		t.Errorf("corrupt: %v", r)
	}
}

// TestPullQueue walks pull queues through scripts of pushes and pops: a
// FedAsync queue (coalescing, 3 slots) under a flood from one peer and
// beyond its size, and a FedBuff queue (every delta waits its turn).
func TestPullQueue(t *testing.T) {
	for _, c := range []struct {
		name     string
		coalesce bool
		max      int
		// ops: "+a1" pushes a's seq 1 (then "!a1" names what it displaced
		// and why, "." nothing); "-" pops (then the announcement, "." when
		// empty).
		ops string
	}{
		{"fedasync", true, 3,
			"+a1 . +b1 . +a2 !a1:superseded +c1 . +d1 !a2:overflow - b1 - c1 - d1 - . " +
				// a's slot went with the overflow: a new a is queued, not merged.
				"+a3 . - a3 - ."},
		{"fedasync flood from one peer", true, 3,
			"+a1 . +a2 !a1:superseded +a3 !a2:superseded +b1 . +a4 !a3:superseded +c1 . - a4 - b1 - c1 - ."},
		{"fedbuff", false, 3,
			"+a1 . +a2 . +b1 . +a3 !a1:overflow - a2 - b1 - a3 - ."},
		{"fedbuff flood from one peer", false, 2,
			"+a1 . +a2 . +a3 !a1:overflow +a4 !a2:overflow +b1 !a3:overflow - a4 - b1 - ."},
	} {
		t.Run(c.name, func(t *testing.T) {
			q := newPullQueue(c.coalesce, c.max)
			ops := strings.Fields(c.ops)
			for i := 0; i < len(ops); i += 2 {
				op, want := ops[i], ops[i+1]
				var got string
				switch op[0] {
				case '+':
					var seq uint64
					fmt.Sscan(op[2:], &seq)
					got = "."
					if old, r := q.push(&wire.Announcement{Peer: peerid.ID(op[1:2]), Seq: seq}); old != nil {
						got = fmt.Sprintf("!%s%d:%s", old.Peer, old.Seq, r)
					}
				case '-':
					got = "."
					if a, ok := q.pop(); ok {
						got = fmt.Sprint(a.Peer, a.Seq)
					}
				}
				if got != want {
					t.Fatalf("op %d (%s): %s, want %s", i/2, op, got, want)
				}
			}
		})
	}
}

// TestSharedPullQueueWaits: a puller's pop waits for a push, and returns
// when its context ends.
func TestSharedPullQueueWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := newSharedPullQueue(true, 4)
		got := make(chan *wire.Announcement)
		go func() {
			a, _ := q.pop(t.Context())
			got <- a
		}()
		synctest.Wait()
		select {
		case a := <-got:
			t.Fatalf("pop on an empty queue returned %v", a)
		default:
		}
		q.push(&wire.Announcement{Peer: "a", Seq: 1})
		if a := <-got; a.Seq != 1 {
			t.Fatalf("popped %v", a)
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		start := time.Now()
		if _, ok := q.pop(ctx); ok || time.Since(start) != time.Second {
			t.Fatalf("pop on an empty queue: %v after %v", ok, time.Since(start))
		}
	})
}

// TestFarSources: connected peers are always pulled from; unconnected ones
// take one of max slots, kept while they announce or stay connected, and
// freed once their holder is silent and unconnected for the TTL.
func TestFarSources(t *testing.T) {
	t0 := time.Unix(0, 0)
	conn := map[peerid.ID]bool{"c1": true, "c2": true}
	connected := func(p peerid.ID) bool { return conn[p] }
	f := newFarSources(2, 10*time.Second)
	steps := []struct {
		src  peerid.ID
		at   time.Duration
		want bool
	}{
		{"c1", 0, true}, {"c2", 0, true}, // connected: no slot
		{"f1", 0, true}, {"f2", time.Second, true}, // two slots taken
		{"f3", 2 * time.Second, false}, {"f4", 2 * time.Second, false}, // full
		{"c1", 2 * time.Second, true}, {"f1", 3 * time.Second, true}, // connected, holder
	}
	for i, s := range steps {
		if got := f.admit(s.src, t0.Add(s.at), connected); got != s.want {
			t.Fatalf("step %d: admit(%s at %v) = %v, want %v", i, s.src, s.at, got, s.want)
		}
	}
	if len(f.last) != 2 {
		t.Fatalf("%d slots held, want 2: %v", len(f.last), f.last)
	}
	// f1 announced at 3 s, f2 last at 1 s: at 11.5 s only f2 is silent
	// for the TTL. While f2 is connected (the pull dialed it), it keeps
	// its slot; once its connection is gone, f3 takes it.
	conn["f2"] = true
	if f.admit("f3", t0.Add(11500*time.Millisecond), connected) {
		t.Fatal("a silent but connected holder lost its slot")
	}
	conn["f2"] = false
	if !f.admit("f3", t0.Add(11500*time.Millisecond), connected) {
		t.Fatal("a silent, unconnected holder kept its slot")
	}
	if _, ok := f.last["f2"]; ok {
		t.Fatal("f2 still holds a slot")
	}
	if f.admit("f4", t0.Add(12*time.Second), connected) {
		t.Fatal("f4 took a slot from holders heard within the TTL")
	}

	// No slots: connected peers only. No bound: everyone.
	none := newFarSources(0, time.Second)
	if !none.admit("c1", t0, connected) || none.admit("f1", t0, connected) {
		t.Fatal("FarSources 0 must pull from connected peers only")
	}
	all := newFarSources(-1, time.Second)
	for _, p := range []peerid.ID{"f1", "f2", "f3", "f4", "f5"} {
		if !all.admit(p, t0, connected) {
			t.Fatalf("FarSources < 0 refused %s", p)
		}
	}
}
