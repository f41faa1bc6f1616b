package train

import (
	"math/rand/v2"
	"time"

	"github.com/starling-ml/starling/gossip/average"
	"github.com/starling-ml/starling/peerid"
	"github.com/starling-ml/starling/staleness"
)

// The gossip-averaging strategies' protocol decisions (RunGossip: AD-PSGD
// and SGP), as functions of plain values: no GossipNet, no context, no
// clock read (the time of a look is passed in). gossipRun looks (which
// peers are alive, their step counts, the time), calls one of them and
// does the exchange or the wait it names. docs/design.md gives the
// reasoning behind each.

// exchangeClock says when an exchange is due: every Every local steps,
// and no sooner than Period after the last one this peer started.
type exchangeClock struct {
	every  int
	period time.Duration
	steps  int       // local steps since the last exchange started
	last   time.Time // when it started (zero: never)
}

// step counts a local step done at now and reports whether an exchange is
// due; if so, the clock starts counting towards the next one.
func (c *exchangeClock) step(now time.Time) bool {
	c.steps++
	if c.steps < c.every || (!c.last.IsZero() && now.Sub(c.last) < c.period) {
		return false
	}
	c.steps, c.last = 0, now
	return true
}

// gossipAction is what a gossip peer does after a local step.
type gossipAction uint8

const (
	gossipNone     gossipAction = iota // no exchange is due
	gossipSkip                         // one is due but cannot be made (GossipSummary.Skipped)
	gossipExchange                     // exchange with gossipPlan.partner
)

// gossipPlan is a gossip peer's decision after a local step.
type gossipPlan struct {
	act     gossipAction
	partner int // index into the group, with gossipExchange
	// k is SGP's count of out-neighbours tried, after this decision; the
	// push carries it as its step.
	k uint64
}

// planSwap is an AD-PSGD active peer's decision, with due from its
// exchangeClock: a passive partner drawn uniformly with rng among the n
// peers of the group, redrawn while it is not alive (up to n draws), or a
// skip when none is.
func planSwap(due bool, rng *rand.Rand, n int, alive []bool) gossipPlan {
	if !due {
		return gossipPlan{}
	}
	for range n {
		j := average.PickPassive(rng, n)
		if j < 0 {
			break
		}
		if alive[j] {
			return gossipPlan{act: gossipExchange, partner: j}
		}
	}
	return gossipPlan{act: gossipSkip}
}

// minPushWeight is the push-sum weight below which a peer stops pushing
// and keeps its mass (the mean weight over the peers is 1).
const minPushWeight = 1.0 / 64

// planPush is SGP peer me's decision, with due from its exchangeClock,
// its push-sum weight and k out-neighbours tried so far: a skip when the
// weight is below minPushWeight, else the next live out-neighbour of the
// time-varying exponential graph over the n peers (one offset per k,
// each offset tried once), or a skip when none is alive.
func planPush(due bool, me, n int, k uint64, weight float64, alive []bool) gossipPlan {
	switch {
	case !due:
		return gossipPlan{k: k}
	case weight < minPushWeight:
		return gossipPlan{act: gossipSkip, k: k}
	}
	for range average.ExpGraphOffsets(n) {
		j := average.ExpGraphPeer(me, n, k)
		k++
		if alive[j] {
			return gossipPlan{act: gossipExchange, partner: j, k: k}
		}
	}
	return gossipPlan{act: gossipSkip, k: k}
}

// serveMin is the least time a finished AD-PSGD passive peer may wait for
// the active ones (serveBudget).
const serveMin = time.Minute

// serveBudget is how long a passive peer that trained for trained may
// stay in the exchange for the active peers: 10× that, serveMin at least.
func serveBudget(trained time.Duration) time.Duration { return max(serveMin, 10*trained) }

// serveStall is how long an active peer's step count may stay put before
// a serving passive peer no longer waits for it (it is stuck, gone or
// lying): the exchange timeout and 3 s for heartbeats to carry a count.
func serveStall(timeout time.Duration) time.Duration { return timeout + 3*time.Second }

// activeCount is an active peer's progress as a passive peer sees it.
type activeCount struct {
	id    peerid.ID
	steps int
	ok    bool // it is alive and has announced a count
}

// keepServing records the actives' counts at now in counts (a
// VersionClock whose stall is serveStall; a peer without a count is
// forgotten) and reports whether one of them is still on its way to
// maxSteps: a finished passive peer then stays in the exchange.
func keepServing(counts *staleness.VersionClock, actives []activeCount, now time.Time, maxSteps int) bool {
	for _, a := range actives {
		if a.ok {
			counts.Observe(a.id.String(), staleness.Version(a.steps), now)
		} else {
			counts.Forget(a.id.String())
		}
	}
	_, v, ok := counts.Slowest(now)
	return ok && v < staleness.Version(maxSteps)
}
