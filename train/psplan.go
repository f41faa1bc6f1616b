package train

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"slices"
	"time"

	"github.com/starling-ml/starling/peerid"
	"github.com/starling-ml/starling/staleness"
)

// The parameter-server mode's decisions (RunPS), as functions of plain
// values: who serves which shard and who backs it up, whether a server
// admits a request, how a worker reacts to a failed call. psPeer's loops
// look, call one of them and do what it says. docs/design.md gives the
// reasoning.

// psLayout is who holds what: the parameter vector cut into len(Servers)
// contiguous shards, shard i served by Servers[i] and backed up by
// Backups[i] ("" with no backup: a swarm of one).
type psLayout struct {
	Dim     int
	Bounds  []int // len(Servers)+1: shard i is [Bounds[i], Bounds[i+1])
	Servers []peerid.ID
	Backups []peerid.ID
}

// shards returns the number of shards.
func (l *psLayout) shards() int { return len(l.Servers) }

// span returns shard i's range.
func (l *psLayout) span(i int) (lo, hi int) { return l.Bounds[i], l.Bounds[i+1] }

// digest identifies the layout: peers that computed different layouts
// (they saw different members at start) find out on their first request.
func (l *psLayout) digest() uint64 {
	h := sha256.New()
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(l.Dim))
	h.Write(b[:])
	for i := range l.Servers {
		binary.BigEndian.PutUint64(b[:], uint64(l.Bounds[i+1]))
		h.Write(b[:])
		h.Write([]byte(l.Servers[i]))
		h.Write([]byte{0})
		h.Write([]byte(l.Backups[i]))
		h.Write([]byte{0})
	}
	return binary.BigEndian.Uint64(h.Sum(nil))
}

// roles returns the shards p serves and those it backs up.
func (l *psLayout) roles(p peerid.ID) (primary, backup []int) {
	for i := range l.Servers {
		if l.Servers[i] == p {
			primary = append(primary, i)
		}
		if l.Backups[i] == p {
			backup = append(backup, i)
		}
	}
	return primary, backup
}

// autoServers is how many servers a swarm of m peers elects when
// --servers is not given: one per four peers, at least one. Every peer
// also trains, so a server's link carries its workers' gradients and
// parameters: four workers per server keeps that near the all-reduce's
// traffic per peer.
func autoServers(m int) int { return max(1, m/4) }

// psRank orders members for the election: by SHA-256 of (model, ID), so
// that every peer that sees the same members elects the same servers,
// and different models (or swarms of other peers) do not always load the
// same machine.
func psRank(members []peerid.ID, model string) []peerid.ID {
	type scored struct {
		id peerid.ID
		h  [32]byte
	}
	s := make([]scored, 0, len(members))
	for _, m := range members {
		s = append(s, scored{m, sha256.Sum256([]byte(model + "\x00" + string(m)))})
	}
	slices.SortFunc(s, func(a, b scored) int {
		if c := slices.Compare(a.h[:], b.h[:]); c != 0 {
			return c
		}
		return compareIDs(a.id, b.id)
	})
	out := make([]peerid.ID, len(s))
	for i := range s {
		out[i] = s[i].id
	}
	return out
}

func compareIDs(a, b peerid.ID) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// planLayout elects n servers (autoServers when n is 0) among members
// for a dim-value model: the n first by psRank serve shards 0…n−1 (cut as
// evenly as possible), and each shard's backup is the next server in that
// order (the server after the last is the first), or with one server the
// next peer of the ranking, so that every shard survives the loss of one
// peer. A swarm of one has no backup.
func planLayout(members []peerid.ID, model string, dim, n int) (psLayout, error) {
	members = slices.Compact(slices.Sorted(slices.Values(members)))
	if n == 0 {
		n = autoServers(len(members))
	}
	switch {
	case len(members) == 0:
		return psLayout{}, fmt.Errorf("%w: ps: no members to elect servers among", ErrStrategy)
	case n < 0 || n > len(members):
		return psLayout{}, fmt.Errorf("%w: ps: %d servers among %d peers (want 1…%d)", ErrStrategy, n, len(members), len(members))
	case n > dim:
		return psLayout{}, fmt.Errorf("%w: ps: %d servers for a model of %d parameters", ErrStrategy, n, dim)
	}
	rank := psRank(members, model)
	l := psLayout{Dim: dim, Bounds: make([]int, n+1), Servers: rank[:n:n], Backups: make([]peerid.ID, n)}
	for i := range n {
		l.Bounds[i+1] = (i + 1) * dim / n
		switch {
		case n > 1:
			l.Backups[i] = rank[(i+1)%n]
		case len(rank) > 1:
			l.Backups[i] = rank[1]
		}
	}
	return l, nil
}

// psRole is what a peer is to one shard.
type psRole uint8

const (
	roleNone     psRole = iota
	rolePrimary         // serves the shard and replicates to its backup
	roleBackup          // holds the replica; serves on the first worker request (promotion)
	rolePromoted        // a backup that took over: serves, has no backup
	roleMoved           // a primary whose backup took over: refuses (PSMoved)
)

// psShardView is what a server admits a request against: its settings and
// one shard's state when the request arrives.
type psShardView struct {
	model   string
	dim     int
	layout  uint64
	role    psRole
	length  int    // the shard's length
	version uint64 // updates applied to the shard
	// lastSeq is the last push applied from the request's worker session
	// (0: none).
	lastSeq uint64
	policy  staleness.Policy
	// workers is how many worker sessions the shard knows, the request's
	// included (psClocks); slowest is the lowest clock of the others
	// that count for the SSP gate (psSlowest), others whether one does.
	workers int
	slowest uint64
	others  bool
}

// psAdmission is a server's verdict on a request.
type psAdmission struct {
	// status is the reply's status; PSOK with apply set applies the push.
	status PSStatus
	apply  bool
	// promote: this backup takes the shard over (a worker failed over
	// to it).
	promote bool
	// decision is the staleness policy's verdict on a push.
	decision staleness.Decision
	// wait: the worker, at the request's clock, is beyond the SSP bound
	// (a push's reply says so; a gate request is answered PSWait).
	wait   bool
	detail string
}

// admitPS decides on request r for one shard: the model and its size, the
// layout, the shard's role here, then for a push its length, a repeat of
// an applied sequence number (PSDup: acknowledged, not applied again, so
// that a worker that fails over with a push in flight loses nothing and
// applies nothing twice) and its staleness τ = version − base (PSStale
// beyond psDropPolicy's bound; otherwise applied with the weight s(τ)).
// A push or gate request also says whether the worker, at its clock
// r.Seq, must wait under the SSP bound (psGateWaits): a gate request is
// answered PSWait then, a push is acknowledged with wait set.
func admitPS(r *PSRequest, v psShardView) psAdmission {
	bad := func(s PSStatus, format string, args ...any) psAdmission {
		return psAdmission{status: s, detail: fmt.Sprintf(format, args...)}
	}
	switch {
	case r.Model != v.model || r.Dim != v.dim:
		return bad(PSBadModel, "server trains %s with %d parameters, the request is for %s with %d", v.model, v.dim, r.Model, r.Dim)
	case r.Layout != v.layout:
		return bad(PSBadLayout, "server elected layout %016x, the request has %016x", v.layout, r.Layout)
	}
	var a psAdmission
	switch v.role {
	case roleNone:
		return bad(PSNotServer, "not a server of shard %d", r.Shard)
	case roleMoved:
		return bad(PSMoved, "shard %d moved to its backup", r.Shard)
	case roleBackup:
		if r.Op == PSReplicate {
			return psAdmission{status: PSOK, apply: r.Version > v.version}
		}
		a.promote = true
	case rolePrimary, rolePromoted:
		if r.Op == PSReplicate {
			// The backup of a shard this peer serves: it took over or
			// the sender is confused. Either way it must stop.
			return bad(PSMoved, "shard %d is served here", r.Shard)
		}
	}
	switch r.Op {
	case PSPull, PSDone:
		a.status = PSOK
		return a
	case PSGate:
		a.status, a.wait = PSOK, psGateWaits(v.policy, r.Seq, v.slowest, v.others)
		if a.wait {
			a.status = PSWait
		}
		return a
	case PSPush:
	default:
		return bad(PSBadRequest, "unknown op %d", r.Op)
	}
	a.wait = psGateWaits(v.policy, r.Seq, v.slowest, v.others)
	switch {
	case r.Elems != v.length:
		return bad(PSBadShape, "shard %d has %d parameters, the gradient %d", r.Shard, v.length, r.Elems)
	case r.Seq == 0:
		return bad(PSBadRequest, "push without a sequence number")
	case r.Seq <= v.lastSeq:
		a.status = PSDup
		return a
	case r.Base > v.version && v.role == rolePrimary:
		return bad(PSBadRequest, "gradient at version %d of shard %d, which is at %d", r.Base, r.Shard, v.version)
	}
	// A backup that took over may be behind what the worker saw: the old
	// primary acknowledged updates whose replica failed (the backup was
	// unreachable for a moment, or the primary died while replicating).
	// Those are lost, as in-flight ones are; the gradient counts as fresh.
	a.decision = psDropPolicy(v.policy, v.workers).Decide(v.version - min(r.Base, v.version))
	if a.decision.Action != staleness.Accept {
		a.status = PSStale
		return a
	}
	a.status, a.apply = PSOK, true
	return a
}

// The SSP gate (Ho et al. 2013, "More effective distributed ML via a
// stale synchronous parallel parameter server"). A worker's clock is its
// completed steps, which is the sequence number of its last push to any
// shard (every step pushes every shard once). A worker at clock c may
// start step c+1 while c − slowest ≤ s, slowest being the lowest clock of
// the other live workers: so no worker completes more than s+1 steps
// beyond the slowest. Each shard's server checks it with what it has
// heard from the workers (psClock): a push's reply says whether the
// worker must wait, and the waiting worker asks again (PSGate) after a
// pause until the answer is PSOK, so that no call is held open and a wait
// never looks like a dead server.

// psClock is what a server has heard of one worker session's clock.
type psClock struct {
	clock uint64    // the highest clock (push sequence number) heard
	moved time.Time // when clock last grew (or was first heard)
	done  bool      // the worker said it is done (PSDone)
}

// observe returns c after the worker said it is at clock at now.
func (c psClock) observe(clock uint64, now time.Time) psClock {
	if c.moved.IsZero() || clock > c.clock {
		c.clock, c.moved = clock, now
	}
	return c
}

// psSlowest returns the lowest clock among the worker sessions other than
// self that count at now, and whether one does. A worker that is done,
// or whose clock has not grown for stall (the stall timeout: dead, hung,
// or slower than a step per stall), does not count, so that it holds the
// others for stall at most.
func psSlowest(clocks map[psSession]psClock, self psSession, now time.Time, stall time.Duration) (slowest uint64, ok bool) {
	for k, c := range clocks {
		if k == self || c.done || now.Sub(c.moved) >= stall {
			continue
		}
		if !ok || c.clock < slowest {
			slowest, ok = c.clock, true
		}
	}
	return slowest, ok
}

// psGateWaits reports whether a worker at clock must wait before its next
// step: pol has an SSP bound s and the worker is more than s clocks ahead
// of slowest, the slowest other worker that counts (others: one does).
// It is the gate async mode applies to versions (Policy.Gate).
func psGateWaits(pol staleness.Policy, clock, slowest uint64, others bool) bool {
	return others && clock > slowest && pol.Gate(clock-slowest).Action == staleness.Wait
}

// psDropPolicy is pol with its SSP bound s, which counts clocks, turned
// into the bound on a push's staleness τ, which counts the shard's
// updates, for a shard that knows workers worker sessions: 2(s+1) per
// other worker. While the gate holds, another worker was at most s+1
// steps behind the pusher when it pulled and gets at most s+1 ahead of it
// before its push, so no gradient is staler: the drop is a safety net for
// gradients that got past the gate (a worker that did not count, being
// stalled, or one a promoted backup does not know yet). Without a bound,
// pol.
func psDropPolicy(pol staleness.Policy, workers int) staleness.Policy {
	s, ok := pol.Bound()
	if !ok {
		return pol
	}
	return pol.WithBound(2 * (s + 1) * max(workers-1, 0))
}

// psCallState is where a worker's calls for one shard go.
type psCallState struct {
	primary, backup peerid.ID
	onBackup        bool // failed over
	started         bool // the first reply came: the shard's server is up
}

// target returns the server the next call goes to.
func (s *psCallState) target() peerid.ID {
	if s.onBackup {
		return s.backup
	}
	return s.primary
}

// psNext is what a worker does after a call that did not succeed.
type psNext uint8

const (
	psRetry    psNext = iota // call the same server again (after a pause)
	psFailover               // call the backup with the same request
	psFail                   // give up: the run ends with an error
)

// planRetry decides after a failed call to s.target(): err is the
// transport's error (nil when a reply came with status st), el how long
// the worker has been trying since the first call of this request. A
// server not up yet (PSNotReady, or any transport error before its first
// reply, as a peer that starts later looks) is retried until startGrace;
// after that, or once it has replied before, a transport error or timeout
// (a dead or stalled server: each call had the stall timeout) or PSMoved
// fails over to the backup, once. Any other status is the request's fault
// (another model, another layout, a wrong length) and fails the run.
func planRetry(s psCallState, err error, st PSStatus, el, startGrace time.Duration) psNext {
	transport := err != nil
	switch {
	case !transport && st != PSNotReady && st != PSMoved:
		return psFail
	case (st == PSNotReady || (transport && !s.started)) && el < startGrace:
		return psRetry
	case s.onBackup || s.backup == "":
		return psFail
	}
	return psFailover
}

// PSElect returns the servers (shard i's is servers[i]) and their backups
// that members elect for a model of dim parameters with n servers (0:
// one per four peers): what RunPS will use, for logs and tests.
func PSElect(members []peerid.ID, model string, dim, n int) (servers, backups []peerid.ID, err error) {
	l, err := planLayout(members, model, dim, n)
	return l.Servers, l.Backups, err
}
