package train

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/starling-ml/starling/peerid"
	"github.com/starling-ml/starling/staleness"
)

func TestExchangeClock(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name   string
		every  int
		period time.Duration
		steps  []int  // when each local step ends, in ms
		want   string // x: an exchange is due after that step
	}{
		{"every step", 1, 0, []int{0, 0, 0, 0}, "xxxx"},
		{"every 3 steps", 3, 0, []int{0, 1, 2, 3, 4, 5, 6}, "..x..x."},
		{"a period of 10 ms on 4 ms steps", 1, 10 * time.Millisecond, []int{4, 8, 12, 16, 20, 24, 28, 32, 36}, "x..x..x.."},
		{"both: 2 steps and 10 ms", 2, 10 * time.Millisecond, []int{1, 2, 3, 4, 5, 11, 12, 13, 21, 22}, ".x....x..x"},
		{"a straggler's 50 ms steps: every step", 1, 10 * time.Millisecond, []int{50, 100, 150}, "xxx"},
	} {
		clock := exchangeClock{every: c.every, period: c.period}
		got := ""
		for _, ms := range c.steps {
			if clock.step(t0.Add(time.Duration(ms) * time.Millisecond)) {
				got += "x"
			} else {
				got += "."
			}
		}
		if got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
}

func TestPlanSwap(t *testing.T) {
	all := func(n int) []bool {
		a := make([]bool, n)
		for i := range a {
			a[i] = true
		}
		return a
	}
	dead := func(n int, gone ...int) []bool {
		a := all(n)
		for _, i := range gone {
			a[i] = false
		}
		return a
	}
	for _, c := range []struct {
		name  string
		due   bool
		alive []bool
		want  gossipPlan
	}{
		{"not due", false, nil, gossipPlan{}},
		{"alone", true, all(1), gossipPlan{act: gossipSkip}},
		{"one passive", true, all(2), gossipPlan{act: gossipExchange, partner: 1}},
		{"the passive is dead", true, dead(2, 1), gossipPlan{act: gossipSkip}},
		{"every passive is dead", true, dead(8, 1, 3, 5, 7), gossipPlan{act: gossipSkip}},
		{"one passive alive of two", true, dead(4, 1), gossipPlan{act: gossipExchange, partner: 3}},
		{"a dead active does not matter", true, dead(3, 2), gossipPlan{act: gossipExchange, partner: 1}},
	} {
		rng := rand.New(rand.NewPCG(1, 1))
		if got := planSwap(c.due, rng, len(c.alive), c.alive); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
	// A random group: a partner is always a live passive peer, and every
	// live passive peer is drawn.
	rng := rand.New(rand.NewPCG(3, 4))
	alive := dead(10, 3, 7, 4)
	drawn := map[int]int{}
	for range 2000 {
		p := planSwap(true, rng, len(alive), alive)
		if p.act == gossipExchange && (p.partner%2 != 1 || !alive[p.partner]) {
			t.Fatalf("plan %+v with alive %v", p, alive)
		}
		drawn[p.partner]++
	}
	if drawn[1] == 0 || drawn[5] == 0 || drawn[9] == 0 || drawn[1]+drawn[5]+drawn[9] < 1990 {
		t.Fatalf("partners drawn %v, want 1, 5 and 9", drawn)
	}
}

func TestPlanPush(t *testing.T) {
	all := []bool{true, true, true, true, true, true, true, true}
	for _, c := range []struct {
		name   string
		due    bool
		me, n  int
		k      uint64
		weight float64
		alive  []bool
		want   gossipPlan
	}{
		{"not due", false, 0, 8, 5, 1, nil, gossipPlan{k: 5}},
		{"offset 1", true, 0, 8, 0, 1, all, gossipPlan{act: gossipExchange, partner: 1, k: 1}},
		{"offset 2", true, 0, 8, 1, 1, all, gossipPlan{act: gossipExchange, partner: 2, k: 2}},
		{"offset 4", true, 0, 8, 2, 1, all, gossipPlan{act: gossipExchange, partner: 4, k: 3}},
		{"offsets cycle", true, 0, 8, 3, 1, all, gossipPlan{act: gossipExchange, partner: 1, k: 4}},
		{"wraps around", true, 6, 8, 1, 1, all, gossipPlan{act: gossipExchange, partner: 0, k: 2}},
		{"a dead out-neighbour: the next offset", true, 0, 8, 0, 1,
			[]bool{true, false, true, true, true, true, true, true}, gossipPlan{act: gossipExchange, partner: 2, k: 2}},
		{"every out-neighbour dead: each offset tried once", true, 0, 8, 0, 1,
			[]bool{true, false, false, true, false, true, true, true}, gossipPlan{act: gossipSkip, k: 3}},
		{"weight below the floor keeps its mass", true, 0, 8, 7, minPushWeight / 2, all, gossipPlan{act: gossipSkip, k: 7}},
		{"weight at the floor pushes", true, 0, 8, 0, minPushWeight, all, gossipPlan{act: gossipExchange, partner: 1, k: 1}},
		{"three peers", true, 2, 3, 1, 1, []bool{true, true, true}, gossipPlan{act: gossipExchange, partner: 1, k: 2}},
		{"alone", true, 0, 1, 0, 1, []bool{true}, gossipPlan{act: gossipSkip}},
	} {
		if got := planPush(c.due, c.me, c.n, c.k, c.weight, c.alive); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

func TestServeBudget(t *testing.T) {
	for _, c := range []struct{ trained, want time.Duration }{
		{0, time.Minute},
		{5 * time.Second, time.Minute},
		{6 * time.Second, time.Minute},
		{10 * time.Second, 100 * time.Second},
		{time.Hour, 10 * time.Hour},
	} {
		if got := serveBudget(c.trained); got != c.want {
			t.Errorf("serveBudget(%v) = %v, want %v", c.trained, got, c.want)
		}
	}
	if got := serveStall(5 * time.Second); got != 8*time.Second {
		t.Errorf("serveStall(5s) = %v", got)
	}
}

// TestKeepServing walks a finished passive peer (MaxSteps 80, exchange
// timeout 5 s) through the counts of two active peers: it serves while
// one is short of 80 and counting, not for one that is done, dead, stuck
// or creeping without growing.
func TestKeepServing(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	counts := staleness.NewVersionClock(0, 0)
	counts.SetStall(serveStall(5 * time.Second))
	a := func(steps int) activeCount { return activeCount{id: "a0", steps: steps, ok: true} }
	b := func(steps int) activeCount { return activeCount{id: "a2", steps: steps, ok: true} }
	gone := func(id peerid.ID) activeCount { return activeCount{id: id} }
	for _, s := range []struct {
		name    string
		at      time.Duration
		actives []activeCount
		want    bool
	}{
		{"no active has a count", 0, []activeCount{gone("a0"), gone("a2")}, false},
		{"one on its way", 0, []activeCount{a(40), gone("a2")}, true},
		{"both on their way", time.Second, []activeCount{a(50), b(10)}, true},
		{"a done, b on its way", 2 * time.Second, []activeCount{a(80), b(20)}, true},
		{"b stuck at 20, within the stall", 9 * time.Second, []activeCount{a(80), b(20)}, true},
		{"b stuck for the stall: no longer waited for", 10 * time.Second, []activeCount{a(80), b(20)}, false},
		{"b counts again", 12 * time.Second, []activeCount{a(80), b(21)}, true},
		{"b creeps back and forth", 15 * time.Second, []activeCount{a(80), b(20)}, true},
		{"without passing its highest count", 19 * time.Second, []activeCount{a(80), b(21)}, true},
		{"for the stall", 20 * time.Second, []activeCount{a(80), b(20)}, false},
		{"b moves on", 21 * time.Second, []activeCount{a(80), b(30)}, true},
		{"b dies", 22 * time.Second, []activeCount{a(80), gone("a2")}, false},
		{"b is back (a restart)", 23 * time.Second, []activeCount{a(80), b(5)}, true},
		{"both done", 24 * time.Second, []activeCount{a(80), b(80)}, false},
		{"past MaxSteps", 25 * time.Second, []activeCount{a(90), b(81)}, false},
	} {
		if got := keepServing(counts, s.actives, t0.Add(s.at), 80); got != s.want {
			t.Errorf("%s: keepServing = %v, want %v", s.name, got, s.want)
		}
	}
}
