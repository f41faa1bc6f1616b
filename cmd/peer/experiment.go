package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/starling-ml/starling/aggregate/rule"
	"github.com/starling-ml/starling/compression"
	"github.com/starling-ml/starling/data"
	"github.com/starling-ml/starling/sim"
	"github.com/starling-ml/starling/staleness"
)

func init() {
	register(&command{name: "experiment", summary: "simulate N peers in one process and compare strategies (CSV, plots, JSON); lowcomm: compare low-communication strategies on charlm with real peer processes", run: runExperiment})
}

// specList is a repeatable flag whose values may also hold several specs
// separated by ';' (policy specs contain commas: hinge:10,4).
type specList []string

func (l *specList) String() string { return strings.Join(*l, ";") }

func (l *specList) Set(s string) error {
	for _, p := range strings.Split(s, ";") {
		if p = strings.TrimSpace(p); p != "" {
			*l = append(*l, p)
		}
	}
	return nil
}

// parseBandwidth reads a link rate: bytes/s as a plain number, or with a
// unit: bit/s (kbit, Mbit, Gbit) or bytes/s (KB, MB, GB). 0 is unlimited.
func parseBandwidth(s string) (float64, error) {
	s = strings.TrimSpace(s)
	units := []struct {
		suffix string
		mult   float64
	}{{"Gbit", 1e9 / 8}, {"Mbit", 1e6 / 8}, {"kbit", 1e3 / 8}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"B", 1}}
	mult := 1.0
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("experiment: bandwidth %q: want a rate like 1Gbit, 100Mbit, 50MB or bytes/s", s)
	}
	return v * mult, nil
}

var nonWord = regexp.MustCompile(`[^A-Za-z0-9.]+`)

func runExperiment(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "lowcomm" {
		return runLowComm(ctx, args[1:], stdout, stderr)
	}
	def := sim.DefaultConfig()
	fs := newFlagSet("experiment", stderr)
	peers := fs.Int("peers", def.Peers, "number of simulated peers")
	strategy := fs.String("strategy", def.Strategy, "comma-separated strategies to run, one after the other: "+strings.Join(sim.Strategies(), ", "))
	var policies specList
	fs.Var(&policies, "policy", "staleness policy for fedasync/fedbuff (repeat or separate with ';' to compare): const, poly:0.5, hinge:10,4, inv, sqrt, …+ssp:S (default "+def.Async.Policy.String()+")")
	slow := fs.String("slow", "", "slow peers as INDEX:FACTOR,… e.g. 0:4 makes peer 0 four times slower")
	delay := fs.Duration("delay", 0, "delay every message by a uniform random time in [0, DELAY]")
	bandwidth := fs.String("bandwidth", "1Gbit", "link bandwidth: 1Gbit, 100Mbit, 50MB, bytes/s; 0 is unlimited")
	latency := fs.Duration("latency", def.Latency, "link one-way latency")
	seed := fs.Uint64("seed", def.Seed, "seed of everything random (keys, data split and order, init, delays)")
	repeat := fs.Int("repeat", 1, "run every configuration with seeds seed, seed+1, …")
	duration := fs.Duration("duration", def.Duration, "training time of each run")
	target := fs.Float64("target", 0.97, "test accuracy whose time to reach is reported (0: none)")
	stopAt := fs.Bool("stop-at-target", false, "end each run once the mean accuracy over peers reaches --target (a monitor evaluates every --monitor)")
	monitorEvery := fs.Duration("monitor", def.MonitorEvery, "period of the --stop-at-target monitor")
	baseline := fs.String("baseline", "sync", "label of the run that time ratios and accuracy deltas compare against, as the table shows it (e.g. \"fedasync const\")")
	out := fs.String("out", "experiment-out", "output folder")
	dataDir := fs.String("data", "", "folder with the MNIST IDX files (default: the GoMNIST module in the Go module cache)")
	trainLimit := fs.Int("train-limit", 0, "use the first N training samples only (0: all 60000)")
	testLimit := fs.Int("test-limit", 0, "evaluate on the first N test samples only (0: all 10000)")
	partition := fs.String("partition", def.Partition, "data split: iid, shards or dirichlet:α")
	snapshot := fs.Duration("snapshot", def.SnapshotEvery, "how often each peer's model is recorded for evaluation")
	kill := fs.String("kill", "", "peers that die mid-run as INDEX:TIME,… e.g. 2:5s")
	model := fs.String("model", def.Worker.Model, "model: logreg, mlp (784-200-200-10), mlp:784-W-…-10, cnn")
	batch := fs.Int("batch", def.Worker.Batch, "local batch size")
	lr := fs.Float64("lr", float64(def.Worker.LR), "local learning rate")
	opt := fs.String("optimizer", def.Worker.Optimizer, "local optimizer: sgd, momentum, nesterov, adam, adamw")
	localSteps := fs.Int("local-steps", def.Async.LocalSteps, "fedasync/fedbuff: local steps H between publications")
	roundTime := fs.Duration("round-time", def.Async.RoundTime, "fedasync/fedbuff: also end a round after this long (0: rounds are --local-steps steps)")
	alpha := fs.Float64("alpha", def.Async.Alpha, "fedasync: mixing rate α")
	bufK := fs.Int("buffer-k", def.Async.BufferK, "fedbuff: contributions per server step K")
	serverLR := fs.Float64("server-lr", def.Async.ServerLR, "fedbuff: server learning rate η")
	bufRule := def.Async.BufferRule
	fs.Var(rule.Flag{Rule: &bufRule}, "buffer-rule", bufferRuleUsage+" (default "+bufRule.String()+")")
	syncAlgo := fs.String("sync-algo", def.SyncAlgorithm, "sync: all-reduce algorithm (auto, tree, butterfly, ring); butterfly suits the simulated network, where every pair of peers has a link of its own")
	clipPeers := fs.Float64("clip-peers", def.Async.ClipFactor, "fedasync, adpsgd, sgp: "+clipPeersUsage)
	servers := fs.Int("servers", def.PS.Servers, "ps: peers serving a shard each (0: one per four peers), as peer run --servers")
	dcLambda := fs.Float64("dc-lambda", def.PS.DCLambda, "ps: DC-ASGD's λ (0: off), as peer run --dc-lambda")
	psPolicy := def.PS.Policy
	fs.TextVar(&psPolicy, "ps-policy", def.PS.Policy, "ps: staleness policy of pushed gradients, +ssp:S an SSP gate (peer run's --policy in --mode ps)")
	var codec compression.Spec
	fs.TextVar(&codec, "compress", def.Compress, "sync: codec of the gradient all-reduce; fedasync/fedbuff: codec of published vectors; ps: of pushed gradients (fp32, fp16, bf16, int8[:block=N], fp4[:block=N], int4[:block=N], topk:F, randk:F, sign, powersgd:R, with ,ef for error feedback), as peer run --compress")
	fs.TextVar(&codec, "codec", def.Compress, "the older name of --compress")
	stall := fs.Duration("stall-timeout", def.StallTimeout, "all-reduce (sync): how long a silent peer is waited for before it is dropped; ps: how long a worker waits for a server before it fails over, and the SSP gate for a worker that makes no step; as peer run --stall-timeout")
	every := fs.Int("gossip-every", def.Gossip.Every, "adpsgd/sgp: local steps between exchanges")
	period := fs.Duration("gossip-period", def.Gossip.Period, "adpsgd/sgp: least time between exchanges a peer starts")
	heartbeat := fs.Duration("heartbeat", 0, "control plane heartbeat period (0: the simulator's default for the swarm's size)")
	quorum := fs.Int("quorum", 0, "peers each peer must see before training starts (0: all up to 17 peers and for sync and ps, else 16)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole experiment (forming the swarms included) to this file")
	verbose := fs.Bool("v", false, "log progress to stderr")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("experiment: unexpected arguments %q", fs.Args())
	}
	if *repeat < 1 {
		return fmt.Errorf("experiment: --repeat must be ≥ 1")
	}
	cfg := def
	cfg.Peers, cfg.Delay, cfg.Latency, cfg.Duration = *peers, *delay, *latency, *duration
	cfg.Target, cfg.StopAtTarget, cfg.MonitorEvery = *target, *stopAt, *monitorEvery
	cfg.Partition, cfg.TrainLimit, cfg.TestLimit, cfg.SnapshotEvery = *partition, *trainLimit, *testLimit, *snapshot
	var err error
	if cfg.Slow, err = sim.ParseSlow(*slow); err != nil {
		return err
	}
	if cfg.Kill, err = sim.ParseKill(*kill); err != nil {
		return err
	}
	if cfg.Bandwidth, err = parseBandwidth(*bandwidth); err != nil {
		return err
	}
	cfg.Worker.Model, cfg.Worker.Batch, cfg.Worker.LR, cfg.Worker.Optimizer = *model, *batch, float32(*lr), *opt
	cfg.Async.RoundTime = *roundTime
	cfg.Async.LocalSteps, cfg.Async.Alpha, cfg.Async.BufferK, cfg.Async.ServerLR, cfg.Compress = *localSteps, *alpha, *bufK, *serverLR, codec
	cfg.StallTimeout = *stall
	cfg.Gossip.Every, cfg.Gossip.Period = *every, *period
	cfg.Async.BufferRule, cfg.Async.ClipFactor, cfg.Gossip.ClipFactor = bufRule, *clipPeers, *clipPeers
	cfg.SyncAlgorithm = *syncAlgo
	cfg.Heartbeat, cfg.Quorum = *heartbeat, *quorum
	cfg.PS.Servers, cfg.PS.DCLambda, cfg.PS.Policy = *servers, *dcLambda, psPolicy

	// Every run's configuration, checked before anything starts.
	pols := []staleness.Policy{cfg.Async.Policy}
	if len(policies) > 0 {
		pols = pols[:0]
		for _, s := range policies {
			p, err := staleness.Parse(s)
			if err != nil {
				return fmt.Errorf("experiment: --policy: %w", err)
			}
			pols = append(pols, p)
		}
	}
	// Repeats outermost, so that a change in the machine's load during the
	// experiment falls on every configuration alike.
	var runs []sim.Config
	for r := range *repeat {
		for _, st := range strings.Split(*strategy, ",") {
			st = strings.TrimSpace(st)
			ps := pols[:1]
			if st == "fedasync" || st == "fedbuff" {
				ps = pols
			}
			for _, pol := range ps {
				c := cfg
				c.Strategy, c.Async.Policy, c.Seed = st, pol, *seed+uint64(r)
				if err := c.Validate(); err != nil {
					return fmt.Errorf("experiment: %s: %w", c.Label(), err)
				}
				runs = append(runs, c)
			}
		}
	}
	log := slog.New(slog.DiscardHandler)
	if *verbose {
		log = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	trainSet, testSet, err := data.LoadMNIST(*dataDir)
	if err != nil {
		return err
	}
	stop, err := startCPUProfile(*cpuProfile)
	if err != nil {
		return err
	}
	defer stop()
	var results []*sim.Result
	for i, c := range runs {
		fmt.Fprintf(stderr, "run %d/%d: %s, %d peers, seed %d, %v\n", i+1, len(runs), c.Label(), c.Peers, c.Seed, c.Duration)
		res, err := sim.Run(ctx, c, trainSet, testSet, sim.WithLogger(log))
		if err != nil {
			return fmt.Errorf("experiment: %s: %w", c.Label(), err)
		}
		dir := filepath.Join(*out, fmt.Sprintf("%s-seed%d", strings.Trim(nonWord.ReplaceAllString(c.Label(), "_"), "_"), c.Seed))
		if err := res.WriteFiles(dir); err != nil {
			return err
		}
		s := res.Summary
		fmt.Fprintf(stderr, "  final accuracy %.4f (min %.4f), time to %.2f: %s, %d steps, mean τ %.2f, %d dropped → %s\n",
			s.FinalAccuracy, s.FinalMin, c.Target, fmtTime(s.TimeToTarget), s.Steps, s.MeanTau, dropped(s.Drops), dir)
		sc := s.Scale
		fmt.Fprintf(stderr, "  formed in %.1fs (heartbeat %.2fs, quorum %d); a heartbeat reached %d peers in %.3fs (%.2f heartbeats); training CPU %.1fs (%.3fs a peer); peak RSS %.0f MiB (%.2f a peer)\n",
			sc.FormS, sc.HeartbeatS, sc.Quorum, sc.Reached, sc.DisseminationS, sc.DisseminationBeats, sc.TrainCPUS, sc.TrainCPUS/float64(c.Peers), sc.MaxRSSMiB, sc.MaxRSSMiB/float64(c.Peers))
		results = append(results, res)
	}
	rows, err := sim.WriteComparison(*out, results, *baseline)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
	at := 0
	if len(rows) > 0 {
		at = rows[0].AtUpdates
	}
	fmt.Fprintf(tw, "run\tseed\tfinal acc\tmin acc\ttime to %.2f\tsteps to it\tratio vs %s\tΔacc (pp)\tacc at %d steps\tmean τ\tmerges\tsteps\tdropped\n", *target, *baseline, at)
	for _, r := range rows {
		ratio := "-"
		if r.TimeRatio > 0 {
			ratio = fmt.Sprintf("%.3f", r.TimeRatio)
		}
		fmt.Fprintf(tw, "%s\t%d\t%.4f\t%.4f\t%s\t%d\t%s\t%+.2f\t%.4f\t%.2f\t%d\t%d\t%d\n", r.Label, r.Seed, r.FinalAccuracy, r.FinalMin,
			fmtTime(r.TimeToTarget), r.UpdatesToTarget, ratio, r.AccuracyDelta, r.AccAtUpdates, r.MeanTau, r.Merges, r.Steps, r.Dropped)
	}
	tw.Flush()
	fmt.Fprintf(stdout, "files in %s (compare.csv, compare.json, compare.png, one folder per run)\n", *out)
	return nil
}

func fmtTime(s float64) string {
	if s < 0 {
		return "not reached"
	}
	return (time.Duration(s * float64(time.Second))).Round(10 * time.Millisecond).String()
}

func dropped(d map[string]uint64) uint64 {
	var n uint64
	keys := make([]string, 0, len(d))
	for k := range d {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		n += d[k]
	}
	return n
}
