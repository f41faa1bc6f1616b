package train

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/starling-ml/starling/peerid"
)

func pids(s ...string) []peerid.ID {
	out := make([]peerid.ID, len(s))
	for i, p := range s {
		out[i] = peerid.ID(p)
	}
	return out
}

func TestQuorate(t *testing.T) {
	all := pids("a", "b", "c", "d", "e")
	for _, c := range []struct {
		members, ref, gone []peerid.ID
		want               bool
	}{
		{pids("a"), nil, nil, true},                            // no reference yet
		{pids("a", "b", "c"), all, nil, true},                  // 3 of 5
		{pids("a", "b"), all, nil, false},                      // 2 of 5
		{pids("a", "b"), all, pids("d", "e"), true},            // 2 of 3 once two left
		{pids("a"), pids("a", "b"), nil, false},                // 1 of 2: a partner lost
		{pids("a"), pids("a", "b"), pids("b"), true},           // 1 of 1: the partner left
		{pids("a", "x", "y"), pids("a", "b", "c"), nil, false}, // newcomers do not make a majority of the old
		{pids("b", "c"), pids("a", "b", "c"), pids("a"), true}, // self's own departure does not count
	} {
		gone := map[peerid.ID]bool{}
		for _, p := range c.gone {
			gone[p] = true
		}
		if got := quorate("a", gone, c.members, c.ref); got != c.want {
			t.Errorf("members %v of %v (gone %v): quorate %v, want %v", c.members, c.ref, c.gone, got, c.want)
		}
	}
}

func TestNoteDepartures(t *testing.T) {
	departed := map[peerid.ID]bool{"gone": true, "back": true}
	noteDepartures(departed, map[peerid.ID]Status{
		"back":    {Version: 3},
		"stopped": {Version: 2, Done: true},
		"running": {Version: 3},
	})
	// "gone" no longer announces anything: it stays departed.
	if want := map[peerid.ID]bool{"gone": true, "stopped": true}; !maps.Equal(departed, want) {
		t.Fatalf("departed %v, want %v", departed, want)
	}
}

func TestLiveVersions(t *testing.T) {
	got := liveVersions(map[peerid.ID]Status{"a": {Version: 4}, "b": {Version: 2, Done: true}, "c": {}})
	if want := map[peerid.ID]uint64{"a": 4, "c": 0}; !maps.Equal(got, want) {
		t.Fatalf("versions %v, want %v", got, want)
	}
}

func TestPlanRound(t *testing.T) {
	five := pids("a", "b", "c", "d", "e")
	// With seed 1 and C = 0.4, rounds 1–6 of five sample [a d] [b e] [a d]
	// [b e] [b e] [a e]; of two with C = 0.5, [a] [b] [a] [b] [b] [a].
	for _, c := range []struct {
		name       string
		self       peerid.ID
		r, version uint64
		members    []peerid.ID
		fraction   float64
		want       roundPlan
	}{
		{"sampled and up to date", "b", 2, 1, five, 0.4, roundPlan{sampled: pids("b", "e"), join: true}},
		{"not sampled", "a", 2, 1, five, 0.4, roundPlan{sampled: pids("b", "e")}},
		{"not sampled, behind: nothing to fetch", "c", 4, 0, five, 0.4, roundPlan{sampled: pids("b", "e")}},
		{"first round", "a", 1, 0, five, 1, roundPlan{sampled: five, join: true}},
		{"missed rounds: fetch from the last round's sample", "b", 4, 1, five, 0.4,
			roundPlan{sampled: pids("b", "e"), join: true, behind: true, from: pids("a", "d")}},
		{"missed rounds, in the last round's sample too", "b", 5, 3, five, 0.4,
			roundPlan{sampled: pids("b", "e"), join: true, behind: true, from: pids("e")}},
		{"missed rounds, nobody else sampled", "b", 5, 2, pids("a", "b"), 0.5,
			roundPlan{sampled: pids("b"), join: true, behind: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := planRound(1, c.fraction, 16, c.self, c.r, c.version, c.members, c.members)
			if !slices.Equal(got.sampled, c.want.sampled) || got.join != c.want.join || got.behind != c.want.behind || !slices.Equal(got.from, c.want.from) {
				t.Fatalf("got %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestPlanRoundSamplesTheAdmitted(t *testing.T) {
	// A peer behind asks round r−1's sample of the peers admitted to
	// r−1, which a joiner of round r is not part of.
	five := pids("a", "b", "c", "d", "e")
	got := planRound(1, 1, 16, "b", 4, 1, five, pids("a", "b", "c"))
	if !got.behind || !slices.Equal(got.from, pids("a", "c")) {
		t.Fatalf("got %+v, want to fetch from a and c", got)
	}
}

func TestAdmitted(t *testing.T) {
	members := pids("a", "b", "c", "d", "e")
	statuses := map[peerid.ID]Status{
		"b": {Version: 7},                      // declares nothing (an older peer, sync's idle)
		"c": {Version: 7, JoinAt: 1},           // founded the federation
		"d": {Version: 3, JoinAt: 9},           // rejoins at round 9
		"e": {Version: 0, JoinAt: JoinPending}, // still starting up
	}
	for _, c := range []struct {
		name     string
		self     peerid.ID
		selfJoin uint64
		r        uint64
		want     []peerid.ID
	}{
		{"a joiner waits for its round", "a", 1, 8, pids("a", "b", "c")},
		{"at the joiner's round it is in", "a", 1, 9, pids("a", "b", "c", "d")},
		{"later rounds keep it", "a", 1, 12, pids("a", "b", "c", "d")},
		{"self before its own round", "d", 9, 8, pids("a", "b", "c")},
		{"self at its own round", "d", 9, 9, pids("a", "b", "c", "d")},
		{"self pending, its stale status ignored", "e", JoinPending, 20, pids("a", "b", "c", "d")},
		{"self declared, its stale pending status ignored", "e", 20, 20, members},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := admitted(c.self, c.selfJoin, c.r, members, statuses); !slices.Equal(got, c.want) {
				t.Fatalf("got %v, want %v", got, c.want)
			}
		})
	}
}

func TestJoinRound(t *testing.T) {
	for _, c := range []struct {
		name     string
		version  uint64
		statuses map[peerid.ID]Status
		want     uint64
	}{
		{"alone", 0, nil, 1},
		{"fresh start, the others pending", 0, map[peerid.ID]Status{"b": {JoinAt: JoinPending}}, 1},
		{"fresh start, the others declared round 1", 0, map[peerid.ID]Status{"b": {JoinAt: 1}, "c": {JoinAt: 1}}, 1},
		{"resumed swarm, the others pending", 6, map[peerid.ID]Status{"b": {Version: 6, JoinAt: JoinPending}}, 7},
		{"resumed swarm, the others declared but not through a round", 6,
			map[peerid.ID]Status{"b": {Version: 6, JoinAt: 7}}, 7},
		{"running federation: join past its newest version", 4,
			map[peerid.ID]Status{"b": {Version: 10, JoinAt: 1}, "c": {Version: 9, JoinAt: 1}}, 10 + joinLead},
		{"caught up with the running peers", 10, map[peerid.ID]Status{"b": {Version: 10, JoinAt: 1}}, 10 + joinLead},
		{"peers that declare nothing are running", 0, map[peerid.ID]Status{"b": {Version: 5}}, 5 + joinLead},
		{"stopped and pending peers do not count", 2,
			map[peerid.ID]Status{"b": {Version: 50, Done: true}, "c": {Version: 40, JoinAt: JoinPending}, "d": {Version: 8, JoinAt: 1}}, 8 + joinLead},
		{"another joiner does not count", 2,
			map[peerid.ID]Status{"b": {Version: 3, JoinAt: 12}, "d": {Version: 9, JoinAt: 1}}, 9 + joinLead},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := joinRound(c.version, c.statuses); got != c.want {
				t.Fatalf("joinRound = %d, want %d", got, c.want)
			}
		})
	}
}

func TestAnyPending(t *testing.T) {
	if anyPending(map[peerid.ID]Status{"a": {JoinAt: 1}, "b": {JoinAt: JoinPending, Done: true}}) {
		t.Error("a declared and a stopped peer are not pending")
	}
	if !anyPending(map[peerid.ID]Status{"a": {JoinAt: 1}, "b": {JoinAt: JoinPending}}) {
		t.Error("a pending peer not seen")
	}
	if got := declared(map[peerid.ID]Status{"a": {JoinAt: 1}, "b": {JoinAt: JoinPending}, "c": {Version: 3}, "d": {JoinAt: 1, Done: true}}); got != 2 {
		t.Errorf("declared = %d, want 2 (a and c)", got)
	}
}

// TestPlanRoundGroups: a sample larger than the group size is split into
// bounded groups that every sampled peer derives alike; a sample that fits
// is one group.
func TestPlanRoundGroups(t *testing.T) {
	var members []peerid.ID
	for i := range 40 {
		members = append(members, peerid.ID(fmt.Sprintf("p%02d", i)))
	}
	groups := map[string][]peerid.ID{}
	for _, self := range members {
		p := planRound(1, 1, 16, self, 3, 2, members, members)
		if !p.join || len(p.group) > 16 || len(p.group) < 13 || !slices.Contains(p.group, self) {
			t.Fatalf("%s: group %v", self, p.group)
		}
		groups[fmt.Sprint(p.group)] = p.group
	}
	if len(groups) != 3 {
		t.Fatalf("40 peers in groups of ≤ 16: %d distinct groups, want 3", len(groups))
	}
	for _, g := range groups {
		for _, q := range g {
			if other := planRound(1, 1, 16, q, 3, 2, members, members).group; !slices.Equal(other, g) {
				t.Fatalf("%s puts itself in %v, a peer of its group in %v", q, other, g)
			}
		}
	}
	if p := planRound(1, 1, 16, "p00", 4, 3, members, members); slices.Equal(p.group, planRound(1, 1, 16, "p00", 3, 2, members, members).group) {
		t.Fatal("the same group two rounds running")
	}
	if p := planRound(1, 1, 0, "p00", 3, 2, members, members); !slices.Equal(p.group, members) {
		t.Fatalf("group size 0: group of %d, want all 40", len(p.group))
	}
	if p := planRound(1, 0.1, 16, "p00", 3, 2, members, members); p.join && !slices.Equal(p.group, p.sampled) {
		t.Fatalf("a sample of 4 is one group: %v vs %v", p.group, p.sampled)
	}
}

func TestPlanAlign(t *testing.T) {
	const r = 5
	sampled := pids("a", "b", "c")
	for _, c := range []struct {
		name     string
		versions map[peerid.ID]uint64
		want     alignPlan
	}{
		{"everyone at r−1", map[peerid.ID]uint64{"b": 4, "c": 4}, alignPlan{ready: true}},
		{"self's own version does not count", map[peerid.ID]uint64{"a": 0, "b": 4, "c": 4}, alignPlan{ready: true}},
		{"a laggard", map[peerid.ID]uint64{"b": 4, "c": 3}, alignPlan{}},
		{"a peer not heard of (or stopped)", map[peerid.ID]uint64{"b": 4}, alignPlan{}},
		{"a peer already past round r", map[peerid.ID]uint64{"b": 5, "c": 4}, alignPlan{fetch: pids("b"), ready: true}},
		{"peers past r and a laggard", map[peerid.ID]uint64{"b": 7, "c": 1}, alignPlan{fetch: pids("b")}},
		{"all past r", map[peerid.ID]uint64{"b": 6, "c": 5}, alignPlan{fetch: pids("b", "c"), ready: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := planAlign("a", r, sampled, c.versions)
			if !slices.Equal(got.fetch, c.want.fetch) || got.ready != c.want.ready {
				t.Fatalf("got %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestOvertaken(t *testing.T) {
	const r = 5
	group := pids("a", "b", "c")
	for _, c := range []struct {
		name     string
		versions map[peerid.ID]uint64
		want     []peerid.ID
	}{
		{"all in round r", map[peerid.ID]uint64{"b": 4, "c": 4}, nil},
		{"self past r does not count", map[peerid.ID]uint64{"a": 9, "b": 4, "c": 4}, nil},
		{"one finished r", map[peerid.ID]uint64{"b": 5, "c": 4}, pids("b")},
		{"the other half, rounds ahead", map[peerid.ID]uint64{"b": 30, "c": 31}, pids("b", "c")},
		{"behind or unknown", map[peerid.ID]uint64{"b": 1}, nil},
		{"a peer outside the group", map[peerid.ID]uint64{"b": 4, "c": 4, "d": 9}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := overtaken("a", r, group, c.versions); !slices.Equal(got, c.want) {
				t.Fatalf("got %v, want %v", got, c.want)
			}
		})
	}
}

// TestOvertakeWatch: a round is given up only after looks have seen
// peers past it without a break for the grace; a look that sees none
// starts the count again.
func TestOvertakeWatch(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	const grace = 1500 * time.Millisecond
	ahead := pids("b")
	for _, c := range []struct {
		name  string
		looks []time.Time
		seen  []bool // whether each look sees ahead
		want  []bool
	}{
		{"nobody ahead", []time.Time{ms(0), ms(2000)}, []bool{false, false}, []bool{false, false}},
		{"ahead for the grace", []time.Time{ms(0), ms(1000), ms(1500)}, []bool{true, true, true}, []bool{false, false, true}},
		{"a committing member, seen once", []time.Time{ms(0), ms(50), ms(1600)}, []bool{true, false, false}, []bool{false, false, false}},
		{"a break starts the count again", []time.Time{ms(0), ms(1000), ms(1100), ms(2000), ms(2600)}, []bool{true, false, true, true, true}, []bool{false, false, false, false, true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var w overtakeWatch
			for i, at := range c.looks {
				var a []peerid.ID
				if c.seen[i] {
					a = ahead
				}
				if got := w.look(at, a, grace); got != c.want[i] {
					t.Fatalf("look %d at %v: %v, want %v", i, at.Sub(t0), got, c.want[i])
				}
			}
		})
	}
}

func TestJudgeRound(t *testing.T) {
	failed := errors.New("round 3: all-reduce: stalled")
	for _, c := range []struct {
		name          string
		err           error
		synced, moved bool
		want          roundVerdict
	}{
		{"completed", nil, false, true, roundVerdict{reference: true, report: true}},
		{"took the others' result", nil, true, true, roundVerdict{report: true}},
		{"failed: previous state relabelled", failed, false, true, roundVerdict{failed: true, report: true, lost: true}},
		{"failed before any new state", failed, false, false, roundVerdict{failed: true}},
		{"diverged", ErrDiverged, false, false, roundVerdict{fatal: true}},
		{"diverged, wrapped", fmt.Errorf("step 3: %w", ErrDiverged), false, false, roundVerdict{fatal: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := judgeRound(c.err, c.synced, c.moved); got != c.want {
				t.Fatalf("got %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestFinalFrom(t *testing.T) {
	for _, c := range []struct {
		name     string
		self     peerid.ID
		members  []peerid.ID
		fraction float64
		want     []peerid.ID
	}{
		// Round 6 samples [a e] of five with C = 0.4, [a] of two with 0.5.
		{"the last round's other participants", "a", pids("a", "b", "c", "d", "e"), 0.4, pids("e")},
		{"alone in the last round: the other members", "a", pids("a", "b"), 0.5, pids("b")},
		{"alone", "a", pids("a"), 1, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := finalFrom(1, c.fraction, c.self, 6, c.members); !slices.Equal(got, c.want) {
				t.Fatalf("got %v, want %v", got, c.want)
			}
		})
	}
}

// TestProgressWatch: a wait spanning rounds goes on while the newest
// version grows, and ends patience after it last grew.
func TestProgressWatch(t *testing.T) {
	t0 := time.Unix(0, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	w := newProgressWatch(t0, 3)
	for _, l := range []struct {
		at      float64
		top     uint64
		stalled bool
	}{
		{1, 3, false},
		{2.9, 3, false},
		{2.95, 4, false}, // a round completed: the patience starts again
		{5.9, 4, false},
		{6, 5, false},
		{8.9, 2, false}, // a version lower than the newest is no progress
		{9, 5, true},
	} {
		if got := w.stalled(at(l.at), l.top, 3*time.Second); got != l.stalled {
			t.Fatalf("at %vs with top %d: stalled %v, want %v", l.at, l.top, got, l.stalled)
		}
	}
	if got := topVersion(map[peerid.ID]Status{"a": {Version: 7}, "b": {Version: 9, Done: true}, "c": {Version: 4}}); got != 7 {
		t.Fatalf("topVersion = %d, want 7 (the stopped peer's 9 does not count)", got)
	}
}

// TestPickSources: one attempt of a state fetch asks at most k peers, the
// known holders first (newest first), else others; failed attempts move
// on to peers not yet asked, and askers spread over the holders.
func TestPickSources(t *testing.T) {
	many := make([]peerid.ID, 256)
	for i := range many {
		many[i] = peerid.ID(fmt.Sprintf("p%03d", i))
	}
	for _, c := range []struct {
		name       string
		candidates []peerid.ID
		versions   map[peerid.ID]uint64
		tried      []peerid.ID
		k          int
		want       []peerid.ID // nil: check only the count and known
		n          int
		known      bool
	}{
		{"255 others, no holder known: k of them", many, nil, nil, 4, nil, 4, false},
		{"holders first, newest first", pids("self", "a", "b", "c", "d", "e", "f"),
			map[peerid.ID]uint64{"a": 2, "b": 7, "c": 6, "d": 5, "e": 5, "f": 9}, nil, 3, pids("f", "b", "c"), 3, true},
		{"only holders, even if fewer than k", pids("a", "b", "c"),
			map[peerid.ID]uint64{"a": 2, "b": 5}, nil, 3, pids("b"), 1, true},
		{"a tried holder is not asked again while others remain", pids("a", "b", "c"),
			map[peerid.ID]uint64{"a": 2, "b": 5}, pids("b"), 3, nil, 2, false},
		{"everyone tried: start over", pids("a", "b"),
			map[peerid.ID]uint64{"b": 5}, pids("a", "b"), 3, pids("b"), 1, true},
		{"self and duplicates are not asked", pids("self", "a", "a"), map[peerid.ID]uint64{"self": 9}, nil, 3, pids("a"), 1, false},
		{"nobody", pids("self"), nil, nil, 3, nil, 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			tried := map[peerid.ID]bool{}
			for _, p := range c.tried {
				tried[p] = true
			}
			got, known := pickSources(1, "self", 5, c.candidates, c.versions, tried, c.k)
			if len(got) != c.n || known != c.known || (c.want != nil && !slices.Equal(got, c.want)) {
				t.Fatalf("got %v known=%v, want %d peers %v known=%v", got, known, c.n, c.want, c.known)
			}
			for _, p := range got {
				if tried[p] && len(c.tried) < len(c.candidates) {
					t.Fatalf("asked %s again: %v", p, got)
				}
			}
		})
	}
	// 200 askers of one version held by 20 peers spread over them.
	versions := map[peerid.ID]uint64{}
	for _, p := range many[:20] {
		versions[p] = 5
	}
	load := map[peerid.ID]int{}
	for _, self := range many[56:] {
		ask, _ := pickSources(1, self, 5, many, versions, nil, 4)
		for _, p := range ask {
			load[p]++
		}
	}
	if len(load) != 20 {
		t.Fatalf("askers used %d of the 20 holders: %v", len(load), load)
	}
	for p, n := range load {
		if n > 80 { // 800 asks over 20 holders: 40 each on average
			t.Fatalf("%s asked %d times of 800: %v", p, n, load)
		}
	}
}
