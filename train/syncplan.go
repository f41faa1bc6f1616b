package train

import (
	"math"
	"slices"
	"time"

	"github.com/starling-ml/starling/peerid"
)

// A synchronous peer's protocol decisions, as functions of plain values:
// no Net, no context, no clock (the time of a look is passed in). Sync
// (sync.go) gathers their inputs, calls them, does the I/O they name and
// waits; its join deadline bounds those waits. docs/design.md gives the
// reasoning behind each decision.

// stopped reports whether st is the status of a peer that stopped training
// before the job's last step, steps: one to leave out of every group. A
// peer that finished the job is not stopped, whatever its Done says:
// latecomers fetch the final state from it.
func stopped(st Status, steps uint64) bool {
	return st.Done && st.Version < steps
}

// running reports whether st is the status of a peer that takes the job's
// steps: it neither waits to join nor stopped.
func running(st Status, steps uint64) bool {
	return st.JoinAt == 0 && !stopped(st, steps)
}

// lookPause is how long a joining peer waits before it looks at the
// others again when it has nothing to go on yet.
const lookPause = 100 * time.Millisecond

// staleStatuses is how long a peer left out of a step waits for fresher
// statuses from running peers that seem behind it: a few heartbeats
// (swarm's come every second).
const staleStatuses = 3 * time.Second

// joinView is what a peer (re)joining the job sees on one look.
type joinView struct {
	self    peerid.ID
	version uint64 // steps this peer applied
	steps   uint64 // the job's last step
	// left reports that this peer's last attempt failed: peers at its own
	// step may be ahead of it.
	left bool
	// lead is how far ahead, at the others' pace, it declares its step.
	lead time.Duration
	// groupSize and agreeEvery are SyncConfig's: a job of more running
	// peers than groupSize runs in bounded groups, and a peer joins it at
	// an agreement step, where the whole job all-reduces.
	groupSize, agreeEvery int
	members               []peerid.ID
	statuses              map[peerid.ID]Status // the others' (Net.Statuses)
	// now is the time of the look; until discover a peer that knows of
	// nobody waits for discovery, and until stale a peer that was left out
	// distrusts statuses that show running peers behind it.
	now, discover, stale time.Time
}

// joinAction is what a joining peer does next.
type joinAction uint8

const (
	// joinLook: nothing to go on yet; pause, then look again.
	joinLook joinAction = iota
	// joinStart: nobody is ahead; go on from this peer's own state with
	// group, the peers at its step.
	joinStart
	// joinDeclare: declare JoinAt at (Status.JoinAt) and fetch the state
	// after step at−1 from the peers ahead.
	joinDeclare
	// joinFinal: the join step would be past the job's last step; fetch the
	// final state (of step at) from the peers ahead instead.
	joinFinal
)

// joinPlan is a joining peer's decision on one look.
type joinPlan struct {
	action joinAction
	// pause is how long to wait before the next look (joinLook).
	pause time.Duration
	// group is the group of the next step, sorted, self included
	// (joinStart).
	group []peerid.ID
	// at is the declared step (joinDeclare) or the last step (joinFinal);
	// from lists the running peers ahead to fetch the state from, top the
	// most advanced one's step and rate the fastest pace among them (steps
	// per second); wait is how long the state may take to come.
	at   uint64
	from []peerid.ID
	top  uint64
	rate float64
	wait time.Duration
}

// planJoin decides a joining peer's next move on the look v.
func planJoin(v joinView) joinPlan {
	if len(v.statuses) == 0 && v.now.Before(v.discover) {
		return joinPlan{action: joinLook, pause: min(lookPause, v.discover.Sub(v.now))}
	}
	var run, ahead []peerid.ID
	var top uint64
	var rate float64
	for _, p := range v.members {
		ps, ok := v.statuses[p]
		if p == v.self || !ok || !running(ps, v.steps) {
			continue
		}
		run = append(run, p)
		if ps.Version > v.version || (v.left && ps.Version == v.version) {
			ahead = append(ahead, p)
			top = max(top, ps.Version)
			rate = max(rate, ps.Rate)
		}
	}
	if len(ahead) == 0 {
		if v.now.Before(v.stale) && len(run) == 0 && slices.ContainsFunc(v.members, func(p peerid.ID) bool {
			ps, ok := v.statuses[p]
			return ok && p < v.self && ps.JoinAt > 0 && !stopped(ps, v.steps)
		}) {
			// Joiners that missed each other (both left out of one step,
			// each waiting for the other's state) would start two jobs:
			// the lowest starts, the others wait for it and join it.
			return joinPlan{action: joinLook, pause: lookPause}
		}
		if v.left && v.now.Before(v.stale) && slices.ContainsFunc(run, func(p peerid.ID) bool { return v.statuses[p].Version < v.version }) {
			return joinPlan{action: joinLook, pause: lookPause}
		}
		g := []peerid.ID{v.self}
		for _, p := range run {
			if v.statuses[p].Version == v.version {
				g = append(g, p)
			}
		}
		slices.Sort(g)
		return joinPlan{action: joinStart, group: g}
	}
	p := joinPlan{from: ahead, top: top, rate: rate}
	T := top + 2 + uint64(math.Ceil(rate*v.lead.Seconds()))
	if v.groupSize > 0 && len(run)+1 > v.groupSize {
		T = nextAgree(T, v.agreeEvery)
	}
	if T > v.steps {
		p.action, p.at = joinFinal, v.steps
		p.wait = 4*v.lead + seconds(float64(v.steps-min(top, v.steps))/max(rate, 1))
		return p
	}
	p.action, p.at = joinDeclare, T
	// The running peers publish the state after step T−1 when they reach
	// it; a second more covers a state service's transfer.
	p.wait = 4 * v.lead
	if rate > 0 {
		p.wait = 2*v.lead + seconds(2*float64(T-top)/rate)
	}
	p.wait += time.Second
	return p
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// nextLead is the lead of the attempt after one that missed its step:
// doubled, up to 16 times base (SyncConfig.JoinLead).
func nextLead(lead, base time.Duration) time.Duration {
	return min(2*lead, 16*base)
}

// joinGroup returns the group of step at for self, which joined at it:
// every running peer that has started (Version > 0), the other joiners of
// at, and self; sorted.
func joinGroup(self peerid.ID, at, steps uint64, members []peerid.ID, statuses map[peerid.ID]Status) []peerid.ID {
	g := []peerid.ID{self}
	for _, p := range members {
		ps, ok := statuses[p]
		if !ok || p == self || stopped(ps, steps) {
			continue
		}
		if (ps.JoinAt == 0 && ps.Version > 0) || ps.JoinAt == at {
			g = append(g, p)
		}
	}
	slices.Sort(g)
	return g
}

// admission is a running peer's decision about the group of step next.
type admission struct {
	// group is the step's group: the last step's and the joiners, sorted.
	group []peerid.ID
	// joining lists the peers that declared they join at next, sorted; the
	// peer publishes the state the step starts from for them.
	joining []peerid.ID
	// ahead, if set, is a running peer outside the group already past
	// next, at step aheadAt: another group of the job is ahead, and this
	// one rejoins it instead of taking the step.
	ahead   peerid.ID
	aheadAt uint64
}

// admit decides the group of step next from group, the last step's, and
// what members and statuses show of the others.
func admit(next, steps uint64, group, members []peerid.ID, statuses map[peerid.ID]Status) admission {
	var a admission
	for _, p := range members {
		ps, ok := statuses[p]
		if !ok || slices.Contains(group, p) || stopped(ps, steps) {
			continue
		}
		switch {
		case ps.JoinAt == next:
			a.joining = append(a.joining, p)
		case ps.JoinAt == 0 && ps.Version > next:
			return admission{ahead: p, aheadAt: ps.Version}
		}
	}
	a.group = group
	if len(a.joining) > 0 {
		a.group = slices.Concat(group, a.joining)
		slices.Sort(a.group)
	}
	return a
}

// pace returns the pace, in steps per second, after a step applied at now,
// given rate, the pace before it, and last, when the previous step was
// applied (zero if none was): a moving average of the steps' intervals.
func pace(rate float64, last, now time.Time) float64 {
	if last.IsZero() {
		return rate
	}
	dt := now.Sub(last).Seconds()
	switch {
	case dt <= 0:
		return rate
	case rate == 0:
		return 1 / dt
	default:
		return 0.9*rate + 0.1/dt
	}
}

// groupedStep reports whether step next of a job whose group is group
// runs in bounded groups (SyncConfig.GroupSize): the group is larger than
// size and next is not an agreement step. Agreement steps, the first of
// every agreeEvery (1, 1+agreeEvery, …), all-reduce the whole group, and
// its votes settle, identically on every member, the set the following
// steps' groups are drawn from: views of the members differ between peers
// for a heartbeat or so, and groups drawn from different sets do not meet.
func groupedStep(next uint64, group []peerid.ID, size, agreeEvery int) bool {
	return size > 0 && len(group) > size && !agreeStep(next, agreeEvery)
}

// agreeStep reports whether step next is an agreement step.
func agreeStep(next uint64, agreeEvery int) bool {
	return agreeEvery <= 1 || (next-1)%uint64(agreeEvery) == 0
}

// nextAgree returns the first agreement step at or after step t.
func nextAgree(t uint64, agreeEvery int) uint64 {
	if agreeStep(t, agreeEvery) || t == 0 {
		return max(t, 1)
	}
	e := uint64(agreeEvery)
	return (t-1)/e*e + e + 1
}
