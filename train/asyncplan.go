package train

import (
	"errors"
	"time"

	"github.com/starling-ml/starling/compression"
	"github.com/starling-ml/starling/gossip/wire"
	"github.com/starling-ml/starling/peerid"
	"github.com/starling-ml/starling/staleness"
)

// The asynchronous strategies' protocol decisions (RunAsync: FedAsync and
// FedBuff), as functions of plain values: no AsyncNet, no context, no
// clock read (the time of a look is passed in). asyncPeer's goroutines
// look (an announcement, a fetched contribution, the versions, the time),
// call one of them and do what it says. docs/design.md gives the
// reasoning behind each.

// payloadPlan is what a peer's rounds publish and what it merges, fixed
// by its mode.
type payloadPlan struct {
	// kind is the payload kind the peer publishes and merges.
	kind wire.PayloadKind
	// delta: a round publishes its delta from the round's start, not the
	// model.
	delta bool
	// tick: the own round is an update of the model and ticks the local
	// version (FedAsync; FedBuff's version ticks at its server steps).
	tick bool
	// buffer: the own publication joins the own buffer (FedBuff).
	buffer bool
}

// planPayload returns the plan of mode; robust is FedBuff with a
// BufferRule other than the mean, whose votes are models.
func planPayload(mode string, robust bool) payloadPlan {
	switch {
	case mode == ModeFedAsync:
		return payloadPlan{kind: wire.KindModel, tick: true}
	case robust:
		return payloadPlan{kind: wire.KindModel, buffer: true}
	}
	return payloadPlan{kind: wire.KindDelta, delta: true, buffer: true}
}

// coalesce reports whether a newer announcement from a peer replaces its
// older one waiting to be pulled: when they carry models (FedAsync, robust
// FedBuff), which hold the older ones' work, not deltas, which do not.
func (p payloadPlan) coalesce() bool { return p.kind == wire.KindModel }

// nextRound returns how many local steps the next round trains after
// steps done in all: LocalSteps, or what is left of maxSteps (0: no
// limit); ok is false once maxSteps are done.
func nextRound(steps, localSteps, maxSteps int) (k int, ok bool) {
	if maxSteps <= 0 {
		return localSteps, true
	}
	if steps >= maxSteps {
		return 0, false
	}
	return min(localSteps, maxSteps-steps), true
}

// roundOver reports whether a round that has trained i of its k steps and
// lasted el ends: after k steps, or with roundTime > 0 once it has lasted
// that long (after one step at least). A round's end is a publication.
func roundOver(i, k int, el, roundTime time.Duration) bool {
	return i >= k || (i > 0 && roundTime > 0 && el >= roundTime)
}

// snapshotDue reports whether a Recorder snapshot is due at at, the last
// one taken at last: when forced, or every apart.
func snapshotDue(force bool, at, last, every time.Duration) bool {
	return force || at-last >= every
}

// gateWaits reports whether the SSP gate holds the next round at now: this
// peer is more than pol's bound ahead of the slowest peer vc counts (heard
// from within its TTL and not stalled). It never waits without a bound.
func gateWaits(pol staleness.Policy, vc *staleness.VersionClock, now time.Time) bool {
	return pol.Gate(vc.Lag(now)).Action == staleness.Wait
}

// bufferQuorum is how many peers' votes a robust FedBuff buffer waits for
// with live other peers: a strict majority of them and this one, so that
// a minority of liars is a minority of the votes however many models it
// floods.
func bufferQuorum(live int) int { return (live+1)/2 + 1 }

// screenView is what an announcement is screened against: this peer's
// settings and its local version when the announcement arrives.
type screenView struct {
	model      string
	kind       wire.PayloadKind
	dim        int
	local      uint64
	maxAhead   uint64
	localSteps int
	policy     staleness.Policy
}

// screening is the verdict on one announcement.
type screening struct {
	// pull: fetch it; otherwise it is dropped for drop.
	pull bool
	drop DropReason
	// tau is how far its base is behind the local version (0 if it is
	// not), for the drop's event.
	tau int
	// observe: its base is the sender's version for the SSP gate (the
	// version it works from, whether or not it is pulled).
	observe bool
}

// screen decides on announcement a before anything is fetched. It checks,
// in order, the model id, the payload kind, the length, the sequence
// number against the sender's replay window in seen (which it adds or
// updates), a base or version too far ahead (DropFuture: bogus), and a
// base beyond the SSP bound (DropStale: it would be rejected on arrival).
// A replayed announcement is not observed; one whose base is within
// MaxAhead is, even if it is then dropped.
func screen(a *wire.Announcement, v screenView, seen map[peerid.ID]*seqWindow) screening {
	var s screening
	if v.local > a.Base {
		s.tau = int(v.local - a.Base)
	}
	switch {
	case a.Model != v.model:
		s.drop = DropModel
		return s
	case a.Kind != v.kind:
		s.drop = DropKind
		return s
	case int(a.Elems) != v.dim:
		s.drop = DropShape
		return s
	}
	win := seen[a.Peer]
	if win == nil {
		win = &seqWindow{}
		seen[a.Peer] = win
	}
	if !win.admit(a.Seq) {
		s.drop = DropReplay
		return s
	}
	s.observe = a.Base <= v.local+v.maxAhead
	bound, bounded := v.policy.Bound()
	switch {
	case !s.observe || a.Version > v.local+v.maxAhead+uint64(v.localSteps)+1:
		s.drop = DropFuture
	case bounded && v.local > a.Base && v.local-a.Base > uint64(bound):
		s.drop = DropStale
	default:
		s.pull = true
	}
	return s
}

// seqWindow admits each sequence number of one sender once: numbers above
// the highest seen, or up to 64 below it if not seen yet (announcements
// may arrive out of order); everything else is a replay.
type seqWindow struct {
	top  uint64
	bits uint64 // bit i: top−i was seen
}

func (w *seqWindow) admit(seq uint64) bool {
	switch {
	case w.bits == 0 || seq > w.top:
		shift := seq - w.top
		if w.bits == 0 || shift >= 64 {
			w.bits = 1
		} else {
			w.bits = w.bits<<shift | 1
		}
		w.top = seq
		return true
	case w.top-seq >= 64:
		return false
	}
	bit := uint64(1) << (w.top - seq)
	if w.bits&bit != 0 {
		return false
	}
	w.bits |= bit
	return true
}

// mergeView is what a fetched contribution is merged against.
type mergeView struct {
	dim      int
	kind     wire.PayloadKind
	local    uint64
	maxAhead uint64
	// once: the contribution is another peer's model in FedAsync with
	// ClipFactor, merged at most once per own round and clipped first;
	// merged: a model of its sender was merged in this round already.
	once, merged bool
}

// mergePlan is the verdict on a fetched contribution before the
// staleness math (mergeOutcome) has its say.
type mergePlan struct {
	// merge: hand it to the mixer or buffer; otherwise it is dropped for
	// drop.
	merge bool
	drop  DropReason
	// advance: its base is ahead of the local version, within MaxAhead;
	// the local version moves to it (Lamport), merged or not.
	advance bool
	// clip: move it towards this peer's model first (FedAsync with
	// ClipFactor).
	clip bool
}

// planMerge decides on contribution c: its length and kind, a base beyond
// MaxAhead of the local version (DropFuture) or ahead within it (the
// version advances: the contribution is fresh), and, for a model merged
// once per round, a second one from the same sender (DropRepeat).
func planMerge(c *contribution, v mergeView) mergePlan {
	switch {
	case len(c.vec) != v.dim:
		return mergePlan{drop: DropShape}
	case c.kind != v.kind:
		return mergePlan{drop: DropKind}
	case c.base > v.local && c.base-v.local > v.maxAhead:
		return mergePlan{drop: DropFuture}
	}
	p := mergePlan{advance: c.base > v.local}
	if v.once && v.merged {
		p.drop = DropRepeat
		return p
	}
	p.merge, p.clip = true, v.once
	return p
}

// mergeOutcome says what became of a contribution the mixer or buffer
// took: merged (with decision d), or dropped and why.
func mergeOutcome(d staleness.Decision, err error) (DropReason, bool) {
	switch {
	case errors.Is(err, staleness.ErrShape):
		return DropShape, false
	case errors.Is(err, staleness.ErrNonFinite):
		return DropNonFinite, false
	case errors.Is(err, staleness.ErrFutureVersion):
		return DropFuture, false
	case err != nil:
		return DropDecode, false
	case d.Action != staleness.Accept:
		return DropStale, false
	}
	return 0, true
}

// decodeDrop is the drop reason of a fetched vector that would not
// decode.
func decodeDrop(err error) DropReason {
	if errors.Is(err, compression.ErrLength) {
		return DropShape
	}
	return DropDecode
}

// pullQueue holds screened announcements waiting to be pulled, oldest
// first, at most max of them (the oldest is dropped beyond it). With
// coalesce (payloadPlan.coalesce), at most one announcement per peer
// waits: a newer one takes the older one's place in the queue. Not safe
// for concurrent use (sharedPullQueue is).
type pullQueue struct {
	items    []*wire.Announcement
	byPeer   map[peerid.ID]*wire.Announcement
	coalesce bool
	max      int
}

func newPullQueue(coalesce bool, max int) pullQueue {
	return pullQueue{byPeer: make(map[peerid.ID]*wire.Announcement), coalesce: coalesce, max: max}
}

// push queues a and returns the announcement it displaced, if any, and
// why (DropSuperseded, DropOverflow).
func (q *pullQueue) push(a *wire.Announcement) (*wire.Announcement, DropReason) {
	if q.coalesce {
		if old := q.byPeer[a.Peer]; old != nil {
			prev := *old
			*old = *a // keeps the older one's place
			return &prev, DropSuperseded
		}
		q.byPeer[a.Peer] = a
	}
	q.items = append(q.items, a)
	if len(q.items) <= q.max {
		return nil, 0
	}
	d, _ := q.pop()
	return d, DropOverflow
}

// pop takes the oldest announcement, if any.
func (q *pullQueue) pop() (*wire.Announcement, bool) {
	if len(q.items) == 0 {
		return nil, false
	}
	a := q.items[0]
	q.items = q.items[1:]
	if q.byPeer[a.Peer] == a {
		delete(q.byPeer, a.Peer)
	}
	return a, true
}

// len returns the number of announcements waiting.
func (q *pullQueue) len() int { return len(q.items) }

// farSources bounds the peers a FedAsync peer pulls models from that it
// had no connection with: a pull from such a peer dials it, and with
// every peer pulling every announced model, n peers opened about n²
// connections (each with identify and a GossipSub handshake; 4 GiB at
// 256 simulated peers). Peers it is connected to (GossipSub keeps a few
// dozen at most) are pulled from freely; other peers take one of max
// slots, kept while the peer announces or stays connected. Announcements
// of every peer still reach screen and the version clock, so the
// staleness of what is pulled is measured as before. Not safe for
// concurrent use (the receiver goroutine owns it).
type farSources struct {
	max  int                     // slots; < 0: no bound
	ttl  time.Duration           // a slot whose peer is silent and unconnected this long is freed
	last map[peerid.ID]time.Time // slot holders and when each last announced
}

func newFarSources(max int, ttl time.Duration) *farSources {
	return &farSources{max: max, ttl: ttl, last: map[peerid.ID]time.Time{}}
}

// admit reports whether to pull src's announcement, seen at now;
// connected says which peers this host has a connection with now. A
// slot holder or a connected peer is pulled; another peer takes a free
// slot, or the slot of a holder that is neither connected nor heard from
// within ttl (dead, or its connection trimmed while it was silent), or
// is not pulled.
func (f *farSources) admit(src peerid.ID, now time.Time, connected func(peerid.ID) bool) bool {
	if f.max < 0 {
		return true
	}
	if _, ok := f.last[src]; ok {
		f.last[src] = now
		return true
	}
	if connected(src) {
		return true
	}
	if len(f.last) >= f.max {
		for p, t := range f.last {
			if now.Sub(t) >= f.ttl && !connected(p) {
				delete(f.last, p)
			}
		}
	}
	if len(f.last) >= f.max {
		return false
	}
	f.last[src] = now
	return true
}
