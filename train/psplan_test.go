package train

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/starling-ml/starling/compression"
	"github.com/starling-ml/starling/peerid"
	"github.com/starling-ml/starling/staleness"
)

func psIDs(n int) []peerid.ID {
	out := make([]peerid.ID, n)
	for i := range out {
		out[i] = peerid.ID(fmt.Sprint("peer", i))
	}
	return out
}

func TestPlanLayout(t *testing.T) {
	for _, c := range []struct {
		peers, n, dim int
		servers       int // want
	}{
		{1, 0, 10, 1}, {3, 0, 10, 1}, {4, 1, 10, 1}, {8, 0, 10, 2}, {5, 3, 10, 3}, {4, 4, 7, 4},
	} {
		ids := psIDs(c.peers)
		l, err := planLayout(ids, "m", c.dim, c.n)
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		if l.shards() != c.servers || l.Bounds[0] != 0 || l.Bounds[c.servers] != c.dim {
			t.Fatalf("%+v: %d shards, bounds %v", c, l.shards(), l.Bounds)
		}
		for i := range l.shards() {
			lo, hi := l.span(i)
			if hi <= lo {
				t.Errorf("%+v: shard %d empty: %v", c, i, l.Bounds)
			}
			switch b := l.Backups[i]; {
			case c.peers == 1 && b != "":
				t.Errorf("%+v: a lone peer has backup %s", c, b)
			case c.peers > 1 && (b == "" || b == l.Servers[i]):
				t.Errorf("%+v: shard %d served by %s backed up by %q", c, i, l.Servers[i], b)
			}
		}
		// The same members in any order, repeated, elect the same layout.
		rev := slices.Clone(ids)
		slices.Reverse(rev)
		l2, _ := planLayout(append(rev, ids[0]), "m", c.dim, c.n)
		if l2.digest() != l.digest() || !slices.Equal(l2.Servers, l.Servers) {
			t.Errorf("%+v: the order of members changed the layout", c)
		}
	}
	// Another model ranks the peers otherwise (for some model).
	ids := psIDs(6)
	first := psRank(ids, "m")[0]
	differs := false
	for i := range 8 {
		differs = differs || psRank(ids, fmt.Sprint("model", i))[0] != first
	}
	if !differs {
		t.Error("every model elects the same first server")
	}
	for _, c := range []struct {
		peers, n, dim int
	}{{0, 0, 10}, {3, 4, 10}, {3, -1, 10}, {3, 3, 2}} {
		if _, err := planLayout(psIDs(c.peers), "m", c.dim, c.n); !errors.Is(err, ErrStrategy) {
			t.Errorf("%+v: err %v, want ErrStrategy", c, err)
		}
	}
}

func TestPlanLayoutDigestDiffers(t *testing.T) {
	a, _ := planLayout(psIDs(4), "m", 100, 2)
	b, _ := planLayout(psIDs(5), "m", 100, 2) // a peer more: maybe other servers, other backups
	c, _ := planLayout(psIDs(4), "m", 101, 2)
	if a.digest() == c.digest() {
		t.Error("the same digest for models of different sizes")
	}
	if slices.Equal(a.Servers, b.Servers) && slices.Equal(a.Backups, b.Backups) && a.digest() != b.digest() {
		t.Error("the same layout, different digests")
	}
}

func TestAdmitPS(t *testing.T) {
	base := psShardView{model: "m", dim: 100, layout: 7, role: rolePrimary, length: 50, version: 10, lastSeq: 3, policy: staleness.Constant().WithBound(4), workers: 2}
	push := func(f func(*PSRequest)) *PSRequest {
		r := &PSRequest{Op: PSPush, Model: "m", Dim: 100, Layout: 7, Seq: 4, Base: 9, Elems: 50}
		if f != nil {
			f(r)
		}
		return r
	}
	view := func(f func(*psShardView)) psShardView {
		v := base
		if f != nil {
			f(&v)
		}
		return v
	}
	for _, c := range []struct {
		name    string
		r       *PSRequest
		v       psShardView
		status  PSStatus
		apply   bool
		promote bool
		tau     uint64
	}{
		{"fresh push", push(nil), base, PSOK, true, false, 1},
		{"other model", push(func(r *PSRequest) { r.Model = "x" }), base, PSBadModel, false, false, 0},
		{"other size", push(func(r *PSRequest) { r.Dim = 99 }), base, PSBadModel, false, false, 0},
		{"other layout", push(func(r *PSRequest) { r.Layout = 8 }), base, PSBadLayout, false, false, 0},
		{"not held", push(nil), view(func(v *psShardView) { v.role = roleNone }), PSNotServer, false, false, 0},
		{"moved", push(nil), view(func(v *psShardView) { v.role = roleMoved }), PSMoved, false, false, 0},
		{"wrong length", push(func(r *PSRequest) { r.Elems = 51 }), base, PSBadShape, false, false, 0},
		{"no seq", push(func(r *PSRequest) { r.Seq = 0 }), base, PSBadRequest, false, false, 0},
		{"retried after failover", push(func(r *PSRequest) { r.Seq = 3 }), base, PSDup, false, false, 0},
		{"from the future", push(func(r *PSRequest) { r.Base = 11 }), base, PSBadRequest, false, false, 0},
		// The old primary acknowledged version 11 but its replica failed.
		{"ahead of a promoted backup", push(func(r *PSRequest) { r.Base = 11 }), view(func(v *psShardView) { v.role = rolePromoted }), PSOK, true, false, 0},
		{"ahead of a backup taking over", push(func(r *PSRequest) { r.Base = 11 }), view(func(v *psShardView) { v.role = roleBackup }), PSOK, true, true, 0},
		// ssp:4 with one other worker: dropped beyond τ = 2·(4+1)·1.
		{"at the drop bound", push(func(r *PSRequest) { r.Base = 0 }), base, PSOK, true, false, 10},
		{"beyond the drop bound", push(func(r *PSRequest) { r.Base = 0 }), view(func(v *psShardView) { v.version = 11 }), PSStale, false, false, 11},
		{"more workers, a higher drop bound", push(func(r *PSRequest) { r.Base = 0 }), view(func(v *psShardView) { v.version = 11; v.workers = 3 }), PSOK, true, false, 11},
		{"alone: any staleness dropped", push(func(r *PSRequest) { r.Base = 9 }), view(func(v *psShardView) { v.workers = 1 }), PSStale, false, false, 1},
		{"no bound: nothing dropped", push(func(r *PSRequest) { r.Base = 0 }), view(func(v *psShardView) { v.version = 1000; v.policy = staleness.Constant() }), PSOK, true, false, 1000},
		{"backup takes over on a push", push(nil), view(func(v *psShardView) { v.role = roleBackup }), PSOK, true, true, 1},
		{"backup takes over on a pull", &PSRequest{Op: PSPull, Model: "m", Dim: 100, Layout: 7}, view(func(v *psShardView) { v.role = roleBackup }), PSOK, false, true, 0},
		{"replica, newer", &PSRequest{Op: PSReplicate, Model: "m", Dim: 100, Layout: 7, Version: 11}, view(func(v *psShardView) { v.role = roleBackup }), PSOK, true, false, 0},
		{"replica, older", &PSRequest{Op: PSReplicate, Model: "m", Dim: 100, Layout: 7, Version: 9}, view(func(v *psShardView) { v.role = roleBackup }), PSOK, false, false, 0},
		{"replica to a promoted backup", &PSRequest{Op: PSReplicate, Model: "m", Dim: 100, Layout: 7, Version: 11}, view(func(v *psShardView) { v.role = rolePromoted }), PSMoved, false, false, 0},
		{"unknown op", &PSRequest{Op: 9, Model: "m", Dim: 100, Layout: 7}, base, PSBadRequest, false, false, 0},
	} {
		a := admitPS(c.r, c.v)
		if a.status != c.status || a.apply != c.apply || a.promote != c.promote || a.decision.Tau != c.tau {
			t.Errorf("%s: %+v, want status %s apply %v promote %v τ %d", c.name, a, c.status, c.apply, c.promote, c.tau)
		}
		if a.status >= PSNotServer && a.detail == "" {
			t.Errorf("%s: refusal without a detail", c.name)
		}
	}
	// A weight policy weighs an applied push by its staleness.
	a := admitPS(push(func(r *PSRequest) { r.Base = 7 }), view(func(v *psShardView) { v.policy = staleness.Polynomial(0.5) }))
	if !a.apply || a.decision.Tau != 3 || a.decision.Weight != 0.5 {
		t.Errorf("poly:0.5 at τ=3: %+v", a)
	}
}

func TestPlanRetry(t *testing.T) {
	down := errors.New("connection reset")
	grace := 10 * time.Second
	fresh := psCallState{primary: "a", backup: "b"}
	up := psCallState{primary: "a", backup: "b", started: true}
	over := psCallState{primary: "a", backup: "b", started: true, onBackup: true}
	lone := psCallState{primary: "a", started: true}
	for _, c := range []struct {
		name string
		s    psCallState
		err  error
		st   PSStatus
		el   time.Duration
		want psNext
	}{
		{"not up yet", fresh, down, PSOK, time.Second, psRetry},
		{"not ready", up, nil, PSNotReady, time.Second, psRetry},
		{"never came up", fresh, down, PSOK, grace, psFailover},
		{"not ready for too long", up, nil, PSNotReady, grace, psFailover},
		{"died", up, down, PSOK, 0, psFailover},
		{"moved", up, nil, PSMoved, 0, psFailover},
		{"backup died too", over, down, PSOK, 0, psFail},
		{"no backup", lone, down, PSOK, 0, psFail},
		{"other model", up, nil, PSBadModel, 0, psFail},
		{"other layout", fresh, nil, PSBadLayout, 0, psFail},
		{"wrong shape", up, nil, PSBadShape, 0, psFail},
	} {
		if got := planRetry(c.s, c.err, c.st, c.el, grace); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
}

func TestPSConfigValidate(t *testing.T) {
	if err := DefaultPSConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	for name, f := range map[string]func(*PSConfig){
		"no model":      func(c *PSConfig) { c.Model = "" },
		"servers":       func(c *PSConfig) { c.Servers = -1 },
		"lambda":        func(c *PSConfig) { c.DCLambda = -1 },
		"lr":            func(c *PSConfig) { c.LR = 0 },
		"call timeout":  func(c *PSConfig) { c.CallTimeout = 0 },
		"codec missing": func(c *PSConfig) { c.Codec = compression.Spec{} },
	} {
		c := DefaultPSConfig()
		f(&c)
		if err := c.Validate(); !errors.Is(err, ErrStrategy) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestPSSlowest: the gate counts the other workers that are not done and
// whose clock grew within the stall timeout.
func TestPSSlowest(t *testing.T) {
	now := time.Unix(1000, 0)
	const stall = time.Second
	self := psSession{"me", 1}
	for _, c := range []struct {
		name   string
		clocks map[psSession]psClock
		want   uint64
		ok     bool
	}{
		{"nobody", nil, 0, false},
		{"only self", map[psSession]psClock{self: {clock: 3, moved: now}}, 0, false},
		{"the lowest of the live", map[psSession]psClock{self: {clock: 1, moved: now}, {"a", 1}: {clock: 7, moved: now}, {"b", 1}: {clock: 5, moved: now.Add(-stall / 2)}}, 5, true},
		{"done does not count", map[psSession]psClock{{"a", 1}: {clock: 7, moved: now}, {"b", 1}: {clock: 2, moved: now, done: true}}, 7, true},
		{"stalled does not count", map[psSession]psClock{{"a", 1}: {clock: 7, moved: now}, {"b", 1}: {clock: 2, moved: now.Add(-stall)}}, 7, true},
		{"an earlier session of self counts", map[psSession]psClock{{"me", 2}: {clock: 0, moved: now}}, 0, true},
		{"all stalled or done", map[psSession]psClock{{"a", 1}: {clock: 7, moved: now.Add(-2 * stall)}, {"b", 1}: {clock: 2, done: true}}, 0, false},
	} {
		got, ok := psSlowest(c.clocks, self, now, stall)
		if got != c.want || ok != c.ok {
			t.Errorf("%s: %d %v, want %d %v", c.name, got, ok, c.want, c.ok)
		}
	}
	// observe: the clock and its time move only forwards.
	var c psClock
	c = c.observe(0, now)
	c = c.observe(4, now.Add(time.Second))
	c = c.observe(3, now.Add(2*time.Second))
	if c.clock != 4 || !c.moved.Equal(now.Add(time.Second)) {
		t.Errorf("observe: %+v", c)
	}
}

// TestPSGateWaits: a worker at clock c waits while c − slowest > s, the
// decision of Policy.Gate; without a bound or another worker, never.
func TestPSGateWaits(t *testing.T) {
	ssp4 := staleness.SSP(4)
	for _, c := range []struct {
		name           string
		pol            staleness.Policy
		clock, slowest uint64
		others         bool
		want           bool
	}{
		{"no bound", staleness.Constant(), 100, 0, true, false},
		{"no other worker", ssp4, 100, 0, false, false},
		{"at the bound", ssp4, 9, 5, true, false},
		{"beyond the bound", ssp4, 10, 5, true, true},
		{"behind the slowest", ssp4, 3, 5, true, false},
		{"ssp:0, one ahead", staleness.SSP(0), 6, 5, true, true},
		{"ssp:0, level", staleness.SSP(0), 5, 5, true, false},
		{"a weight and a bound", staleness.Polynomial(0.5).WithBound(2), 8, 5, true, true},
	} {
		if got := psGateWaits(c.pol, c.clock, c.slowest, c.others); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	// admitPS: a gate request is answered PSWait or PSOK; a push (applied,
	// dropped or a duplicate) carries the verdict at its clock.
	v := psShardView{model: "m", dim: 10, layout: 7, role: rolePrimary, length: 10, version: 50, lastSeq: 9,
		policy: ssp4, workers: 3, slowest: 5, others: true}
	gate := func(seq uint64) *PSRequest {
		return &PSRequest{Op: PSGate, Model: "m", Dim: 10, Layout: 7, Seq: seq}
	}
	pushAt := func(seq, base uint64) *PSRequest {
		return &PSRequest{Op: PSPush, Model: "m", Dim: 10, Layout: 7, Seq: seq, Base: base, Elems: 10}
	}
	for _, c := range []struct {
		name    string
		r       *PSRequest
		slowest uint64
		status  PSStatus
		wait    bool
	}{
		{"gate, held", gate(10), 5, PSWait, true},
		{"gate, open", gate(9), 5, PSOK, false},
		{"push beyond the edge", pushAt(10, 49), 5, PSOK, true},
		{"push at the edge", pushAt(10, 49), 6, PSOK, false},
		{"duplicate push, held", pushAt(9, 49), 4, PSDup, true},
		{"dropped push, held", pushAt(10, 0), 5, PSStale, true},
		{"bad push: no verdict", &PSRequest{Op: PSPush, Model: "m", Dim: 10, Layout: 7, Seq: 10, Elems: 3}, 5, PSBadShape, false},
	} {
		v.slowest = c.slowest
		a := admitPS(c.r, v)
		if a.status != c.status || a.wait != c.wait {
			t.Errorf("%s: status %s wait %v, want %s %v", c.name, a.status, a.wait, c.status, c.wait)
		}
	}
}
