package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"runtime/pprof"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/starling-ml/starling/aggregate"
	"github.com/starling-ml/starling/aggregate/rule"
	"github.com/starling-ml/starling/internal/cli"
	"github.com/starling-ml/starling/node"
	"github.com/starling-ml/starling/peerid"
	"github.com/starling-ml/starling/swarm"
)

func init() {
	registerBench(&command{name: "allreduce", summary: "all-reduce timing, one process per host (prints the line of gloo_allreduce.py)", run: runBenchAllReduce})
}

// allReduceBench is what `peer bench allreduce` was told.
type allReduceBench struct {
	cfg     swarm.Config
	peers   []*peer.AddrInfo // --peers, in rank order (this process included)
	connect []string         // --connect
	world   int
	bytes   int
	iters   int
	warmup  int
	wait    time.Duration
	master  bool // prints the result line
	label   string
	mean    bool // --rule mean: weighted by rank+1

	cpuProfile string
}

// parseAllReduceBench reads the flags of `peer bench allreduce`.
func parseAllReduceBench(args []string, stderr io.Writer) (*allReduceBench, error) {
	fs := newFlagSet("bench allreduce", stderr)
	listen := fs.String("listen", "/ip4/0.0.0.0/tcp/4001", "multiaddr to listen on")
	var peers, connect, bootstrap cli.List
	fs.Var(&peers, "peers", "multiaddrs (with /p2p/ID) of every process in rank order, this one included; rank 0 prints (alternative to --connect)")
	fs.Var(&connect, "connect", "multiaddrs (with /p2p/ID) to dial; membership then comes from gossip and the process started without --connect/--bootstrap prints")
	fs.Var(&bootstrap, "bootstrap", "DHT bootstrap multiaddrs (with /p2p/ID); turns the DHT rendezvous on")
	world := fs.Int("world", 0, "number of processes (default: the length of --peers)")
	key := fs.String("key", "", "identity key file, created if missing (default: a fresh identity; --peers needs stable ones: peer keygen --key F prints the ID)")
	psk := fs.String("psk", "", "swarm key file (all processes)")
	insecure := fs.Bool("insecure", false, insecureUsage)
	muxer := fs.String("muxer", node.DefaultConfig().Muxer, muxerUsage)
	sizeMB := fs.Float64("size-mb", 64, "vector size in MB (10^6 bytes, as gloo_allreduce.py)")
	iters := fs.Int("iters", 5, "timed all-reduces")
	warmup := fs.Int("warmup", 1, "untimed all-reduces first")
	algo := fs.String("algo", "auto", "all-reduce algorithm: tree, butterfly, ring or auto")
	ruleName := fs.String("rule", "sum", "sum, or mean (rank r weighted r+1, as training weighs by samples)")
	chunkKB := fs.Int("chunk-kb", 0, "values per pipelined chunk, in KiB of float32 (default: aggregate's)")
	stripes := fs.Int("stripes", 0, "streams per tensor (default: node's)")
	stall := fs.Duration("stall-timeout", aggregate.DefaultConfig().StallTimeout, "how long a silent peer is waited for")
	wait := fs.Duration("wait", 2*time.Minute, "how long to wait for the other processes")
	label := fs.String("label", "starling", "first word of the result line")
	logLevel := fs.String("log-level", "warn", "log level: debug, info, warn, error")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the timed all-reduces to this file")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("bench allreduce: unexpected arguments %q", fs.Args())
	}
	b := &allReduceBench{cfg: swarm.DefaultConfig(), world: *world, iters: *iters, warmup: *warmup, wait: *wait, label: *label, cpuProfile: *cpuProfile}
	if len(peers) > 0 && (len(connect) > 0 || len(bootstrap) > 0) {
		return nil, errors.New("bench allreduce: give --peers or --connect/--bootstrap, not both")
	}
	for _, a := range peers {
		ai, err := peer.AddrInfoFromString(a)
		if err != nil {
			return nil, fmt.Errorf("--peers %q: want a multiaddr with /p2p/ID: %v", a, err)
		}
		b.peers = append(b.peers, ai)
	}
	if len(b.peers) > 0 {
		if b.world == 0 {
			b.world = len(b.peers)
		}
		if b.world != len(b.peers) {
			return nil, fmt.Errorf("bench allreduce: --world %d but %d --peers", b.world, len(b.peers))
		}
		if *key == "" {
			return nil, errors.New("bench allreduce: --peers needs --key (a stable identity that the other processes list)")
		}
	}
	if b.world < 1 {
		return nil, errors.New("bench allreduce: give --world N (or --peers)")
	}
	if *iters < 1 || *warmup < 0 {
		return nil, errors.New("bench allreduce: --iters must be ≥ 1 and --warmup ≥ 0")
	}
	if !(*sizeMB > 0) || *sizeMB*1e6 > float64(b.cfg.Node.MaxTensorBytes) {
		return nil, fmt.Errorf("bench allreduce: --size-mb %v not in (0, %d]", *sizeMB, b.cfg.Node.MaxTensorBytes/1e6)
	}
	b.bytes = max(4, int(*sizeMB*1e6)/4*4)
	b.connect = connect
	b.master = len(connect) == 0 && len(bootstrap) == 0

	n := &b.cfg.Node
	n.ListenAddrs = []string{*listen}
	n.KeyFile, n.PSKFile = *key, *psk
	n.Insecure = warnInsecure(*insecure, stderr)
	n.Muxer = *muxer
	n.MDNS, n.NATPortMap, n.HolePunching, n.NATService = false, false, false, false
	n.Bootstrap = bootstrap
	n.DHT = len(bootstrap) > 0 || (len(connect) == 0 && len(b.peers) == 0)
	if *stripes > 0 {
		n.Stripes = *stripes
	}
	b.cfg.Gossip.Namespace = "bench-allreduce"
	b.cfg.Gossip.Model = "bench"
	a, err := aggregate.ParseAlgorithm(*algo)
	if err != nil {
		return nil, err
	}
	ag := &b.cfg.Aggregate
	ag.Rule, ag.Algorithm, ag.StallTimeout = rule.Sum{}, a, *stall
	switch *ruleName {
	case "sum":
	case "mean":
		ag.Rule, b.mean = rule.Mean{}, true
	default:
		return nil, fmt.Errorf("bench allreduce: --rule %q: want sum or mean", *ruleName)
	}
	if *chunkKB > 0 {
		ag.ChunkElems = *chunkKB << 10 / 4
	}
	if b.cfg.Log, err = textLogger(*logLevel, stderr); err != nil {
		return nil, err
	}
	if err := b.cfg.Validate(); err != nil {
		return nil, err
	}
	return b, nil
}

// runBenchAllReduce times all-reduces of one vector between W processes,
// as ../shared/bench/gloo_allreduce.py does for Gloo: one warm-up, a
// barrier, iters all-reduces (sum), a barrier; the time per all-reduce is
// the total over iters. It checks every result.
func runBenchAllReduce(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	b, err := parseAllReduceBench(args, stderr)
	if err != nil {
		return err
	}
	p, err := swarm.Start(ctx, b.cfg)
	if err != nil {
		return err
	}
	defer p.Close()
	members, rank, err := b.join(ctx, p)
	if err != nil {
		return err
	}
	if len(b.peers) > 0 {
		b.master = rank == 0
	}
	d := b.bytes / 4
	src := make([]float32, d)
	dst := make([]float32, d)
	// Each rank contributes rank+1 (a sum of small integers is exact), so
	// every result must be W(W+1)/2 everywhere; a mean weighs it by rank+1
	// too: Σ(r+1)² / Σ(r+1) = (2W+1)/3.
	for i := range src {
		src[i] = float32(rank + 1)
	}
	want := float32(b.world * (b.world + 1) / 2)
	weight := 1.0
	if b.mean {
		want, weight = float32(float64(2*b.world+1)/3), float64(rank+1)
	}
	round := uint64(0)
	one := func(v, out []float32) error {
		round++
		w := weight
		if len(v) == 1 {
			w = 1 // the barrier
		}
		res, err := p.Runner.AllReduceAmong(ctx, round, members, out, v, w)
		if err != nil {
			return err
		}
		if len(res.Excluded) > 0 {
			// A time without everyone is no measurement of W processes.
			return fmt.Errorf("bench allreduce: round %d went on without some processes: %v", round, res.Excluded)
		}
		return nil
	}
	bar := []float32{1}
	barOut := []float32{0}
	barrier := func() error { return one(bar, barOut) }
	check := func() error {
		off := func(x float32) bool { return x != want }
		if b.mean { // the division rounds: within a float32 step
			off = func(x float32) bool { return math.Abs(float64(x-want)) > 1e-6*float64(want) }
		}
		if i := slices.IndexFunc(dst, off); i >= 0 {
			return fmt.Errorf("bench allreduce: round %d: value %d is %v, want %v", round, i, dst[i], want)
		}
		return nil
	}
	for range b.warmup {
		if err := one(src, dst); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
		if err := check(); err != nil {
			return err
		}
	}
	if err := barrier(); err != nil {
		return fmt.Errorf("barrier: %w", err)
	}
	stop, err := startCPUProfile(b.cpuProfile)
	if err != nil {
		return err
	}
	defer stop()
	start := time.Now()
	for range b.iters {
		if err := one(src, dst); err != nil {
			return err
		}
	}
	if err := barrier(); err != nil {
		return fmt.Errorf("barrier: %w", err)
	}
	el := time.Since(start) / time.Duration(b.iters)
	if err := check(); err != nil {
		return err
	}
	if b.master {
		fmt.Fprintln(stdout, resultLine(b.label, b.world, b.bytes, el))
	}
	// Stay a moment so that the last votes reach everyone before we go.
	select {
	case <-ctx.Done():
	case <-time.After(500 * time.Millisecond):
	}
	return nil
}

// resultLine formats a result as gloo_allreduce.py does: algbw = bytes /
// time and busbw = algbw·2(W−1)/W (nccl-tests), in MB/s of 10^6 bytes.
func resultLine(label string, world, bytes int, per time.Duration) string {
	t := per.Seconds()
	algbw := float64(bytes) / t / 1e6
	busbw := algbw * 2 * float64(world-1) / float64(world)
	return fmt.Sprintf("%s world=%d bytes=%d time_s=%.4f algbw_MBps=%.1f busbw_MBps=%.1f", label, world, bytes, t, algbw, busbw)
}

// join connects to the others and returns the sorted member ids and this
// process's rank (its position in --peers, or in the sorted ids).
func (b *allReduceBench) join(ctx context.Context, p *swarm.Peer) ([]peerid.ID, int, error) {
	wctx, cancel := context.WithTimeout(ctx, b.wait)
	defer cancel()
	dial := func(ai peer.AddrInfo) error {
		if err := p.Node.ConnectRetry(wctx, ai); err != nil {
			return fmt.Errorf("bench allreduce: connecting to %s: %w", ai.ID, err)
		}
		return nil
	}
	if len(b.peers) > 0 {
		ids := make([]peerid.ID, len(b.peers))
		rank := -1
		for i, ai := range b.peers {
			ids[i] = peerid.ID(ai.ID.String())
			if ai.ID == p.Node.ID() {
				rank = i
			}
		}
		if rank < 0 {
			return nil, 0, fmt.Errorf("bench allreduce: this process (%s) is not in --peers", p.Node.ID())
		}
		errs := make(chan error, len(b.peers))
		for i, ai := range b.peers {
			if i == rank {
				errs <- nil
				continue
			}
			go func() { errs <- dial(*ai) }()
		}
		for range b.peers {
			if err := <-errs; err != nil {
				return nil, 0, err
			}
		}
		// Everyone dials everyone: wait until every other process has
		// dialled us too, i.e. is up, before the first round.
		if err := waitConnected(wctx, p, b.peers); err != nil {
			return nil, 0, err
		}
		members := slices.Clone(ids)
		slices.Sort(members)
		return members, rank, nil
	}
	for _, a := range b.connect {
		ai, err := peer.AddrInfoFromString(a)
		if err != nil {
			return nil, 0, fmt.Errorf("--connect %q: %v", a, err)
		}
		if err := dial(*ai); err != nil {
			return nil, 0, err
		}
	}
	if err := p.WaitPeers(wctx, b.world); err != nil {
		return nil, 0, fmt.Errorf("bench allreduce: waiting for %d processes (have %d): %w", b.world, len(p.Members()), err)
	}
	// Give every process a couple of heartbeats to see the same set.
	select {
	case <-wctx.Done():
		return nil, 0, wctx.Err()
	case <-time.After(2 * b.cfg.Gossip.HeartbeatInterval):
	}
	members := p.Members()
	if len(members) != b.world {
		return nil, 0, fmt.Errorf("bench allreduce: %d processes in the swarm, --world %d", len(members), b.world)
	}
	return members, slices.Index(members, p.ID()), nil
}

// waitConnected waits until p is connected to every peer of ais.
func waitConnected(ctx context.Context, p *swarm.Peer, ais []*peer.AddrInfo) error {
	for {
		missing := ""
		for _, ai := range ais {
			if ai.ID != p.Node.ID() && len(p.Node.Host().Network().ConnsToPeer(ai.ID)) == 0 {
				missing = ai.ID.String()
				break
			}
		}
		if missing == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("bench allreduce: no connection to %s: %w", missing, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// startCPUProfile starts a CPU profile written to path (nothing when path
// is empty) and returns what stops it and closes the file.
func startCPUProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}
