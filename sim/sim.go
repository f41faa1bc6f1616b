package sim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	coreconnmgr "github.com/libp2p/go-libp2p/core/connmgr"
	"github.com/libp2p/go-libp2p/p2p/net/connmgr"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/starling-ml/starling/aggregate"
	"github.com/starling-ml/starling/data"
	"github.com/starling-ml/starling/internal/ctxtime"
	"github.com/starling-ml/starling/internal/rusage"
	"github.com/starling-ml/starling/nn"
	"github.com/starling-ml/starling/node"
	"github.com/starling-ml/starling/peerid"
	"github.com/starling-ml/starling/swarm"
	"github.com/starling-ml/starling/train"
)

// Peer is one simulated peer, as a strategy sees it: a swarm.Peer, as
// `peer run` builds on a real host, on a mocknet host.
type Peer struct {
	Index  int
	ID     peerid.ID
	Host   host.Host
	Swarm  *swarm.Peer
	Worker *train.Worker
	// Group is every peer's ID, sorted: the topology gossip strategies use.
	Group []peerid.ID
	// Rec receives the peer's snapshots and events.
	Rec train.Recorder
	// Config is the experiment's configuration.
	Config *Config
	// Log is the experiment's logger.
	Log *slog.Logger

	delayMu  sync.Mutex
	delayRng *rand.Rand
	sent     atomic.Int64 // bytes of all-reduce chunks sent
}

// Delay draws one message delay, uniform in [0, Config.Delay]. Safe for
// concurrent use.
func (p *Peer) Delay() time.Duration {
	if p.Config.Delay <= 0 {
		return 0
	}
	p.delayMu.Lock()
	defer p.delayMu.Unlock()
	return time.Duration(p.delayRng.Int64N(int64(p.Config.Delay) + 1))
}

// Sleep waits d or until ctx ends (ctxtime.Sleep).
func Sleep(ctx context.Context, d time.Duration) error { return ctxtime.Sleep(ctx, d) }

// Option sets an extra of Run.
type Option func(*options)

type options struct{ log *slog.Logger }

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// seededReader is an io.Reader of seeded pseudo-random bytes, for
// reproducible peer keys.
type seededReader struct{ r *rand.ChaCha8 }

func (s seededReader) Read(b []byte) (int, error) { return s.r.Read(b) }

func seed32(seed uint64, salt string) [32]byte {
	var s [32]byte
	r := rand.New(rand.NewPCG(seed, uint64(len(salt))*0x9e3779b97f4a7c15))
	for i := range s {
		s[i] = byte(r.Uint32())
	}
	copy(s[24:], salt)
	return s
}

// Run runs one experiment and evaluates it. The training phase lasts
// cfg.Duration (less with StopAtTarget); ctx cancels the whole run.
// trainSet and testSet are not modified.
func Run(ctx context.Context, cfg Config, trainSet, testSet *data.Set, opts ...Option) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	o := options{log: slog.New(slog.DiscardHandler)}
	for _, opt := range opts {
		opt(&o)
	}
	if !cfg.Compress.IsZero() {
		cfg.Async.Codec = cfg.Compress
	}
	trainSet, testSet = trainSet.Head(cfg.TrainLimit), testSet.Head(cfg.TestLimit)
	probe, err := nn.New(cfg.Worker.Model, 0)
	if err != nil {
		return nil, err
	}
	cfg.Async.Model, cfg.Gossip.Seed = probe.Arch, cfg.Seed
	cfg.Async.SnapshotEvery, cfg.Gossip.SnapshotEvery = cfg.SnapshotEvery, cfg.SnapshotEvery
	strat := lookup(cfg.Strategy)

	parts, err := data.Partition(trainSet, cfg.Peers, cfg.Partition, cfg.Seed)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	formStart := time.Now()
	sw, err := newNetwork(ctx, &cfg, o.log, formation{quorum: cfg.Quorum})
	if err != nil {
		return nil, err
	}
	defer sw.close()
	formed := time.Since(formStart)
	spread, reached := sw.dissemination(ctx, o.log)
	o.log.Info("sim: formed", "peers", cfg.Peers, "wall", formed, "heartbeat", sw.beat,
		"dissemination", spread, "reached", reached)

	rec := &simRecorder{mem: &train.MemRecorder{}, gap: cfg.SnapshotEvery, names: map[string]string{},
		latest: map[string][]float32{}, last: map[string]time.Duration{}}
	peers := make([]*Peer, cfg.Peers)
	for i := range peers {
		wc := cfg.Worker
		wc.DataSeed = cfg.Seed*1000 + uint64(i) + 1
		wc.Slowdown = max(cfg.Slow[i], 1)
		w, err := train.NewWorker(wc, trainSet.Subset(parts[i]))
		if err != nil {
			return nil, fmt.Errorf("sim: peer %d: %w", i, err)
		}
		p := sw.peers[i]
		p.Worker, p.Rec, p.Log = w, rec, o.log
		rec.names[string(p.ID)] = peerName(i)
		peers[i] = p
	}

	o.log.Info("sim: start", "strategy", cfg.Label(), "peers", cfg.Peers, "duration", cfg.Duration)
	runCtx, stop := context.WithTimeout(ctx, cfg.Duration)
	defer stop()
	rec.start = time.Now()
	var wg sync.WaitGroup
	errs := make([]error, cfg.Peers)
	summaries := make([]any, cfg.Peers)
	for i, p := range peers {
		pctx, kill := context.WithCancel(runCtx)
		if at, ok := cfg.Kill[i]; ok {
			t := time.AfterFunc(at, func() {
				o.log.Info("sim: killing peer", "peer", i)
				kill()
				sw.kill(i)
			})
			defer t.Stop()
		}
		wg.Go(func() {
			defer kill()
			summaries[i], errs[i] = strat(pctx, p)
			if errors.Is(errs[i], context.Canceled) || errors.Is(errs[i], context.DeadlineExceeded) {
				errs[i] = nil
			}
		})
	}
	if cfg.StopAtTarget {
		wg.Go(func() { monitor(runCtx, stop, &cfg, rec, testSet, o.log) })
	}
	cpu0 := rusage.CPU()
	wg.Wait()
	wall := time.Since(rec.start)
	cpu := rusage.CPU() - cpu0
	stop()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for i, err := range errs {
		if err != nil {
			if _, killed := cfg.Kill[i]; !killed {
				return nil, fmt.Errorf("sim: peer %d: %w", i, err)
			}
		}
	}
	o.log.Info("sim: evaluating", "snapshots", rec.count())
	pts, err := rec.mem.Evaluate(cfg.Worker.Model, testSet)
	if err != nil {
		return nil, err
	}
	res := &Result{Config: cfg, Points: pts, Events: rec.mem.Events()}
	res.summarise(wall, summaries)
	res.Summary.Scale = Scale{FormS: formed.Seconds(), HeartbeatS: sw.beat.Seconds(), Quorum: sw.quorum,
		DisseminationS: spread.Seconds(), DisseminationBeats: spread.Seconds() / sw.beat.Seconds(), Reached: reached,
		TrainCPUS: cpu.Seconds(), MaxRSSMiB: float64(rusage.PeakRSS()) / (1 << 20)}
	return res, nil
}

func peerName(i int) string { return fmt.Sprintf("p%d", i) }

// network is the simulated network: a mocknet with one host per peer, each
// running a swarm.Peer.
type network struct {
	mn     mocknet.Mocknet
	peers  []*Peer
	beat   time.Duration // the control plane's heartbeat period
	quorum int           // the view each peer had before training

	mu     sync.Mutex
	killed map[int]bool
}

// swarmConfig is what every simulated peer runs with.
func swarmConfig(cfg *Config, model string, log *slog.Logger) swarm.Config {
	sc := swarm.DefaultConfig()
	sc.Node = node.TestConfig()
	sc.Node.MaxTensorBytes = 256 << 20
	sc.Node.MaxParkedBytes = 512 << 20
	sc.Node.IOTimeout = 10 * time.Second
	sc.Node.RecvTimeout = 30 * time.Second
	sc.Gossip.Namespace, sc.Gossip.Model = "sim", model
	beat := cfg.Heartbeat
	if beat <= 0 {
		beat = heartbeat(cfg.Peers)
	}
	sc.Gossip.HeartbeatInterval, sc.Gossip.PeerTTL = beat, 8*beat
	// Replay state must outlive a peer's TTL (gossip.Config.Validate);
	// 10 min by default, shorter than 8 periods of a swarm's heartbeats
	// beyond 256 peers.
	sc.Gossip.ReplayRetention = max(sc.Gossip.ReplayRetention, sc.Gossip.PeerTTL)
	sc.Gossip.AnnounceQueue = 1024
	sc.Aggregate.StallTimeout = cfg.StallTimeout
	sc.Aggregate.Algorithm, _ = aggregate.ParseAlgorithm(cfg.SyncAlgorithm) // checked by Validate
	sc.Aggregate.Compress = cfg.Compress
	sc.Log = log
	return sc
}

// heartbeat is the simulated peers' heartbeat interval: 250 ms, longer
// beyond 16 peers. Every heartbeat reaches every peer, so one period
// costs the process n(n−1) deliveries, about 240 µs of CPU each
// (signature check, GossipSub's duplicates over the mesh, GC;
// TestScaleControlPlane at 64 peers): 16 s at 256 peers. Up to 17 peers
// the period is n² ms (at 100 peers and 1 s the validation queues of
// GossipSub overflowed on 2 cores and peers never saw each other);
// beyond, n² × 2.5 ms keeps heartbeats to about a tenth of one core.
// Nothing waits a period: peers beat once connected and train once they
// see formQuorum others; the period only bounds how fresh views and
// statuses are (2.7 min at 256 peers, 44 min at 1,024).
func heartbeat(n int) time.Duration {
	if n > fullMesh+1 {
		return time.Duration(n*n) * 2500 * time.Microsecond
	}
	return max(250*time.Millisecond, time.Duration(n*n)*time.Millisecond)
}

// formation says how newNetwork waits for the peers to see each other.
type formation struct {
	// loose goes on, with a warning, when some peer has not seen quorum
	// others by the deadline: for runs whose members are fixed and do not
	// come from the control plane's views (Federation).
	loose bool
	// quorum is how many other peers each must see (0: formQuorum).
	quorum int
	// wait bounds the wait (0: formWait of the swarm's size).
	wait time.Duration
}

// formQuorum is how many other peers each of n peers must see before
// training starts. Strategies whose group is fixed at the start (sync's
// all-reduce job, ps's servers) and swarms of up to fullMesh+1 peers wait
// for everyone. Beyond, the others start once they see fullMesh peers:
// gossip draws its partners from the live view, async strategies fetch
// from whoever announces, and the views keep filling with every heartbeat
// while they train. Waiting for full views made formation take as long as
// the slowest of n² heartbeat deliveries (26 min at 256 peers).
func formQuorum(n int, strategy string) int {
	if n <= fullMesh+1 || strategy == "sync" || strategy == "ps" {
		return n - 1
	}
	if strategy == "local" {
		return 0
	}
	return fullMesh
}

// formWait is how long every peer is given to see its quorum: a few
// heartbeats, and some time a peer for its handshakes.
func formWait(n int, beat time.Duration) time.Duration {
	return 30*time.Second + 10*beat + time.Duration(n)*50*time.Millisecond
}

func newNetwork(ctx context.Context, cfg *Config, log *slog.Logger, form formation) (*network, error) {
	sw := &network{mn: mocknet.New(), killed: map[int]bool{}}
	ok := false
	defer func() {
		if !ok {
			sw.close()
		}
	}()
	sw.mn.SetLinkDefaults(mocknet.LinkOptions{Latency: cfg.Latency, Bandwidth: cfg.Bandwidth})
	probe, err := nn.New(cfg.Worker.Model, 0)
	if err != nil {
		return nil, err
	}
	sc := swarmConfig(cfg, probe.Arch, log)
	sw.beat = sc.Gossip.HeartbeatInterval
	keys := seededReader{rand.NewChaCha8(seed32(cfg.Seed, "peer-keys"))}
	for i := range cfg.Peers {
		sk, _, err := crypto.GenerateEd25519Key(keys)
		if err != nil {
			return nil, err
		}
		ip := net.IPv4(10, byte(i>>16), byte(i>>8), byte(i))
		addr, err := ma.NewMultiaddr(fmt.Sprintf("/ip4/%s/tcp/4242", ip))
		if err != nil {
			return nil, err
		}
		mh, err := sw.mn.AddPeer(sk, addr)
		if err != nil {
			return nil, fmt.Errorf("sim: mocknet peer %d: %w", i, err)
		}
		h, err := withConnManager(mh, sc.Node)
		if err != nil {
			return nil, fmt.Errorf("sim: peer %d: %w", i, err)
		}
		p := &Peer{Index: i, ID: peerid.ID(h.ID().String()), Host: h, Config: cfg,
			delayRng: rand.New(rand.NewPCG(cfg.Seed, uint64(i)+0xde1a7))}
		// Routers before connections: GossipSub learns a peer's topics
		// when it connects.
		sp, err := swarm.Attach(h, sc, swarm.WithAllReduceTransport(func(t aggregate.Transport) aggregate.Transport {
			return &simTransport{Transport: t, p: p}
		}))
		if err != nil {
			return nil, fmt.Errorf("sim: peer %d: %w", i, err)
		}
		p.Swarm = sp
		sw.peers = append(sw.peers, p)
	}
	log.Info("sim: hosts up", "peers", len(sw.peers), "heartbeat", sw.beat)
	if err := sw.mn.LinkAll(); err != nil {
		return nil, err
	}
	if err := sw.connect(cfg.Seed); err != nil {
		return nil, err
	}
	log.Info("sim: connected; waiting for the views", "peers", len(sw.peers))
	group := make([]peerid.ID, len(sw.peers))
	for i, p := range sw.peers {
		group[i] = p.ID
	}
	slices.Sort(group)
	wait := form.wait
	if wait <= 0 {
		wait = formWait(len(sw.peers), sw.beat)
	}
	sw.quorum = form.quorum
	if sw.quorum <= 0 {
		sw.quorum = formQuorum(len(sw.peers), cfg.Strategy)
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	// Each control plane beat when it started, before it had any
	// connection: nobody heard that beat, and the next comes a period
	// later (minutes in a large swarm). Beat once more, now connected,
	// all at once: a publish waits for its router, busy with the others'.
	var beats sync.WaitGroup
	defer beats.Wait() // before cancel: bounded by wctx, done on every path that returns
	for i, p := range sw.peers {
		beats.Go(func() {
			if err := p.Swarm.Control.Beat(wctx); err != nil && wctx.Err() == nil {
				log.Warn("sim: first heartbeat", "peer", i, "err", err)
			}
		})
	}
	for _, p := range sw.peers {
		p.Group = group
	}
	for i, p := range sw.peers {
		if _, err := p.Swarm.Control.WaitPeers(wctx, sw.quorum); err != nil {
			err = fmt.Errorf("sim: peer %d saw %d of the %d peers it needs: %w", i, len(p.Swarm.Control.Peers()), sw.quorum, err)
			if !form.loose || ctx.Err() != nil {
				return nil, err
			}
			log.Warn("sim: going on with partial views", "err", err)
			break
		}
	}
	ok = true
	return sw, nil
}

// fullMesh is the largest swarm whose peers all connect to each other at
// the start; a larger one connects each peer to about fullMesh others
// (GossipSub spreads the control messages over them, and a stream to any
// other peer dials it when first needed), as a real swarm would: with
// every pair connected, GossipSub sends each message to every peer it is
// connected to and its validation queues overflowed at 100 peers.
const fullMesh = 16

// connect opens the swarm's first connections: every pair up to fullMesh
// peers; beyond, a ring plus random links, seeded.
func (sw *network) connect(seed uint64) error {
	n := len(sw.peers)
	if n <= fullMesh {
		return sw.mn.ConnectAllButSelf()
	}
	r := rand.New(rand.NewPCG(seed, 0xc0ffee))
	dial := func(i, j int) error {
		if i == j {
			return nil
		}
		_, err := sw.mn.ConnectPeers(sw.peers[i].Host.ID(), sw.peers[j].Host.ID())
		return err
	}
	for i := range n {
		if err := dial(i, (i+1)%n); err != nil {
			return err
		}
		for range fullMesh/2 - 1 {
			if err := dial(i, r.IntN(n)); err != nil {
				return err
			}
		}
	}
	return nil
}

// kill stops peer i's network: its control plane and node close and its
// host leaves the mocknet, so others see resets and silence.
func (sw *network) kill(i int) {
	sw.mu.Lock()
	if sw.killed[i] {
		sw.mu.Unlock()
		return
	}
	sw.killed[i] = true
	sw.mu.Unlock()
	p := sw.peers[i]
	p.Swarm.Close()
	p.Swarm.Node.Close()
	p.Host.Close()
}

// cmHost is a mocknet host with the connection manager a real peer has
// (node.New's, with its watermarks and grace period), which mocknet's
// hosts lack: without it a simulated peer keeps every connection that any
// round opened, and a federation of 256 clients gained 500 connections
// and 4,500 goroutines a round.
type cmHost struct {
	host.Host
	cm *connmgr.BasicConnMgr
}

func withConnManager(h host.Host, cfg node.Config) (host.Host, error) {
	cm, err := connmgr.NewConnManager(cfg.ConnLow, cfg.ConnHigh, connmgr.WithGracePeriod(cfg.ConnGrace))
	if err != nil {
		return nil, err
	}
	h.Network().Notify(cm.Notifee())
	return cmHost{h, cm}, nil
}

// ConnManager implements host.Host.
func (h cmHost) ConnManager() coreconnmgr.ConnManager { return h.cm }

// Close implements host.Host.
func (h cmHost) Close() error {
	h.cm.Close()
	return h.Host.Close()
}

// close closes every live peer, all at once: a peer's close waits for its
// GossipSub loop, which on a CPU-starved process of hundreds of peers can
// be working through a backlog of heartbeats, and one close after another
// kept a 256-peer run from returning its summary for over an hour.
func (sw *network) close() {
	var wg sync.WaitGroup
	for i, p := range sw.peers {
		sw.mu.Lock()
		dead := sw.killed[i]
		sw.killed[i] = true
		sw.mu.Unlock()
		if dead {
			continue
		}
		wg.Go(func() {
			p.Swarm.Close()
			p.Swarm.Node.Close()
		})
	}
	wg.Wait()
	sw.mn.Close()
}

// simRecorder forwards to a MemRecorder under peer names p0, p1, … with
// the experiment's own clock, keeps at most one snapshot per peer every
// gap (the first and the ones after it), and keeps each peer's latest
// parameters for the monitor.
type simRecorder struct {
	mem   *train.MemRecorder
	start time.Time
	gap   time.Duration
	names map[string]string // read-only during the run

	mu     sync.Mutex
	latest map[string][]float32
	last   map[string]time.Duration
	n      int
}

var _ train.Recorder = (*simRecorder)(nil)

func (r *simRecorder) name(p string) string {
	if n, ok := r.names[p]; ok {
		return n
	}
	return p
}

func (r *simRecorder) Snapshot(p string, _ time.Duration, updates int, params []float32) {
	name := r.name(p)
	at := time.Since(r.start)
	r.mu.Lock()
	defer r.mu.Unlock()
	if prev, ok := r.last[name]; ok && at-prev < r.gap {
		return
	}
	r.last[name] = at
	r.mem.Snapshot(name, at, updates, params)
	r.latest[name] = append(r.latest[name][:0], params...)
	r.n++
}

func (r *simRecorder) Event(e train.Event) {
	e.Peer = r.name(e.Peer)
	e.At = time.Since(r.start)
	r.mem.Event(e)
}

func (r *simRecorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}

// monitor evaluates the latest snapshots every MonitorEvery and calls stop
// once their mean test accuracy reaches the target.
func monitor(ctx context.Context, stop func(), cfg *Config, rec *simRecorder, test *data.Set, log *slog.Logger) {
	m, err := nn.New(cfg.Worker.Model, 0)
	if err != nil {
		return
	}
	tick := time.NewTicker(cfg.MonitorEvery)
	defer tick.Stop()
	var params [][]float32
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		rec.mu.Lock()
		params = params[:0]
		names := make([]string, 0, len(rec.latest))
		for n := range rec.latest {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			params = append(params, slices.Clone(rec.latest[n]))
		}
		rec.mu.Unlock()
		if len(params) < cfg.Peers {
			continue
		}
		sum := 0.0
		for _, p := range params {
			copy(m.Params, p)
			_, acc := m.Evaluate(test.X, test.Y, 1000)
			sum += acc
		}
		mean := sum / float64(len(params))
		log.Info("sim: monitor", "mean_accuracy", mean)
		if mean >= cfg.Target {
			stop()
			return
		}
	}
}
