package train

import (
	"cmp"
	"errors"
	"slices"
	"time"

	"github.com/starling-ml/starling/aggregate"
	"github.com/starling-ml/starling/device"
	"github.com/starling-ml/starling/peerid"
)

// A federated peer's protocol decisions, as functions of plain values: no
// Net, no context, no clock. Federated (federated.go) gathers their inputs
// (members, statuses, its version), calls them, does the I/O they name and
// waits; its deadlines bound those waits. docs/design.md gives the
// reasoning behind each decision.

// quorate reports whether members hold a strict majority of ref, the
// membership of the last round this peer completed, less the peers in
// departed other than self; an empty ref is no constraint. A peer that is
// not quorate waits for the majority instead of training rounds of its
// own.
func quorate(self peerid.ID, departed map[peerid.ID]bool, members, ref []peerid.ID) bool {
	in, total := tally(self, departed, members, ref)
	return total == 0 || 2*in > total
}

// tally returns how many of ref, less the peers that announced their
// departure, there are (total) and how many of them are among members (in).
func tally(self peerid.ID, departed map[peerid.ID]bool, members, ref []peerid.ID) (in, total int) {
	for _, p := range ref {
		if p != self && departed[p] {
			continue
		}
		total++
		if slices.Contains(members, p) {
			in++
		}
	}
	return in, total
}

// noteDepartures records in departed the peers whose status says Done and
// forgets those whose status no longer does (they came back). A peer
// missing from statuses keeps its entry: a stopped peer's status goes once
// its announcements end, and it must still not count towards a majority.
func noteDepartures(departed map[peerid.ID]bool, statuses map[peerid.ID]Status) {
	for p, st := range statuses {
		if st.Done {
			departed[p] = true
		} else {
			delete(departed, p)
		}
	}
}

// liveVersions returns the version of each peer in statuses that did not
// stop.
func liveVersions(statuses map[peerid.ID]Status) map[peerid.ID]uint64 {
	out := make(map[peerid.ID]uint64, len(statuses))
	for p, st := range statuses {
		if !st.Done {
			out[p] = st.Version
		}
	}
	return out
}

// admitted returns the members that take part in round r: members less
// the peers whose status says they join later (JoinAt > r, JoinPending
// included), self judged by selfJoin (its own JoinAt). Every peer that
// heard the same declarations derives the same set, so a (re)joining peer
// enters the rounds of all the others at the same round boundary instead
// of the group each forms from its heartbeat view.
func admitted(self peerid.ID, selfJoin, r uint64, members []peerid.ID, statuses map[peerid.ID]Status) []peerid.ID {
	out := make([]peerid.ID, 0, len(members))
	for _, p := range members {
		at := statuses[p].JoinAt
		if p == self {
			at = selfJoin
		}
		if at <= r {
			out = append(out, p)
		}
	}
	return out
}

// joinLead is how many rounds past the newest version it sees a peer
// joining a running federation declares: the others are in round top+1;
// a peer that finished it as the joiner looked (its status on the way)
// may already have formed round top+2's group, so the first round that
// every running peer forms after hearing the declaration is top+3.
const joinLead = 3

// joinRound returns the first round a starting peer at version takes part
// in, given the others' statuses. A running peer is one that is neither
// stopped nor pending and has completed the first round it declared (or
// declares none). With no running peer, or at a fresh start (nobody, this
// peer included, has a version yet), it is version+1: it founds the
// federation with the peers starting beside it, which wait for each
// other's declarations (anyPending) before their first round. Otherwise
// the federation is running and it joins joinLead rounds past the newest
// version among the running peers (or its own, if newer).
func joinRound(version uint64, statuses map[peerid.ID]Status) uint64 {
	top, running := version, false
	for _, st := range statuses {
		if st.Done || st.JoinAt == JoinPending || (st.JoinAt != 0 && st.Version < st.JoinAt) {
			continue // stopped, pending, or not through its first round
		}
		running = true
		top = max(top, st.Version)
	}
	if !running || top == 0 {
		return version + 1
	}
	return top + joinLead
}

// anyPending reports whether a live peer has not chosen its first round
// yet: a founding peer gives such peers a moment before its first round,
// so that the federation's first groups include the peers that started
// with it.
func anyPending(statuses map[peerid.ID]Status) bool {
	for _, st := range statuses {
		if !st.Done && st.JoinAt == JoinPending {
			return true
		}
	}
	return false
}

// declared counts the live peers in statuses that have chosen their
// first round (not JoinPending): founders wait while it grows.
func declared(statuses map[peerid.ID]Status) uint64 {
	var n uint64
	for _, st := range statuses {
		if !st.Done && st.JoinAt != JoinPending {
			n++
		}
	}
	return n
}

// roundPlan is a peer's decision at the start of round r, once it holds a
// majority of its reference.
type roundPlan struct {
	// sampled is round r's sample of the members (sorted).
	sampled []peerid.ID
	// join reports that this peer is in sampled; if not, it skips round r.
	join bool
	// group is the part of sampled this peer averages with (sorted): all
	// of it, or, when the sample is larger than the group size, this
	// peer's group of its partition (aggregate.Partition), re-drawn each
	// round. Nil when the peer is not sampled.
	group []peerid.ID
	// behind reports that the peer missed rounds (its version is below
	// r−1): it fetches the state after round r−1 from from, round r−1's
	// sample less itself, else round r's, before it trains.
	behind bool
	from   []peerid.ID
}

// planRound decides round r for a peer at version, given the members
// admitted to round r and to round r−1, with averaging groups of at most
// groupSize peers (< 1: one group).
func planRound(seed uint64, fraction float64, groupSize int, self peerid.ID, r, version uint64, members, prev []peerid.ID) roundPlan {
	p := roundPlan{sampled: Sample(seed, r, members, fraction)}
	p.join = slices.Contains(p.sampled, self)
	if p.join {
		p.group = aggregate.GroupOf(seed, r, p.sampled, groupSize, self)
	}
	if p.join && version+1 < r {
		p.behind = true
		p.from = othersOf(self, Sample(seed, r-1, prev, fraction), p.sampled)
	}
	return p
}

// alignPlan is a sampled peer's decision, on one look at the others'
// versions, before it enters round r's all-reduce after a start or a
// failed round.
type alignPlan struct {
	// fetch lists the sampled peers that already finished round r: this
	// peer is late and takes their state instead of the round.
	fetch []peerid.ID
	// ready reports that every other sampled peer has reached version
	// r−1: the round can start. Otherwise the peer looks again until its
	// wait is over.
	ready bool
}

// planAlign decides for self, sampled for round r, given versions, the
// versions of the live peers that did not stop.
func planAlign(self peerid.ID, r uint64, sampled []peerid.ID, versions map[peerid.ID]uint64) alignPlan {
	p := alignPlan{ready: true, fetch: overtaken(self, r, sampled, versions)}
	for _, q := range sampled {
		if v, known := versions[q]; q != self && (!known || v+1 < r) {
			p.ready = false
		}
	}
	return p
}

// overtaken returns the peers of group, other than self, whose version
// (in versions) says they finished round r. Statuses lag and never lead,
// so for a peer about to run round r, or running it, they did so without
// it: they will not take part in its round r, and hold a state it can
// take instead (a group of the other side of a healed partition, rounds
// ahead; or a group that went on without this peer).
func overtaken(self peerid.ID, r uint64, group []peerid.ID, versions map[peerid.ID]uint64) []peerid.ID {
	var out []peerid.ID
	for _, q := range group {
		if v, known := versions[q]; q != self && known && v >= r {
			out = append(out, q)
		}
	}
	return out
}

// overtakeWatch decides, look by look during a round's all-reduce, when
// to give the round up for the state of peers that overtook it: once
// looks have named such peers (overtaken) without a break for grace.
type overtakeWatch struct {
	since time.Time // the first look of the current streak; zero if none
}

// look takes one look, at now, that saw ahead past the round, and reports
// whether to give the round up.
func (w *overtakeWatch) look(now time.Time, ahead []peerid.ID, grace time.Duration) bool {
	switch {
	case len(ahead) == 0:
		w.since = time.Time{}
	case w.since.IsZero():
		w.since = now
	}
	return !w.since.IsZero() && now.Sub(w.since) >= grace
}

// progressWatch decides, look by look, when a wait for a state that
// rounds still to come will produce has gone on too long: once the
// newest version among the live peers (topVersion) has not grown for
// patience. Such a wait may span many rounds, each bounded by its own
// timeout, so a fixed deadline from its start would give up on a
// federation that is moving.
type progressWatch struct {
	top   uint64
	since time.Time
}

// newProgressWatch starts a watch at now, with top the newest version.
func newProgressWatch(now time.Time, top uint64) progressWatch {
	return progressWatch{top: top, since: now}
}

// stalled takes one look, at now, that saw top, and reports whether the
// versions have not grown for patience.
func (w *progressWatch) stalled(now time.Time, top uint64, patience time.Duration) bool {
	if top > w.top {
		w.top, w.since = top, now
		return false
	}
	return now.Sub(w.since) >= patience
}

// topVersion returns the newest version among the live peers' statuses
// (0 if none).
func topVersion(statuses map[peerid.ID]Status) uint64 {
	var top uint64
	for _, v := range liveVersions(statuses) {
		top = max(top, v)
	}
	return top
}

// roundVerdict is what a peer makes of one round it was sampled for.
type roundVerdict struct {
	// fatal ends the run with the round's error (the model diverged).
	fatal bool
	// failed: the round failed for this peer; it says so (a round-failed
	// event) and aligns with the others before its next round.
	failed bool
	// reference: the peer completed the round itself; the members it saw
	// become its reference for quorate.
	reference bool
	// report: the peer holds a new version (the round's result, a state it
	// fetched, or its previous state relabelled), which it reports.
	report bool
	// lost: the new version is the previous state relabelled
	// (RoundInfo.Failed).
	lost bool
}

// judgeRound judges a round that ended with err (nil on success; never
// the caller's own cancellation), synced reporting a state taken from
// others and moved a change of version.
func judgeRound(err error, synced, moved bool) roundVerdict {
	if errors.Is(err, ErrDiverged) {
		return roundVerdict{fatal: true}
	}
	failed := err != nil
	return roundVerdict{
		failed:    failed,
		reference: !failed && !synced,
		report:    moved,
		lost:      moved && failed && !synced,
	}
}

// finalFrom returns the peers a peer that failed the job's last round
// asks for the final state: the last round's other participants, else the
// other members (nil if there are none).
func finalFrom(seed uint64, fraction float64, self peerid.ID, last uint64, members []peerid.ID) []peerid.ID {
	return othersOf(self, Sample(seed, last, members, fraction), members)
}

// othersOf returns the first of lists that names a peer other than self,
// without self (nil if none does).
func othersOf(self peerid.ID, lists ...[]peerid.ID) []peerid.ID {
	for _, l := range lists {
		if o := slices.DeleteFunc(slices.Clone(l), func(p peerid.ID) bool { return p == self }); len(o) > 0 {
			return o
		}
	}
	return nil
}

// pickSources returns the peers of candidates (self excluded) that one
// attempt of a state fetch asks for the state of version ≥ want: at most
// k, never all of a large federation at once. known reports that their
// statuses (versions) say they hold it. The known holders come first,
// newest version first; when no candidate is a known holder, it names k
// others (statuses lag: one may hold the state, or produce it while
// asked). Peers in tried (asked by a failed attempt) come after those not
// yet asked; once every candidate was tried, all are eligible again. Among
// equals the order is drawn from (seed, self): the behind peers of a
// round spread over the holders instead of all asking the same few.
func pickSources(seed uint64, self peerid.ID, want uint64, candidates []peerid.ID, versions map[peerid.ID]uint64, tried map[peerid.ID]bool, k int) (ask []peerid.ID, known bool) {
	type source struct {
		p       peerid.ID
		holds   bool
		tried   bool
		version uint64
		h       uint64
	}
	salt := seed ^ fnv64(string(self))
	all := make([]source, 0, len(candidates))
	seen := make(map[peerid.ID]bool, len(candidates))
	for _, p := range candidates {
		if p == self || seen[p] {
			continue
		}
		seen[p] = true
		v, ok := versions[p]
		all = append(all, source{p: p, holds: ok && v >= want, tried: tried[p], version: v, h: device.Hash64(salt, fnv64(string(p)))})
	}
	if !slices.ContainsFunc(all, func(s source) bool { return !s.tried }) {
		for i := range all {
			all[i].tried = false // everyone was asked: start over
		}
	}
	holders := slices.ContainsFunc(all, func(s source) bool { return s.holds && !s.tried })
	slices.SortFunc(all, func(a, b source) int {
		if a.tried != b.tried {
			if a.tried {
				return 1
			}
			return -1
		}
		if a.holds != b.holds {
			if a.holds {
				return -1
			}
			return 1
		}
		if a.holds && a.version != b.version {
			return cmp.Compare(b.version, a.version)
		}
		return cmp.Or(cmp.Compare(a.h, b.h), cmp.Compare(a.p, b.p))
	})
	for _, s := range all {
		if len(ask) == k || s.tried || s.holds != holders {
			break
		}
		ask = append(ask, s.p)
	}
	return ask, holders
}
