package serve

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"strings"
	"time"
	"unsafe"

	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/starling-ml/starling/aggregate"
	"github.com/starling-ml/starling/aggregate/p2p"
	"github.com/starling-ml/starling/aggregate/rule"
	"github.com/starling-ml/starling/compression"
	"github.com/starling-ml/starling/gossip/wire"
	"github.com/starling-ml/starling/peerid"
	"github.com/starling-ml/starling/swarm"
)

// Default deadlines of the blocking ops when the request gives none.
const (
	defaultCallTimeout = 5 * time.Minute
	connectTimeout     = 30 * time.Second
	writeTimeout       = 10 * time.Second
	maxRunners         = 64
)

// session is one client's connection and swarm membership. Its methods
// run on the session's goroutine only.
type session struct {
	cfg  Config
	conn *net.UnixConn

	join   JoinConfig
	peer   *swarm.Peer
	group  []peerid.ID // the group of the next round (nil before wait)
	round  uint64
	out    error // set once the others excluded this peer
	models string

	runners map[string]*aggregate.Runner
	async   *swarm.StreamNet // announce and next (nil until first used)
	seq     uint64           // announcements made

	shm  []byte
	vals []float32 // shm as float32

	stats struct {
		ok, failed int
		seconds    float64
		values     int64
		last       Response
	}
}

func newSession(cfg Config, c *net.UnixConn) *session {
	return &session{cfg: cfg, conn: c, runners: map[string]*aggregate.Runner{}}
}

// run greets the client and answers its requests until it disconnects,
// leaves, or ctx ends. A disconnect cancels the call in flight.
func (s *session) run(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer s.conn.Close()
	defer s.close()
	if s.write(Response{OK: true, Server: "peer serve", Version: Version, PID: os.Getpid()}) != nil {
		return
	}
	reqs := make(chan Request)
	go func() {
		defer close(reqs)
		defer cancel() // the client is gone: stop what it asked for
		for {
			var r Request
			if err := ReadFrame(s.conn, &r); err != nil {
				return
			}
			select {
			case reqs <- r:
			case <-ctx.Done():
				return
			}
		}
	}()
	for {
		var r Request
		var ok bool
		select {
		case r, ok = <-reqs:
		case <-ctx.Done():
		}
		if !ok {
			return
		}
		resp := s.handle(ctx, r)
		if ctx.Err() != nil {
			s.cfg.Log.Warn("serve: client gone mid-call; leaving the swarm", "op", r.Op)
			return
		}
		if s.write(resp) != nil || r.Op == "leave" {
			return
		}
	}
}

func (s *session) write(r Response) error {
	s.conn.SetWriteDeadline(time.Now().Add(writeTimeout))
	return WriteFrame(s.conn, r)
}

func fail(code string, format string, a ...any) Response {
	return Response{Code: code, Error: fmt.Sprintf(format, a...)}
}

func (s *session) handle(ctx context.Context, r Request) Response {
	switch r.Op {
	case "join":
		return s.doJoin(ctx, r)
	case "wait":
		return s.doWait(ctx, r)
	case "shm":
		return s.doShm(r)
	case "allreduce":
		return s.doAllReduce(ctx, r)
	case "publish":
		return s.doPublish(r)
	case "fetch":
		return s.doFetch(ctx, r)
	case "announce":
		return s.doAnnounce(ctx, r)
	case "next":
		return s.doNext(ctx, r)
	case "metrics":
		return s.doMetrics()
	case "leave":
		return Response{OK: true}
	}
	return fail(CodeUsage, "unknown op %q (want join, wait, shm, allreduce, publish, fetch, announce, next, metrics, leave)", r.Op)
}

func timeout(r Request, def time.Duration) time.Duration {
	if r.TimeoutS > 0 {
		return time.Duration(r.TimeoutS * float64(time.Second))
	}
	return def
}

func (s *session) doJoin(ctx context.Context, r Request) Response {
	if s.peer != nil {
		return fail(CodeState, "already joined a swarm: one swarm membership per client")
	}
	jc, err := s.cfg.Join(r.Args)
	if err != nil {
		return fail(CodeUsage, "join: %v", err)
	}
	model := "torch"
	if r.Model != "" {
		model += ":" + r.Model
	}
	jc.Swarm.Gossip.Model = model
	if jc.Swarm.Log == nil {
		jc.Swarm.Log = s.cfg.Log
	}
	p, err := swarm.Start(ctx, jc.Swarm)
	if err != nil {
		return fail(CodeFailed, "join: starting the peer: %v", err)
	}
	for _, a := range jc.Connect {
		if err := dial(ctx, p, a); err != nil {
			p.Close()
			return fail(CodeFailed, "join: connecting to %s: %v", a, err)
		}
	}
	s.peer, s.join, s.models = p, jc, model
	resp := Response{OK: true, ID: string(p.ID())}
	for _, a := range p.Node.Addrs() {
		resp.Addrs = append(resp.Addrs, a.String()+"/p2p/"+string(p.ID()))
	}
	return resp
}

// dial connects to a multiaddr with /p2p/ID, retrying for connectTimeout.
func dial(ctx context.Context, p *swarm.Peer, addr string) error {
	m, err := ma.NewMultiaddr(addr)
	if err != nil {
		return err
	}
	ai, err := peer.AddrInfoFromP2pAddr(m)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	return p.Node.ConnectRetry(ctx, *ai)
}

func (s *session) doWait(ctx context.Context, r Request) Response {
	if s.peer == nil {
		return fail(CodeState, "wait before join")
	}
	d := timeout(r, s.join.Wait)
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	if err := s.peer.WaitPeers(wctx, s.join.MinPeers); err != nil {
		return fail(CodeTimeout, "waiting %v for %d peers (have %d): %v", d, s.join.MinPeers, len(s.peer.Members()), err)
	}
	// Let every peer see the same set: two heartbeats.
	select {
	case <-wctx.Done():
		return fail(CodeTimeout, "waiting for peers: %v", wctx.Err())
	case <-time.After(2 * s.join.Swarm.Gossip.HeartbeatInterval):
	}
	s.group = s.peer.Members()
	return Response{OK: true, Members: ids(s.group)}
}

func ids(xs []peerid.ID) []string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = string(x)
	}
	return out
}

func (s *session) doShm(r Request) Response {
	if r.Bytes <= 0 || r.Bytes%4 != 0 {
		return fail(CodeUsage, "shm: bytes %d: want a positive multiple of 4", r.Bytes)
	}
	f, err := os.OpenFile(r.Path, os.O_RDWR, 0)
	if err != nil {
		return fail(CodeUsage, "shm: %v", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fail(CodeUsage, "shm: %v", err)
	}
	if fi.Size() < r.Bytes {
		return fail(CodeUsage, "shm: %s holds %d bytes, not %d", r.Path, fi.Size(), r.Bytes)
	}
	b, err := mapShared(f, int(r.Bytes))
	if err != nil {
		return fail(CodeUsage, "shm: mmap %s: %v", r.Path, err)
	}
	s.unmap()
	s.shm = b
	s.vals = unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4)
	return Response{OK: true}
}

func (s *session) unmap() {
	if s.shm != nil {
		unmapShared(s.shm)
		s.shm, s.vals = nil, nil
	}
}

// span returns count float32 values at byte offset off of the shared
// memory.
func (s *session) span(name string, off, count int64) ([]float32, error) {
	if s.vals == nil {
		return nil, errors.New("no shared memory: send shm first")
	}
	if off < 0 || off%4 != 0 || count < 0 || off/4+count > int64(len(s.vals)) {
		return nil, fmt.Errorf("%s: %d values at byte %d do not fit the %d-byte shared memory (or are unaligned)", name, count, off, len(s.shm))
	}
	return s.vals[off/4 : off/4+count], nil
}

// runner returns the runner of a round's settings: the peer's, with the
// given rule, codec and a model id that covers the tensors' shapes.
func (s *session) runner(ruleSpec, codec string, shapes [][]int) (*aggregate.Runner, error) {
	h := sha256.New()
	fmt.Fprintf(h, "%v", shapes)
	layout := hex.EncodeToString(h.Sum(nil)[:8])
	key := ruleSpec + "|" + codec + "|" + layout
	if r, ok := s.runners[key]; ok {
		return r, nil
	}
	cfg := s.peer.Runner.Config()
	cfg.Model = s.models + "/" + layout
	if ruleSpec != "" {
		ru, err := rule.Parse(ruleSpec)
		if err != nil {
			return nil, err
		}
		cfg.Rule = ru
	}
	if codec != "" {
		sp, err := compression.ParseSpec(codec)
		if err != nil {
			return nil, err
		}
		cfg.Compress = sp
	}
	var opts []aggregate.Option
	if s.join.Swarm.Log != nil {
		opts = append(opts, aggregate.WithLogger(s.join.Swarm.Log))
	}
	r, err := aggregate.NewRunner(p2p.ID(s.peer.Node.ID()), s.peer.Transport, cfg, opts...)
	if err != nil {
		return nil, err
	}
	if c := r.Compression(); c != nil {
		layout := make([]compression.Shape, 0, len(shapes))
		for _, sh := range shapes {
			n := 1
			for _, d := range sh {
				n *= d
			}
			rows, cols := 1, n
			if len(sh) >= 2 && sh[0] > 0 {
				rows, cols = sh[0], n/sh[0]
			}
			layout = append(layout, compression.Shape{Rows: rows, Cols: cols})
		}
		if err := c.SetLayout(layout); err != nil {
			return nil, err
		}
	}
	if len(s.runners) >= maxRunners {
		clear(s.runners)
	}
	s.runners[key] = r
	return r, nil
}

func (s *session) doAllReduce(ctx context.Context, r Request) Response {
	switch {
	case s.peer == nil:
		return fail(CodeState, "allreduce before join")
	case s.group == nil:
		return fail(CodeState, "allreduce before wait (the group is fixed once --min-peers are there)")
	case s.out != nil:
		return fail(CodeExcluded, "this peer is out of the group since an earlier round (%v); leave and join again", s.out)
	}
	src, err := s.span("src", r.Src, r.Count)
	if err != nil {
		return fail(CodeUsage, "allreduce: %v", err)
	}
	dst, err := s.span("dst", r.Dst, r.Count)
	if err != nil {
		return fail(CodeUsage, "allreduce: %v", err)
	}
	var n int64
	for _, sh := range r.Shapes {
		k := int64(1)
		for _, d := range sh {
			if d < 0 {
				return fail(CodeUsage, "allreduce: negative dimension in shape %v", sh)
			}
			k *= int64(d)
		}
		n += k
	}
	if n != r.Count {
		return fail(CodeUsage, "allreduce: shapes %v hold %d values, count is %d", r.Shapes, n, r.Count)
	}
	w := r.Weight
	if w == 0 {
		w = 1
	}
	if !(w > 0) || math.IsInf(w, 0) {
		return fail(CodeUsage, "allreduce: weight %v must be positive and finite", r.Weight)
	}
	run, err := s.runner(r.Rule, r.Codec, r.Shapes)
	if err != nil {
		return fail(CodeUsage, "allreduce: %v", err)
	}
	s.round++
	cctx, cancel := context.WithTimeout(ctx, timeout(r, defaultCallTimeout))
	defer cancel()
	start := time.Now()
	res, err := run.AllReduceAmong(cctx, s.round, s.group, dst, src, w)
	s.stats.seconds += time.Since(start).Seconds()
	resp := Response{Round: s.round, Algorithm: res.Algorithm.String(), Attempts: res.Attempts}
	for _, pe := range res.Excluded {
		resp.Excluded = append(resp.Excluded, pe.Error())
	}
	if err != nil {
		s.stats.failed++
		var pe *aggregate.PeerError
		switch {
		case errors.Is(err, aggregate.ErrExcluded) && errors.As(err, &pe) && (errors.Is(pe.Err, aggregate.ErrConfigMismatch) || errors.Is(pe.Err, aggregate.ErrBadLength)):
			s.out = err
			resp.Code = CodeMismatch
			resp.Error = fmt.Sprintf("round %d: the other peers left this one out: its tensors (shapes %v, %d values, rule %q, codec %q) differ from theirs (%v)", s.round, r.Shapes, r.Count, r.Rule, r.Codec, err)
		case errors.Is(err, aggregate.ErrExcluded):
			s.out = err
			resp.Code, resp.Error = CodeExcluded, fmt.Sprintf("round %d: %v", s.round, err)
		case cctx.Err() != nil && ctx.Err() == nil:
			resp.Code, resp.Error = CodeTimeout, fmt.Sprintf("round %d: no result within %v: %v", s.round, timeout(r, defaultCallTimeout), err)
		default:
			resp.Code, resp.Error = CodeFailed, fmt.Sprintf("round %d: %v", s.round, err)
		}
		s.stats.last = resp
		return resp
	}
	s.group = res.Group.Sorted()
	s.stats.ok++
	s.stats.values += r.Count
	resp.OK, resp.Group, resp.Total = true, ids(s.group), res.Weight
	s.stats.last = resp
	return resp
}

func (s *session) doPublish(r Request) Response {
	if s.peer == nil {
		return fail(CodeState, "publish before join")
	}
	src, err := s.span("src", r.Src, r.Count)
	if err != nil {
		return fail(CodeUsage, "publish: %v", err)
	}
	s.peer.Net(1).Publish(r.Version, src)
	return Response{OK: true}
}

func (s *session) doFetch(ctx context.Context, r Request) Response {
	if s.peer == nil {
		return fail(CodeState, "fetch before join")
	}
	dst, err := s.span("dst", r.Dst, r.Count)
	if err != nil {
		return fail(CodeUsage, "fetch: %v", err)
	}
	d := timeout(r, time.Minute)
	cctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	v, err := s.peer.Fetch(cctx, s.peer.Members(), r.Version, dst)
	if err != nil {
		code := CodeFailed
		if cctx.Err() != nil {
			code = CodeTimeout
		}
		return fail(code, "fetch: state of version ≥ %d (%d values) from %d peers: %v", r.Version, r.Count, len(s.peer.Members())-1, err)
	}
	return Response{OK: true, StateVersion: v}
}

func (s *session) doMetrics() Response {
	m := map[string]any{
		"rounds_ok": s.stats.ok, "rounds_failed": s.stats.failed, "allreduce_seconds": s.stats.seconds,
		"values_reduced": s.stats.values, "round": s.round, "last": s.stats.last,
	}
	if s.peer != nil {
		m["id"], m["members"], m["group"] = string(s.peer.ID()), ids(s.peer.Members()), ids(s.group)
		if mf, err := s.peer.Node.Registry().Gather(); err == nil {
			prom := map[string]float64{}
			for _, f := range mf {
				if !strings.HasPrefix(f.GetName(), "starling_") && !strings.HasPrefix(f.GetName(), "libp2p_") {
					continue
				}
				for _, x := range f.GetMetric() {
					switch {
					case x.Counter != nil:
						prom[f.GetName()] += x.Counter.GetValue()
					case x.Gauge != nil:
						prom[f.GetName()] += x.Gauge.GetValue()
					}
				}
			}
			m["prometheus"] = prom
		}
	}
	return Response{OK: true, Metrics: m}
}

// close leaves the swarm: the heartbeat says this peer stopped, so the
// others drop it at once, and the peer closes.
func (s *session) close() {
	if s.peer != nil {
		s.peer.Control.SetStatus(wire.Status{Version: s.round, Stopped: true})
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		s.peer.Control.Beat(ctx)
		cancel()
		if s.async != nil {
			s.async.T.Close()
			s.async = nil
		}
		s.peer.Close()
		s.peer = nil
	}
	s.unmap()
}
