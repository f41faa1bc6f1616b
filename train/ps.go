package train

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/starling-ml/starling/compression"
	"github.com/starling-ml/starling/internal/ctxtime"
	"github.com/starling-ml/starling/peerid"
	"github.com/starling-ml/starling/staleness"
)

// Errors of the parameter-server mode.
var (
	// ErrPSRefused reports a server that refused a worker's request for
	// good: another model, another layout, a gradient of the wrong size.
	ErrPSRefused = errors.New("train: parameter server refused the request")
	// ErrPSUnreachable reports a shard whose server and backup both failed.
	ErrPSUnreachable = errors.New("train: parameter server unreachable")
)

// PSConfig configures RunPS.
type PSConfig struct {
	// Model is the model id (the architecture digest): a server refuses
	// workers of another model or parameter count.
	Model string
	// Servers is how many peers serve a shard each (0: one per four
	// peers, autoServers).
	Servers int
	// Policy weighs a pushed gradient by its staleness τ (the shard's
	// updates since the worker pulled it). With an SSP bound s it is a
	// gate: a worker that has completed c steps does not start the next
	// while c is more than s ahead of the slowest live worker (one not
	// done whose clock grew within CallTimeout), so none runs more than
	// s+1 steps ahead; and a gradient that got past the gate more than
	// 2(s+1) updates per other worker stale is dropped (psDropPolicy).
	// A promoted backup learns the clocks anew from the workers' next
	// requests. "const" (plain asynchronous SGD) by default.
	Policy staleness.Policy
	// DCLambda is DC-ASGD's λ (staleness.Compensate): a gradient
	// computed at older parameters is corrected towards the current ones
	// with λ·g⊙g⊙(w − w_bak). 0 turns it off; staleness.DefaultDCLambda
	// (0.04) by default.
	DCLambda float64
	// LR is the servers' learning rate: a shard steps w ← w − LR·s(τ)·g.
	LR float32
	// Codec encodes pushed gradients ("fp32", "int8", "topk:0.01,ef", …);
	// parameters come back in fp32.
	Codec compression.Spec
	// CallTimeout bounds one request and so is how long a worker waits
	// for a dead or stalled server before it fails over to the shard's
	// backup: the stall timeout. It is also how long the SSP gate waits
	// for a worker whose clock does not grow (dead, hung or slower than
	// a step per CallTimeout) before it stops counting it. 5 s.
	CallTimeout time.Duration
	// StartGrace is how long a worker keeps asking a server that does
	// not answer yet at the start (a peer that starts later) before it
	// takes it for dead. 30 s.
	StartGrace time.Duration
	// ServeIdle is how long a server whose own worker is done keeps
	// serving with no request coming (peers still training that do not
	// say they are done: a dead one). 2×CallTimeout when 0.
	ServeIdle time.Duration
	// MaxSteps stops after that many local steps (0: run until ctx ends).
	MaxSteps int
	// SnapshotEvery is the interval of Recorder snapshots (0: every
	// step). 250 ms.
	SnapshotEvery time.Duration
}

// DefaultPSConfig returns the documented defaults (LR 0.05, the worker's
// default).
func DefaultPSConfig() PSConfig {
	return PSConfig{Model: "default", Policy: staleness.Constant(), DCLambda: staleness.DefaultDCLambda, LR: 0.05,
		Codec: compression.MustSpec("fp32"), CallTimeout: 5 * time.Second, StartGrace: 30 * time.Second,
		SnapshotEvery: 250 * time.Millisecond}
}

// Validate reports settings that cannot work. It does not modify c.
func (c PSConfig) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: ps: "+format, append([]any{ErrStrategy}, args...)...)
	}
	switch {
	case c.Model == "":
		return bad("no model id")
	case c.Servers < 0:
		return bad("servers %d < 0", c.Servers)
	case !(c.DCLambda >= 0) || math.IsInf(c.DCLambda, 0):
		return bad("DC-ASGD λ %v must be ≥ 0", c.DCLambda)
	case !(c.LR > 0) || math.IsInf(float64(c.LR), 0):
		return bad("learning rate %v", c.LR)
	case c.CallTimeout <= 0 || c.StartGrace < 0 || c.ServeIdle < 0 || c.SnapshotEvery < 0 || c.MaxSteps < 0:
		return bad("call timeout must be > 0; start grace, serve idle, snapshot interval and max steps ≥ 0")
	case c.Codec.IsZero():
		return bad("no codec (want fp32 for raw float32)")
	}
	return nil
}

// PSSummary describes one peer's run in the parameter-server mode.
type PSSummary struct {
	Peer    string   `json:"peer"`
	Policy  string   `json:"policy"`
	Servers []string `json:"servers"`
	// Serves and Backs are the shards this peer served and backed up.
	Serves []int `json:"serves"`
	Backs  []int `json:"backs"`
	// As a worker.
	Steps     int `json:"steps"`
	Pushes    int `json:"pushes"`    // gradients acknowledged (applied, or applied before: dup)
	Stale     int `json:"stale"`     // gradients dropped by the SSP safety net (psDropPolicy)
	Failovers int `json:"failovers"` // shards this worker moved to their backup
	// GateWaits is how many steps the SSP gate held, GateWaitS for how
	// long in all, GateTimeouts how many of those waits ran into their
	// deadline (2×CallTimeout) and went on without the gate.
	GateWaits    int     `json:"gate_waits"`
	GateWaitS    float64 `json:"gate_wait_s"`
	GateTimeouts int     `json:"gate_timeouts"`
	// Versions are the shards' versions in the final pull.
	Versions []uint64 `json:"versions"`
	MeanTau  float64  `json:"mean_tau"` // over applied gradients
	// As a server.
	Applied     int64   `json:"applied"`
	Compensated int64   `json:"compensated"` // applied with DC-ASGD's correction
	Promoted    int64   `json:"promoted"`    // shards this backup took over
	WallS       float64 `json:"wall_s"`
}

// psRetryPause is how long a worker waits before asking a server that
// is not up yet again.
const psRetryPause = 50 * time.Millisecond

// psGatePause is how long a worker held by the SSP gate waits before it
// asks again (PSGate: a small request, a small reply while it waits).
const psGatePause = 20 * time.Millisecond

// RunPS trains w in the parameter-server mode with the peers members
// (this one included; every peer must be given the same members) until
// ctx ends (it then returns nil) or cfg.MaxSteps local steps are done.
//
// The members elect cfg.Servers servers (planLayout); each holds one
// contiguous shard of the parameters, and the next server (or, with one
// server, the next peer) holds its replica. Every member trains: it pulls
// every shard, computes a gradient on a batch of its data, pushes each
// shard's part (encoded with cfg.Codec) to that shard's server and
// continues from the parameters the reply carries, with no barrier
// between workers. A server weighs a gradient by its staleness (cfg.Policy,
// dropping it beyond an SSP bound), corrects it with DC-ASGD
// (cfg.DCLambda), steps its shard with SGD and, before it replies,
// replicates the shard to its backup. A worker whose call to a server
// gets no reply within cfg.CallTimeout sends the same request to the
// backup, which takes the shard over; sequence numbers make that retry
// apply at most once, so no acknowledged update is lost, except those
// acknowledged while the backup could not be reached. A peer keeps
// serving after its own steps until the other workers are done (or
// silent for ServeIdle). The worker ends holding the final parameters.
func RunPS(ctx context.Context, w *Worker, net PSNet, members []peerid.ID, cfg PSConfig, rec Recorder) (*PSSummary, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.ServeIdle == 0 {
		cfg.ServeIdle = 2 * cfg.CallTimeout
	}
	self := net.Self()
	dim := len(w.Model.Params)
	layout, err := planLayout(slices.Concat(members, []peerid.ID{self}), cfg.Model, dim, cfg.Servers)
	if err != nil {
		return nil, err
	}
	if rec == nil {
		rec = discardRecorder{}
	}
	start := time.Now()
	srv := newPSServer(self, net, cfg, &layout, w.Model.Params)
	net.Serve(srv.handle)
	defer net.Serve(nil)

	pw := newPSWorker(self, net, cfg, &layout, w, srv)
	sum := &PSSummary{Peer: string(self), Policy: cfg.Policy.String()}
	for _, s := range layout.Servers {
		sum.Servers = append(sum.Servers, string(s))
	}
	sum.Serves, sum.Backs = layout.roles(self)
	runErr := pw.run(ctx, rec, start)
	if runErr == nil && ctx.Err() == nil {
		srv.linger(ctx, layout.Servers, members)
	}
	sum.Steps, sum.Pushes, sum.Stale, sum.Failovers = w.Steps, pw.pushes, pw.stale, pw.failovers
	sum.GateWaits, sum.GateWaitS, sum.GateTimeouts = pw.waits, pw.waited.Seconds(), pw.gateTimeouts
	sum.Versions = pw.ver
	if pw.applied > 0 {
		sum.MeanTau = pw.tauSum / float64(pw.applied)
	}
	sum.Applied, sum.Compensated, sum.Promoted = srv.applied.Load(), srv.compensated.Load(), srv.promoted.Load()
	sum.WallS = time.Since(start).Seconds()
	if e := ctxtime.Ended(ctx); e != nil && errors.Is(runErr, e) {
		runErr = nil
	}
	return sum, runErr
}

// psWorker is one peer's worker side: where each shard's calls go, and
// the pushes' sequence numbers. Its loop owns everything; a step's shard
// calls run in parallel, each on its own shard's slots.
type psWorker struct {
	self    peerid.ID
	net     PSNet
	cfg     PSConfig
	layout  *psLayout
	digest  uint64
	session uint64
	w       *Worker
	srv     *psServer // this peer's server: calls to self go straight to it

	calls    []psCallState
	seq, ver []uint64
	encs     []compression.Codec
	bufs     [][]byte
	// wait[i]: shard i's server said, in its reply to the last push,
	// that the SSP gate holds the next step.
	wait []bool

	rec   Recorder
	start time.Time

	mu                                sync.Mutex // guards the counters
	pushes, stale, failovers, applied int
	tauSum                            float64
	waits, gateTimeouts               int
	waited                            time.Duration
}

func newPSWorker(self peerid.ID, net PSNet, cfg PSConfig, l *psLayout, w *Worker, srv *psServer) *psWorker {
	n := l.shards()
	var sb [8]byte
	rand.Read(sb[:])
	pw := &psWorker{self: self, net: net, cfg: cfg, layout: l, digest: l.digest(), session: binary.LittleEndian.Uint64(sb[:]) | 1,
		w: w, srv: srv, calls: make([]psCallState, n), seq: make([]uint64, n), ver: make([]uint64, n),
		encs: make([]compression.Codec, n), bufs: make([][]byte, n), wait: make([]bool, n)}
	for i := range n {
		pw.calls[i] = psCallState{primary: l.Servers[i], backup: l.Backups[i]}
		pw.encs[i] = cfg.Codec.New()
	}
	return pw
}

func (pw *psWorker) request(op PSOp, shard int) PSRequest {
	return PSRequest{Op: op, Model: pw.cfg.Model, Dim: pw.layout.Dim, Layout: pw.digest, Shard: shard, Session: pw.session}
}

// run pulls the parameters and steps until MaxSteps or ctx's end, then
// pulls the final parameters and tells the servers it is done. Between
// steps it waits while the SSP gate holds it.
func (pw *psWorker) run(ctx context.Context, rec Recorder, start time.Time) error {
	pw.rec, pw.start = rec, start
	w := pw.w
	if err := pw.all(ctx, func(ctx context.Context, i int) error { return pw.pull(ctx, i) }); err != nil {
		return err
	}
	var last time.Duration
	snapshot := func(force bool) {
		if at := time.Since(start); snapshotDue(force, at, last, pw.cfg.SnapshotEvery) {
			rec.Snapshot(string(pw.self), at, w.Steps, w.Model.Params)
			last = at
		}
	}
	snapshot(true)
	for ctx.Err() == nil && (pw.cfg.MaxSteps == 0 || w.Steps < pw.cfg.MaxSteps) {
		loss, n, err := w.Grad(ctx)
		if err != nil {
			return err
		}
		if err := pw.all(ctx, pw.push); err != nil {
			return err
		}
		w.Steps++
		w.Samples += n
		rec.Event(Event{Peer: string(pw.self), At: time.Since(start), Kind: "step", Loss: loss})
		snapshot(false)
		if pw.cfg.MaxSteps == 0 || w.Steps < pw.cfg.MaxSteps {
			if err := pw.gate(ctx); err != nil {
				return err
			}
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	// The final parameters, with every worker's last pushes that arrived
	// so far; then the servers may stop once all are done.
	err := pw.all(ctx, func(ctx context.Context, i int) error { return pw.pull(ctx, i) })
	snapshot(true)
	pw.all(ctx, func(ctx context.Context, i int) error {
		r := pw.request(PSDone, i)
		_, err := pw.call(ctx, i, &r)
		return err
	})
	return err
}

// all runs f for every shard in parallel and returns the first error.
func (pw *psWorker) all(ctx context.Context, f func(context.Context, int) error) error {
	n := pw.layout.shards()
	if n == 1 {
		return f(ctx, 0)
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = f(ctx, i) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// pull fetches shard i into the worker's parameters.
func (pw *psWorker) pull(ctx context.Context, i int) error {
	r := pw.request(PSPull, i)
	rep, err := pw.call(ctx, i, &r)
	if err != nil {
		return err
	}
	return pw.take(i, rep)
}

// push sends shard i's part of the gradient and takes the parameters the
// reply carries.
func (pw *psWorker) push(ctx context.Context, i int) error {
	lo, hi := pw.layout.span(i)
	pw.bufs[i] = pw.encs[i].Encode(pw.bufs[i], pw.w.Model.Grads[lo:hi])
	pw.seq[i]++
	r := pw.request(PSPush, i)
	r.Seq, r.Base, r.Codec, r.Elems, r.Payload = pw.seq[i], pw.ver[i], uint8(pw.encs[i].ID()), hi-lo, pw.bufs[i]
	rep, err := pw.call(ctx, i, &r)
	if err != nil {
		return err
	}
	pw.wait[i] = rep.Wait
	pw.mu.Lock()
	switch rep.Status {
	case PSStale:
		pw.stale++
	case PSOK:
		pw.applied++
		pw.tauSum += float64(rep.Tau)
		pw.rec.Event(Event{Peer: string(pw.self), At: time.Since(pw.start), Kind: "merge", Staleness: int(rep.Tau), Weight: rep.Weight, Bytes: int64(len(r.Payload))})
		fallthrough
	default:
		pw.pushes++
	}
	pw.mu.Unlock()
	return pw.take(i, rep)
}

// gate holds the next step while the SSP gate does (a push's reply said
// so): it asks each shard that said so again every psGatePause until it
// answers with the parameters. A wait has a deadline of 2×CallTimeout,
// after which the worker pulls and goes on (a gate timeout): the servers
// stop counting a worker whose clock has not grown for CallTimeout, so
// the deadline is only reached when something else is wrong. A call of
// the wait that fails fails over as any other, so a server that dies
// while a worker waits is found as it would be otherwise.
func (pw *psWorker) gate(ctx context.Context) error {
	if !slices.Contains(pw.wait, true) {
		return nil
	}
	start := time.Now()
	err := pw.all(ctx, pw.gateShard)
	pw.mu.Lock()
	pw.waits++
	pw.waited += time.Since(start)
	pw.mu.Unlock()
	return err
}

// gateShard waits until shard i's server lets the worker go on, or the
// wait's deadline passes, and takes the shard's parameters then.
func (pw *psWorker) gateShard(ctx context.Context, i int) error {
	if !pw.wait[i] {
		return nil
	}
	pw.wait[i] = false
	deadline := time.Now().Add(2 * pw.cfg.CallTimeout)
	for {
		if err := ctxtime.Sleep(ctx, psGatePause); err != nil {
			return err
		}
		op := PSGate
		if !time.Now().Before(deadline) {
			op = PSPull
			pw.mu.Lock()
			pw.gateTimeouts++
			pw.mu.Unlock()
		}
		r := pw.request(op, i)
		r.Seq = pw.seq[i]
		rep, err := pw.call(ctx, i, &r)
		if err != nil {
			return err
		}
		if rep.Status != PSWait {
			return pw.take(i, rep)
		}
	}
}

// take copies a reply's parameters into shard i of the worker's model.
func (pw *psWorker) take(i int, rep *PSReply) error {
	lo, hi := pw.layout.span(i)
	if err := getF32s(pw.w.Model.Params[lo:hi], rep.Payload); err != nil {
		return fmt.Errorf("%w: ps: shard %d from %s: %v", ErrPSRefused, i, pw.calls[i].target(), err)
	}
	pw.ver[i] = rep.Version
	return nil
}

// call sends r for shard i to its server, retrying a server that is not
// up yet and failing over to the backup as planRetry says.
func (pw *psWorker) call(ctx context.Context, i int, r *PSRequest) (*PSReply, error) {
	st := &pw.calls[i]
	first := time.Now()
	for {
		to := st.target()
		var (
			rep *PSReply
			err error
		)
		cctx, cancel := context.WithTimeout(ctx, pw.cfg.CallTimeout)
		if to == pw.self {
			rep = pw.srv.handle(cctx, pw.self, r)
		} else {
			rep, err = pw.net.Call(cctx, to, r)
		}
		cancel()
		if err := ctxtime.Ended(ctx); err != nil {
			// The run's end (its deadline may fail the call before
			// ctx.Err() is set), not the server's: no failover.
			return nil, err
		}
		status := PSOK
		if err == nil {
			status = rep.Status
			switch status {
			case PSOK, PSDup, PSStale, PSWait:
				st.started = true
				return rep, nil
			}
		}
		switch planRetry(*st, err, status, time.Since(first), pw.cfg.StartGrace) {
		case psRetry:
			if err := ctxtime.Sleep(ctx, psRetryPause); err != nil {
				return nil, err
			}
		case psFailover:
			st.onBackup, st.started = true, true
			first = time.Now()
			pw.mu.Lock()
			pw.failovers++
			pw.mu.Unlock()
		default:
			if err != nil {
				if st.onBackup {
					return nil, fmt.Errorf("%w: ps: shard %d: server %s and its backup %s did not answer: %v", ErrPSUnreachable, i, st.primary, st.backup, err)
				}
				return nil, fmt.Errorf("%w: ps: shard %d: server %s did not answer and has no backup: %v", ErrPSUnreachable, i, to, err)
			}
			return nil, fmt.Errorf("%w: ps: shard %d at %s: %s: %s", ErrPSRefused, i, to, status, rep.Detail)
		}
	}
}

// psServer is one peer's server side: the shards it serves or backs up.
// handle runs on the transport's goroutines; each shard has its own lock.
type psServer struct {
	self   peerid.ID
	net    PSNet
	cfg    PSConfig
	layout *psLayout
	digest uint64
	shards []*psShard // by index; nil for shards this peer does not hold

	lastReq                        atomic.Int64 // Unix ns of the last request from another peer
	applied, compensated, promoted atomic.Int64

	mu   sync.Mutex
	done map[peerid.ID]bool // workers that said they are done
}

// psShard is one shard's state on a server or a backup.
type psShard struct {
	mu      sync.Mutex
	idx     int
	role    psRole
	backup  peerid.ID
	params  []float32
	version uint64
	seqs    map[psSession]uint64
	// clocks are the workers' clocks for the SSP gate, as heard here
	// (not replicated).
	clocks map[psSession]psClock
	// bak holds, per worker, the parameters it was last sent and their
	// version: DC-ASGD's w_bak.
	bak  map[peerid.ID]*psBak
	grad []float32
	// replFails counts the replications to the backup that failed in a
	// row; none is tried before replRetry. Every replica carries the
	// whole shard, so the first that gets through brings the backup up
	// to date.
	replFails int
	replRetry time.Time
}

// replBackoff is how long a primary waits, after fails failed
// replications in a row, before it tries its backup again: 50 ms
// doubling to 5 s. A backup that is not serving yet (its handler is set
// after the first pushes arrive) or lost one call is caught up by the
// next replica; one that is gone costs a failed call every 5 s.
func replBackoff(fails int) time.Duration {
	return min(50*time.Millisecond<<min(fails-1, 10), 5*time.Second)
}

type psSession struct {
	worker  peerid.ID
	session uint64
}

type psBak struct {
	version uint64
	params  []float32
}

func newPSServer(self peerid.ID, net PSNet, cfg PSConfig, l *psLayout, init []float32) *psServer {
	s := &psServer{self: self, net: net, cfg: cfg, layout: l, digest: l.digest(), shards: make([]*psShard, l.shards()), done: map[peerid.ID]bool{}}
	primary, backup := l.roles(self)
	add := func(i int, role psRole, b peerid.ID) {
		lo, hi := l.span(i)
		s.shards[i] = &psShard{idx: i, role: role, backup: b, params: append([]float32(nil), init[lo:hi]...),
			seqs: map[psSession]uint64{}, clocks: map[psSession]psClock{}, bak: map[peerid.ID]*psBak{}, grad: make([]float32, hi-lo)}
	}
	for _, i := range primary {
		add(i, rolePrimary, l.Backups[i])
	}
	for _, i := range backup {
		if s.shards[i] == nil {
			add(i, roleBackup, "")
		}
	}
	s.lastReq.Store(time.Now().UnixNano())
	return s
}

// handle answers one request (a PSHandler).
func (s *psServer) handle(ctx context.Context, from peerid.ID, r *PSRequest) *PSReply {
	if from != s.self {
		s.lastReq.Store(time.Now().UnixNano())
	}
	var sh *psShard
	if r.Shard >= 0 && r.Shard < len(s.shards) {
		sh = s.shards[r.Shard]
	}
	v := psShardView{model: s.cfg.Model, dim: s.layout.Dim, layout: s.digest, policy: s.cfg.Policy}
	if sh == nil {
		a := admitPS(r, v)
		return &PSReply{Status: a.status, Detail: a.detail}
	}
	sh.mu.Lock()
	now := time.Now()
	v.role, v.length, v.version = sh.role, len(sh.params), sh.version
	key := psSession{from, r.Session}
	v.lastSeq = sh.seqs[key]
	clock, known := sh.clocks[key]
	v.workers = len(sh.clocks)
	if !known {
		v.workers++
	}
	if _, ok := s.cfg.Policy.Bound(); ok {
		v.slowest, v.others = psSlowest(sh.clocks, key, now, s.cfg.CallTimeout)
	}
	a := admitPS(r, v)
	if a.promote {
		sh.role, sh.backup = rolePromoted, ""
		s.promoted.Add(1)
	}
	switch {
	case a.status != PSOK && a.status != PSDup && a.status != PSStale && a.status != PSWait:
		sh.mu.Unlock()
		return &PSReply{Status: a.status, Detail: a.detail}
	case r.Op == PSReplicate:
		defer sh.mu.Unlock()
		if a.apply {
			if err := getF32s(sh.params, r.Payload); err != nil {
				return &PSReply{Status: PSBadShape, Detail: err.Error()}
			}
			sh.version = r.Version
			clear(sh.seqs)
			for _, q := range r.Seqs {
				sh.seqs[psSession{q.Worker, q.Session}] = q.Seq
			}
		}
		return &PSReply{Status: PSOK, Version: sh.version}
	case r.Op == PSDone:
		clock.done = true
		sh.clocks[key] = clock
		sh.mu.Unlock()
		s.mu.Lock()
		s.done[from] = true
		s.mu.Unlock()
		return &PSReply{Status: PSOK, Version: v.version}
	}
	sh.clocks[key] = clock.observe(r.Seq, now)
	if a.status == PSWait {
		sh.mu.Unlock()
		return &PSReply{Status: PSWait, Version: v.version, Slowest: v.slowest}
	}
	rep := &PSReply{Status: a.status, Tau: a.decision.Tau, Weight: a.decision.Weight, Wait: a.wait}
	if a.wait {
		rep.Slowest = v.slowest
	}
	if a.apply {
		if err := s.apply(sh, from, r, a.decision.Weight); err != nil {
			sh.mu.Unlock()
			return &PSReply{Status: PSBadRequest, Detail: err.Error()}
		}
		sh.seqs[key] = r.Seq
	}
	rep.Version = sh.version
	rep.Payload = putF32s(nil, sh.params)
	if s.cfg.DCLambda > 0 {
		b := sh.bak[from]
		if b == nil {
			b = &psBak{}
			sh.bak[from] = b
		}
		b.version, b.params = sh.version, append(b.params[:0], sh.params...)
	}
	var repl *PSRequest
	if a.apply && sh.role == rolePrimary && sh.backup != "" && !time.Now().Before(sh.replRetry) {
		repl = &PSRequest{Op: PSReplicate, Model: s.cfg.Model, Dim: s.layout.Dim, Layout: s.digest, Shard: sh.idx,
			Version: sh.version, Payload: rep.Payload}
		for k, q := range sh.seqs {
			repl.Seqs = append(repl.Seqs, PSSeq{Worker: k.worker, Session: k.session, Seq: q})
		}
	}
	backup := sh.backup
	sh.mu.Unlock()
	if repl != nil {
		// Replicated before the worker hears of it: an acknowledged push
		// is on the backup too.
		rr, err := s.net.Call(ctx, backup, repl)
		switch {
		case err == nil && rr.Status == PSMoved:
			// The backup took over: this update is not in its state, so
			// the worker must send it there.
			sh.mu.Lock()
			sh.role = roleMoved
			sh.mu.Unlock()
			return &PSReply{Status: PSMoved, Detail: fmt.Sprintf("shard %d moved to %s", sh.idx, backup)}
		case err == nil && rr.Status == PSNotReady:
			// Up, not serving yet: soon.
			sh.mu.Lock()
			sh.replRetry = time.Now().Add(replBackoff(1))
			sh.mu.Unlock()
		case err != nil || rr.Status != PSOK:
			// The backup is not there (yet, or any more): serve on, and
			// try it again after a backoff.
			sh.mu.Lock()
			if sh.backup == backup {
				sh.replFails++
				sh.replRetry = time.Now().Add(replBackoff(sh.replFails))
			}
			sh.mu.Unlock()
		default:
			sh.mu.Lock()
			sh.replFails, sh.replRetry = 0, time.Time{}
			sh.mu.Unlock()
		}
	}
	return rep
}

// apply decodes r's gradient and steps the shard with it; sh.mu is held.
func (s *psServer) apply(sh *psShard, from peerid.ID, r *PSRequest, weight float64) error {
	dec, err := compression.New(compression.ID(r.Codec), "")
	if err != nil {
		return fmt.Errorf("shard %d: codec %d: %v", sh.idx, r.Codec, err)
	}
	if err := dec.Decode(sh.grad, r.Payload); err != nil {
		return fmt.Errorf("shard %d: gradient does not decode: %v", sh.idx, err)
	}
	g := sh.grad
	for _, x := range g {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return fmt.Errorf("shard %d: non-finite gradient", sh.idx)
		}
	}
	if b := sh.bak[from]; s.cfg.DCLambda > 0 && b != nil && b.version == r.Base && b.version != sh.version {
		if g, err = staleness.Compensate(g, g, sh.params, b.params, float32(s.cfg.DCLambda)); err != nil {
			return err
		}
		s.compensated.Add(1)
	}
	step := s.cfg.LR * float32(weight)
	for i, x := range g {
		sh.params[i] -= step * x
	}
	sh.version++
	s.applied.Add(1)
	return nil
}

// linger keeps serving, after this peer's own steps, while a worker of
// members other than this one has not said it is done and requests keep
// coming (within ServeIdle), or until ctx ends. Peers that serve nothing
// return at once.
func (s *psServer) linger(ctx context.Context, servers, members []peerid.ID) {
	serves := false
	for _, sh := range s.shards {
		serves = serves || sh != nil
	}
	if !serves {
		return
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		s.mu.Lock()
		waiting := false
		for _, m := range members {
			waiting = waiting || (m != s.self && !s.done[m])
		}
		s.mu.Unlock()
		if !waiting || time.Since(time.Unix(0, s.lastReq.Load())) > s.cfg.ServeIdle {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// putF32s appends v as little-endian float32 to dst[:0].
func putF32s(dst []byte, v []float32) []byte {
	if cap(dst) < 4*len(v) {
		dst = make([]byte, 4*len(v))
	}
	dst = dst[:4*len(v)]
	for i, x := range v {
		binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(x))
	}
	return dst
}

// getF32s fills dst from little-endian float32 bytes of exactly its length.
func getF32s(dst []float32, b []byte) error {
	if len(b) != 4*len(dst) {
		return fmt.Errorf("%d bytes of parameters for a shard of %d", len(b), len(dst))
	}
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return nil
}
