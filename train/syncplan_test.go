package train

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/starling-ml/starling/peerid"
)

func TestStoppedAndRunning(t *testing.T) {
	const steps = 100
	for _, c := range []struct {
		name             string
		st               Status
		stopped, running bool
	}{
		{"running", Status{Version: 40}, false, true},
		{"not started", Status{}, false, true},
		{"joining", Status{JoinAt: 50}, false, false},
		{"stopped early", Status{Version: 40, Done: true}, true, false},
		{"finished, saying Done anyway", Status{Version: steps, Done: true}, false, true},
	} {
		if got := stopped(c.st, steps); got != c.stopped {
			t.Errorf("%s: stopped %v, want %v", c.name, got, c.stopped)
		}
		if got := running(c.st, steps); got != c.running {
			t.Errorf("%s: running %v, want %v", c.name, got, c.running)
		}
	}
}

func TestPlanJoin(t *testing.T) {
	t0 := time.Unix(1000, 0)
	const lead = 2 * time.Second
	// base is a look of "me" at step 10 of a 1000-step job, after the
	// discovery wait and the stale-status wait.
	base := func() joinView {
		return joinView{self: "me", version: 10, steps: 1000, lead: lead, now: t0,
			discover: t0.Add(-time.Second), stale: t0.Add(-time.Second)}
	}
	look := func(mut func(v *joinView), members []peerid.ID, statuses map[peerid.ID]Status) joinView {
		v := base()
		v.members = append(members, "me")
		slices.Sort(v.members)
		v.statuses = statuses
		if mut != nil {
			mut(&v)
		}
		return v
	}
	for _, c := range []struct {
		name string
		view joinView
		want joinPlan
	}{
		{"nobody known yet: wait for discovery",
			look(func(v *joinView) { v.discover = t0.Add(time.Second) }, nil, nil),
			joinPlan{action: joinLook, pause: 100 * time.Millisecond}},
		{"nobody known, discovery almost over",
			look(func(v *joinView) { v.discover = t0.Add(30 * time.Millisecond) }, nil, nil),
			joinPlan{action: joinLook, pause: 30 * time.Millisecond}},
		{"nobody after discovery: start alone",
			look(nil, nil, nil),
			joinPlan{action: joinStart, group: pids("me")}},
		{"a fresh job: start with the peers at my step",
			look(func(v *joinView) { v.version = 0; v.discover = t0.Add(time.Second) },
				pids("a", "b"), map[peerid.ID]Status{"a": {}, "b": {}}),
			joinPlan{action: joinStart, group: pids("a", "b", "me")}},
		{"a lower joiner and nobody running, fresh statuses: wait for it to start",
			look(func(v *joinView) { v.stale = t0.Add(time.Second) }, pids("b", "x"), map[peerid.ID]Status{
				"b": {JoinAt: 117}, "x": {JoinAt: 117}}),
			joinPlan{action: joinLook, pause: lookPause}},
		{"only higher joiners, fresh statuses: start, they join me",
			look(func(v *joinView) { v.stale = t0.Add(time.Second) }, pids("x"), map[peerid.ID]Status{"x": {JoinAt: 117}}),
			joinPlan{action: joinStart, group: pids("me")}},
		{"peers at my step; joiners, stopped and behind ones left out",
			look(nil, pids("a", "b", "c", "d", "e"), map[peerid.ID]Status{
				"a": {Version: 10}, "b": {JoinAt: 30}, "c": {Version: 8, Done: true}, "d": {Version: 7}, "e": {Version: 10}}),
			joinPlan{action: joinStart, group: pids("a", "e", "me")}},
		{"a member without a status, a status without membership",
			look(nil, pids("a"), map[peerid.ID]Status{"x": {Version: 50}}),
			joinPlan{action: joinStart, group: pids("me")}},
		{"late joiner: declare a step ahead of the running peers",
			look(nil, pids("a", "b"), map[peerid.ID]Status{"a": {Version: 20, Rate: 10}, "b": {Version: 19, Rate: 8}}),
			// T = 20 + 2 + 10/s·2 s; wait 2·2 s + 2·22/10 s + 1 s.
			joinPlan{action: joinDeclare, at: 42, from: pids("a", "b"), top: 20, rate: 10, wait: 9400 * time.Millisecond}},
		{"late joiner, pace unknown",
			look(nil, pids("a"), map[peerid.ID]Status{"a": {Version: 20}}),
			joinPlan{action: joinDeclare, at: 22, from: pids("a"), top: 20, wait: 4*lead + time.Second}},
		{"ahead peers only: stopped and joining ones are not",
			look(nil, pids("a", "b", "c"), map[peerid.ID]Status{"a": {Version: 20}, "b": {Version: 30, Done: true}, "c": {JoinAt: 40}}),
			joinPlan{action: joinDeclare, at: 22, from: pids("a"), top: 20, wait: 4*lead + time.Second}},
		{"past the job's last step: fetch the final state",
			look(nil, pids("a"), map[peerid.ID]Status{"a": {Version: 990, Rate: 10}}),
			// 990 + 2 + 20 > 1000; wait 4·2 s + 10 steps at 10/s.
			joinPlan{action: joinFinal, at: 1000, from: pids("a"), top: 990, rate: 10, wait: 9 * time.Second}},
		{"the job is over: the finished peers have its final state",
			look(nil, pids("a"), map[peerid.ID]Status{"a": {Version: 1000, Done: true}}),
			joinPlan{action: joinFinal, at: 1000, from: pids("a"), top: 1000, wait: 4 * lead}},
		{"left out of a step: peers at my step may be ahead",
			look(func(v *joinView) { v.left = true }, pids("a"), map[peerid.ID]Status{"a": {Version: 10, Rate: 5}}),
			joinPlan{action: joinDeclare, at: 22, from: pids("a"), top: 10, rate: 5, wait: 2*lead + 4800*time.Millisecond + time.Second}},
		{"left out, running peers behind: their statuses may be stale",
			look(func(v *joinView) { v.left = true; v.stale = t0.Add(time.Second) }, pids("a"), map[peerid.ID]Status{"a": {Version: 9}}),
			joinPlan{action: joinLook, pause: 100 * time.Millisecond}},
		{"left out, running peers still behind after the wait: go on",
			look(func(v *joinView) { v.left = true }, pids("a", "b"), map[peerid.ID]Status{"a": {Version: 9}, "b": {JoinAt: 12}}),
			joinPlan{action: joinStart, group: pids("me")}},
		{"after a missed step the lead is longer",
			look(func(v *joinView) { v.lead = 4 * lead }, pids("a"), map[peerid.ID]Status{"a": {Version: 20, Rate: 8}}),
			// T = 20 + 2 + 8/s·8 s; wait 2·8 s + 2·66/8 s + 1 s.
			joinPlan{action: joinDeclare, at: 86, from: pids("a"), top: 20, rate: 8, wait: 33500 * time.Millisecond}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := planJoin(c.view)
			if got.action != c.want.action || got.pause != c.want.pause || !slices.Equal(got.group, c.want.group) ||
				got.at != c.want.at || !slices.Equal(got.from, c.want.from) || got.top != c.want.top || got.rate != c.want.rate || got.wait != c.want.wait {
				t.Fatalf("got  %+v\nwant %+v", got, c.want)
			}
		})
	}
}

func TestNextLead(t *testing.T) {
	lead, base := time.Second, time.Second
	var got []time.Duration
	for range 6 {
		lead = nextLead(lead, base)
		got = append(got, lead)
	}
	if want := []time.Duration{2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 16 * time.Second, 16 * time.Second}; !slices.Equal(got, want) {
		t.Fatalf("leads %v, want %v", got, want)
	}
}

func TestJoinGroup(t *testing.T) {
	members := pids("a", "b", "c", "d", "e", "f", "me")
	statuses := map[peerid.ID]Status{
		"a": {Version: 41},             // running
		"b": {JoinAt: 42},              // joins with us
		"c": {JoinAt: 50},              // joins later
		"d": {},                        // has not started
		"e": {Version: 30, Done: true}, // stopped
		"x": {Version: 41},             // not a member
	}
	if got, want := joinGroup("me", 42, 1000, members, statuses), pids("a", "b", "me"); !slices.Equal(got, want) {
		t.Fatalf("group %v, want %v", got, want)
	}
}

func TestAdmit(t *testing.T) {
	const next, steps = 21, 1000
	group := pids("a", "me")
	for _, c := range []struct {
		name     string
		members  []peerid.ID
		statuses map[peerid.ID]Status
		want     admission
	}{
		{"nobody new", pids("a", "me"), map[peerid.ID]Status{"a": {Version: 20}},
			admission{group: group}},
		{"joiners of this step", pids("a", "c", "d", "e", "me"),
			map[peerid.ID]Status{"a": {Version: 20}, "c": {JoinAt: next}, "d": {JoinAt: next + 5}, "e": {JoinAt: next, Version: 3, Done: true}},
			admission{group: pids("a", "c", "me"), joining: pids("c")}},
		{"a group ahead of ours", pids("a", "b", "c", "me"),
			map[peerid.ID]Status{"a": {Version: 30}, "b": {JoinAt: next}, "c": {Version: 25}},
			admission{ahead: "c", aheadAt: 25}},
		{"peers outside our group, not ahead", pids("a", "b", "c", "me"),
			map[peerid.ID]Status{"a": {Version: 20}, "b": {Version: next}, "c": {Version: 40, Done: true}},
			admission{group: group}},
		{"a joiner that is no longer a member", pids("a", "me"),
			map[peerid.ID]Status{"a": {Version: 20}, "c": {JoinAt: next}},
			admission{group: group}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := admit(next, steps, group, c.members, c.statuses)
			if !slices.Equal(got.group, c.want.group) || !slices.Equal(got.joining, c.want.joining) || got.ahead != c.want.ahead || got.aheadAt != c.want.aheadAt {
				t.Fatalf("got %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestPace(t *testing.T) {
	t0 := time.Unix(1000, 0)
	for _, c := range []struct {
		name      string
		rate      float64
		last, now time.Time
		want      float64
	}{
		{"first step", 0, time.Time{}, t0, 0},
		{"second step", 0, t0, t0.Add(100 * time.Millisecond), 10},
		{"a moving average", 10, t0, t0.Add(50 * time.Millisecond), 11},
		{"no time passed", 10, t0, t0, 10},
	} {
		if got := pace(c.rate, c.last, c.now); got != c.want {
			t.Errorf("%s: pace %v, want %v", c.name, got, c.want)
		}
	}
}

func TestGroupedSteps(t *testing.T) {
	var twenty []peerid.ID
	for i := range 20 {
		twenty = append(twenty, peerid.ID(fmt.Sprintf("p%02d", i)))
	}
	for _, c := range []struct {
		next        uint64
		group       []peerid.ID
		size, every int
		want        bool
	}{
		{1, twenty, 8, 10, false},  // agreement step
		{2, twenty, 8, 10, true},   // bounded
		{10, twenty, 8, 10, true},  //
		{11, twenty, 8, 10, false}, // agreement step
		{2, twenty, 20, 10, false}, // fits one group
		{2, twenty, 0, 10, false},  // no bound
		{2, twenty, 8, 1, false},   // every step agrees
	} {
		if got := groupedStep(c.next, c.group, c.size, c.every); got != c.want {
			t.Errorf("groupedStep(%d, %d peers, size %d, every %d) = %v", c.next, len(c.group), c.size, c.every, got)
		}
	}
	for _, c := range []struct {
		t    uint64
		e    int
		want uint64
	}{{0, 10, 1}, {1, 10, 1}, {2, 10, 11}, {11, 10, 11}, {12, 10, 21}, {7, 1, 7}, {20, 20, 21}} {
		if got := nextAgree(c.t, c.e); got != c.want {
			t.Errorf("nextAgree(%d, %d) = %d, want %d", c.t, c.e, got, c.want)
		}
	}
	// A joiner of a job in bounded groups declares an agreement step.
	statuses := map[peerid.ID]Status{}
	for _, p := range twenty {
		statuses[p] = Status{Version: 40, Rate: 1}
	}
	t0 := time.Unix(1000, 0)
	v := joinView{self: "me", version: 0, steps: 1000, lead: 2 * time.Second, members: append(slices.Clone(twenty), "me"),
		statuses: statuses, now: t0, groupSize: 8, agreeEvery: 10}
	if p := planJoin(v); p.action != joinDeclare || p.at != 51 {
		t.Errorf("joiner of 20 peers in groups of 8: %+v, want to declare step 51", p)
	}
	v.groupSize = 0
	if p := planJoin(v); p.action != joinDeclare || p.at != 44 {
		t.Errorf("joiner without bounded groups: %+v, want to declare step 44", p)
	}
}
