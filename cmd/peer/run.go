package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/starling-ml/starling/aggregate/rule"
	"github.com/starling-ml/starling/compression"
	"github.com/starling-ml/starling/device"
	"github.com/starling-ml/starling/internal/attack"
	"github.com/starling-ml/starling/internal/cli"
	"github.com/starling-ml/starling/internal/peerrun"
	"github.com/starling-ml/starling/nn"
	"github.com/starling-ml/starling/node"
	"github.com/starling-ml/starling/staleness"
	"github.com/starling-ml/starling/swarm"
	"github.com/starling-ml/starling/train"
	"github.com/starling-ml/starling/workload"
)

func init() {
	register(&command{name: "run", summary: "join a swarm and train with the others", run: runRun})
}

// runFlags defines `peer run`'s flags on fs and returns a function that
// turns them, once parsed and layered, into Options.
func runFlags(fs *flag.FlagSet, stderr io.Writer) func() (peerrun.Options, error) {
	sw := swarm.DefaultConfig()
	wk := train.DefaultWorkerConfig()
	fed := train.DefaultFedConfig()

	mode := fs.String("mode", "federated", "training mode: "+strings.Join(peerrun.Modes(), ", "))
	// Network.
	swarmName := fs.String("swarm", "starling", "swarm name: peers of one swarm find each other (mDNS service, DHT prefix, gossip topics)")
	var listen, connect, bootstrap, allow, relays cli.List
	fs.Var(&listen, "listen", "multiaddrs to listen on (default: TCP and QUIC on port 4001, all interfaces; TCP only with --psk)")
	fs.Var(&connect, "connect", "multiaddrs (with /p2p/ID) of peers to dial, in the background with backoff for the whole run (one that is down does not stop it)")
	fs.Var(&bootstrap, "bootstrap", "multiaddrs (with /p2p/ID) of DHT bootstrap peers; turns the DHT on")
	fs.Var(&allow, "allow", "peer IDs allowed to connect (default: everyone who passes the swarm key)")
	fs.Var(&relays, "relay", "multiaddr (with /p2p/ID) of a relay to book a slot on at start, for a peer behind a NAT (peers reach it there, then hole punching connects them directly); repeatable. Without one, a peer AutoNAT finds unreachable uses peers offering --relay-service")
	relayService := fs.Bool("relay-service", false, "relay other peers' control traffic (circuit v2; never tensors): run it on a publicly reachable peer")
	mdns := fs.Bool("mdns", true, "discover peers on the LAN by mDNS")
	dht := fs.Bool("dht", false, "run the private DHT rendezvous (on by itself with --bootstrap)")
	psk := fs.String("psk", "", "swarm key file (from peer keygen --psk): a private swarm over TCP")
	insecure := fs.Bool("insecure", false, insecureUsage)
	muxer := fs.String("muxer", node.DefaultConfig().Muxer, muxerUsage)
	key := fs.String("key", "", "identity key file, created if missing (default: a new identity each run)")
	metrics := fs.String("metrics-addr", "", "serve Prometheus metrics on this address, e.g. 127.0.0.1:9090")
	minPeers := fs.Int("min-peers", 2, "wait for this many live peers, this one included, before training")
	wait := fs.Duration("wait", 2*time.Minute, "how long to wait for --min-peers")
	stall := fs.Duration("stall-timeout", sw.Aggregate.StallTimeout, "all-reduce: how long a silent peer is waited for before it is dropped; ps: how long a worker waits for a server before it fails over to the shard's backup, and the SSP gate for a worker that makes no step")
	aggRule := sw.Aggregate.Rule
	fs.Var(rule.Flag{Rule: &aggRule}, "aggregate", "aggregation rule: mean, median, trimmed:β, krum:f=F[,m=M], cclip:tau=T,iters=L (default "+aggRule.String()+")")
	// Data.
	dataDir := fs.String("data", "", "image models: folder of IDX files (default: MNIST from the GoMNIST module in the Go module cache); charlm: a text file or folder (default: the Go standard library's sources)")
	partition := fs.String("partition", "iid", "how the data is split between peers: iid, shards (2 label shards each) or dirichlet:α (the last two need labels: image models only)")
	shard := fs.String("shard", "0/1", "this peer's part K/N of the partition")
	dataSeed := fs.Uint64("data-seed", 1, "seed of the partition and of a text corpus's validation split (the same on every peer)")
	limit := fs.Int("limit", 0, "use only the first N training samples (0: all)")
	// Model and local training.
	model := fs.String("model", wk.Model, "model: logreg, mlp (784-200-200-10), mlp:784-W-…-10, cnn, or charlm[:layers=L,width=W,heads=H,ctx=T,…] (a character-level transformer with its own defaults for the flags below)")
	batch := fs.Int("batch", wk.Batch, "local batch size B")
	lr := fs.Float64("lr", float64(wk.LR), "local learning rate")
	opt := fs.String("optimizer", wk.Optimizer, "local optimizer: sgd, momentum, nesterov, adam, adamw")
	sched := fs.String("schedule", wk.Schedule, "learning-rate schedule over this peer's steps: constant, step[:EVERY,GAMMA], cosine, or warmup:STEPS+<schedule> (a decay needs --steps or rounds to end at)")
	wd := fs.Float64("wd", 0, "weight decay")
	clip := fs.Float64("clip", 0, "clip local gradients to this global norm (0: off)")
	seed := fs.Uint64("seed", 1, "model initialisation seed (the same on every peer) and sampling seed")
	slow := fs.Float64("slowdown", 0, "make this peer N times slower (straggler experiments)")
	dev := fs.String("device", "cpu", "backend the model and the all-reduce compute on: cpu (the fastest here), gonum, or cpu/ISA")
	prec := fs.String("precision", "fp32", "fp32, or bf16: bfloat16 weights and saved activations with float32 accumulation (master weights and what peers exchange stay float32)")
	initFile := fs.String("init", "", "start from these weights: a safetensors state dict of the model (from --save, peer train --save or torch)")
	save := fs.String("save", "", "write the final model to this file as a PyTorch state dict (safetensors)")
	// Federated.
	strategy := fs.String("strategy", "fedavg", "federated strategy: fedavg, fedprox[:mu=μ], fedadam, fedyogi, fedadagrad, diloco[:h=H], streaming-diloco[:h=H,fragments=F,alpha=α,overlap=τ], async-diloco[:h=H] (DiLoCo whose outer step lands one outer step late, its all-reduce hidden behind the next H inner steps); --mode sync: dp (the default) or demo[:chunk=64,k=32,beta=0.999,bits=23] (DeMo: each peer's momentum, the k largest DCT coefficients of each chunk×chunk tile sent with bits mantissa bits, a sign step)")
	overlap := fs.Int("overlap", 0, "streaming-diloco: inner steps τ that a fragment's all-reduce overlaps before its result is merged (as overlap=τ in --strategy; must be below h)")
	rounds := fs.Int("rounds", 20, "federated rounds")
	fraction := fs.Float64("fraction", 1, "fraction C of live peers sampled per round")
	groupSize := fs.Int("group-size", fed.GroupSize, "federated, sync: the most peers one all-reduce averages; a larger round sample (or sync job) splits into groups of at most this many, re-drawn each round (0: one group)")
	epochs := fs.Int("local-epochs", 1, "local epochs E per round")
	steps := fs.Int("local-steps", 0, "local steps H per round instead of epochs")
	roundTimeout := fs.Duration("round-timeout", fed.RoundTimeout, "longest a round may take")
	// State and output.
	ckpt := fs.String("checkpoint", "", "checkpoint file, rewritten atomically after every round")
	resume := fs.Bool("resume", false, "continue from --checkpoint")
	out := fs.String("out", "", "folder for summary.json")
	uiAddr := fs.String("ui", "", "serve a live dashboard of this peer (curves, members, links, bytes, staleness, round times, who was left out) on this address, e.g. 127.0.0.1:8080")
	traceFile := fs.String("trace", "", "write this peer's timeline (compute, all-reduce, apply, … per round) to this file in the Chrome trace event format; 'peer trace merge' joins several peers' files")
	linger := fs.Duration("linger", 3*time.Second, "stay up this long after training to serve state to slower peers (federated: longer, up to --round-timeout, while a live peer has yet to finish the last round or is fetching state)")
	progressJSON := fs.Bool("progress-json", false, "print progress as JSON lines (for peer demo)")
	logLevel := fs.String("log-level", "warn", "log level: debug, info, warn, error")
	var atk attack.Attack
	fs.TextVar(&atk, "attack", attack.Attack{}, "experiments only, with --allow-attack: this peer lies in what it contributes: scale:S (S·update, default -10), signflip, noise:σ, nan, stale:K (the contribution of K rounds ago), flood[:count=N,size=X] (N unserved announcements of X× the vector's size per contribution)")
	allowAttack := fs.Bool("allow-attack", false, "allow --attack (a lying peer, for experiments on --aggregate and --clip-peers)")
	var compress compression.Spec
	fs.TextVar(&compress, "compress", compression.Spec{}, "sync: codec of the gradient all-reduce; async: codec of published models; ps: codec of pushed gradients; federated streaming-diloco and async-diloco: codec of the outer gradients (fp32, fp16, bf16, int8[:block=N], fp4[:block=N], int4[:block=N], topk:F, randk:F, sign, powersgd:R, with ,ef for error feedback)")
	d := peerrun.DefaultSyncOptions()
	jobSteps := fs.Int("steps", d.Sync.Steps, "sync: optimiser steps of the job (every peer stops there); async, gossip, ps: local steps of this peer (0: until --duration)")
	evalEvery := fs.Int("eval-every", d.EvalEvery, "sync, async, gossip, ps: evaluate, report and checkpoint every N steps")
	buildSync := syncFlags(fs, jobSteps, evalEvery)
	buildAsync := asyncFlags(fs, jobSteps, evalEvery)
	buildPS := psFlags(fs)
	buildPipeline := pipelineFlags(fs, jobSteps, evalEvery)

	return func() (peerrun.Options, error) {
		o := peerrun.Options{Mode: *mode, Swarm: sw, MinPeers: *minPeers, Wait: *wait, DataDir: *dataDir,
			Partition: *partition, DataSeed: *dataSeed, Limit: *limit, Checkpoint: *ckpt, Resume: *resume,
			Out: *out, ProgressJSON: *progressJSON, Linger: *linger, Compress: compress, Init: *initFile, Save: *save, Trace: *traceFile, UI: *uiAddr,
			Attack: atk, AllowAttack: *allowAttack}
		log, err := textLogger(*logLevel, stderr)
		if err != nil {
			return o, err
		}
		if _, err := fmt.Sscanf(*shard, "%d/%d", &o.Shard, &o.Shards); err != nil {
			return o, fmt.Errorf("--shard %q: want K/N", *shard)
		}
		n := &o.Swarm.Node
		n.SwarmName, n.KeyFile, n.PSKFile, n.MetricsAddr, n.MDNS = *swarmName, *key, *psk, *metrics, *mdns
		n.Insecure = warnInsecure(*insecure, stderr)
		n.Muxer = *muxer
		if len(listen) > 0 {
			n.ListenAddrs = listen
		}
		n.Bootstrap = bootstrap
		n.Relays, n.RelayService = relays, *relayService
		n.DHT = *dht || len(bootstrap) > 0
		for _, a := range allow {
			id, err := peer.Decode(a)
			if err != nil {
				return o, fmt.Errorf("--allow %q: %v", a, err)
			}
			n.Allowlist = append(n.Allowlist, id)
		}
		o.Connect = connect
		o.Swarm.Gossip.Namespace = *swarmName
		o.Swarm.Aggregate.StallTimeout = *stall
		o.Swarm.Aggregate.Rule = aggRule
		o.Worker = train.WorkerConfig{Model: *model, Batch: *batch, LR: float32(*lr), Optimizer: *opt, Schedule: *sched,
			WeightDecay: float32(*wd), ClipNorm: *clip, ModelSeed: *seed, DataSeed: *seed*7919 + uint64(o.Shard) + 1, Slowdown: *slow}
		o.Fed = fed
		var demo train.DeMoConfig
		if *mode == "sync" && flagSet(fs, "strategy") {
			if demo, err = train.ParseSyncStrategy(*strategy); err != nil {
				return o, fmt.Errorf("--strategy: %w", err)
			}
		} else if err := o.Fed.ParseStrategy(*strategy); err != nil {
			return o, err
		}
		o.Fed.Rounds, o.Fed.Fraction, o.Fed.Seed, o.Fed.RoundTimeout = *rounds, *fraction, *seed, *roundTimeout
		if *overlap > 0 {
			if o.Fed.Strategy != "streaming-diloco" {
				return o, fmt.Errorf("--overlap applies to --strategy streaming-diloco, not %s", o.Fed.Strategy)
			}
			o.Fed.Overlap = *overlap
		}
		if *steps > 0 {
			o.Fed.LocalSteps, o.Fed.LocalEpochs = *steps, 0
		} else if !strings.Contains(o.Fed.Strategy, "diloco") {
			o.Fed.LocalEpochs = *epochs
		}
		o.Sync, o.Async = buildSync(), buildAsync()
		o.PS = buildPS(o.Async.Async.Policy)
		o.Sync.Sync.DeMo = demo
		o.Fed.GroupSize, o.Sync.Sync.GroupSize = *groupSize, *groupSize
		o.Pipeline = buildPipeline()
		if err := applyTuning(fs, &o); err != nil {
			return o, err
		}
		if demo.On() && !flagSet(fs, "optimizer") {
			o.Worker.Optimizer = "sgd" // DeMo's sign step is plain SGD on sign(Q)
		}
		if o.Backend, err = deviceByName(*dev); err != nil {
			return o, err
		}
		if o.Precision, err = nn.ParsePrecision(*prec); err != nil {
			return o, fmt.Errorf("--precision: %w", err)
		}
		o.Log = log
		return o, nil
	}
}

// applyTuning sets the settings of the model's workload.Tuning that no flag
// set explicitly (on the command line, in the environment or the config
// file): the optimiser, its rate, schedule, weight decay and clipping, the
// batch, and a federated round's local steps. Models without a Tuning
// keep the flags' defaults.
func applyTuning(fs *flag.FlagSet, o *peerrun.Options) error {
	tu, ok, err := workload.TuningOf(o.Worker.Model)
	if err != nil || !ok {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	w := &o.Worker
	if !set["optimizer"] {
		w.Optimizer = tu.Optimizer
	}
	if !set["lr"] {
		w.LR = tu.LR
	}
	if !set["wd"] {
		w.WeightDecay = tu.WeightDecay
	}
	if !set["clip"] {
		w.ClipNorm = tu.ClipNorm
	}
	if !set["batch"] {
		w.Batch = tu.Batch
	}
	if !set["schedule"] {
		w.Schedule = tu.Schedule
	}
	// DiLoCo's H is its own (--strategy diloco:h=H).
	if !set["local-steps"] && !set["local-epochs"] && !strings.Contains(o.Fed.Strategy, "diloco") {
		o.Fed.LocalSteps, o.Fed.LocalEpochs = tu.LocalSteps, 0
	}
	return nil
}

// deviceByName returns the backend --device names.
func deviceByName(name string) (device.Backend, error) {
	be, err := device.ByName(name)
	if err != nil {
		return nil, fmt.Errorf("--device: %w", err)
	}
	return be, nil
}

// textLogger returns a text logger on w at the level a --log-level flag
// names.
func textLogger(level string, w io.Writer) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %v", err)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: lvl})), nil
}

func runRun(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("run", stderr)
	config := fs.String("config", "", "JSON file of flag names to values (flags > STARLING_* variables > this file > defaults)")
	build := runFlags(fs, stderr)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("run: unexpected arguments %q", fs.Args())
	}
	if err := cli.Layer(fs, *config, nil); err != nil {
		return fmt.Errorf("run: %w", err)
	}
	if err := checkModeFlags(fs); err != nil {
		return err
	}
	opts, err := build()
	if err != nil {
		return fmt.Errorf("run: %w", err)
	}
	_, err = peerrun.Run(ctx, opts, stdout, stderr)
	return err
}

// syncFlags defines the flags only --mode sync reads on fs; steps and
// evalEvery are the shared --steps and --eval-every.
func syncFlags(fs *flag.FlagSet, steps, evalEvery *int) func() peerrun.SyncOptions {
	d := peerrun.DefaultSyncOptions()
	stepTimeout := fs.Duration("step-timeout", d.Sync.StepTimeout, "sync: longest one step's all-reduce may take")
	joinLead := fs.Duration("join-lead", d.Sync.JoinLead, "sync: how far ahead (at the others' pace) a joining peer declares the step it joins at")
	agree := fs.Int("agree-every", d.Sync.AgreeEvery, "sync, with more peers than --group-size: every N-th step the whole job all-reduces, fixing the set the groups are drawn from; peers join at those steps")
	return func() peerrun.SyncOptions {
		o := d
		o.Sync.Steps, o.Sync.StepTimeout, o.Sync.JoinLead, o.EvalEvery = *steps, *stepTimeout, *joinLead, *evalEvery
		o.Sync.AgreeEvery = *agree
		o.Sync.SnapshotEvery = *evalEvery
		return o
	}
}

// asyncFlags defines the flags of --mode async and --mode gossip on fs;
// steps and evalEvery are the shared --steps and --eval-every.
func asyncFlags(fs *flag.FlagSet, steps, evalEvery *int) func() peerrun.AsyncOptions {
	d := peerrun.DefaultAsyncOptions()
	strategy := fs.String("async", d.Async.Mode, "async: fedasync (mix each fresh model in) or fedbuff (apply after K buffered deltas)")
	policy := d.Async.Policy
	fs.TextVar(&policy, "policy", d.Async.Policy, "async, ps: staleness weighting: const, poly:A, hinge:A,B, inv, sqrt, optionally +ssp:S (ps: of pushed gradients, const by default; +ssp:S holds a worker more than S steps ahead of the slowest live one)")
	alpha := fs.Float64("alpha", d.Async.Alpha, "async: fedasync mixing rate α")
	bufferK := fs.Int("buffer-k", d.Async.BufferK, "async: fedbuff contributions per server step K")
	serverLR := fs.Float64("server-lr", d.Async.ServerLR, "async: fedbuff server learning rate η")
	publish := fs.Int("publish-every", d.Async.LocalSteps, "async: local steps H between two publications of this peer's model")
	roundTime := fs.Duration("round-time", 0, "async: also publish after this long (a straggler publishes as often as the others; 0: off)")
	algo := fs.String("gossip", d.Gossip.Algorithm, "gossip: algorithm: adpsgd (pairwise averaging, also \"pairwise\") or sgp (push-sum, also \"pushsum\")")
	every := fs.Int("gossip-every", d.Gossip.Every, "gossip: local steps between two exchanges")
	period := fs.Duration("gossip-period", 0, "gossip: least time between two exchanges this peer starts (0: none)")
	duration := fs.Duration("duration", 0, "async, gossip, ps: stop training after this long (0: only --steps)")
	clipPeers := fs.Float64("clip-peers", d.Async.ClipFactor, "async (fedasync), gossip (adpsgd, sgp): "+clipPeersUsage)
	bufRule := d.Async.BufferRule
	fs.Var(rule.Flag{Rule: &bufRule}, "buffer-rule", "async: "+bufferRuleUsage+" (default "+bufRule.String()+")")
	return func() peerrun.AsyncOptions {
		o := d
		o.Async.Mode, o.Async.Policy, o.Async.Alpha, o.Async.BufferK = *strategy, policy, *alpha, *bufferK
		o.Async.ServerLR, o.Async.LocalSteps, o.Async.RoundTime = *serverLR, *publish, *roundTime
		o.Gossip.Algorithm, o.Gossip.Every, o.Gossip.Period = *algo, *every, *period
		o.Steps, o.EvalEvery, o.Duration = *steps, *evalEvery, *duration
		o.Async.ClipFactor, o.Gossip.ClipFactor, o.Async.BufferRule = *clipPeers, *clipPeers, bufRule
		switch *algo {
		case "pairwise":
			o.Gossip.Algorithm = train.GossipPairwise
		case "pushsum", "push-sum":
			o.Gossip.Algorithm = train.GossipPushSum
		}
		return o
	}
}

// psFlags defines the flags only --mode ps reads on fs; the returned
// function takes --policy's value (shared with async), which ps uses only
// when it was given: its own default is const (plain asynchronous SGD).
func psFlags(fs *flag.FlagSet) func(policy staleness.Policy) train.PSConfig {
	d := train.DefaultPSConfig()
	servers := fs.Int("servers", 0, "ps: how many peers serve a shard of the parameters each, elected among the peers present at start (0: one per four peers); each shard's replica is on the next server, or the next peer")
	lambda := fs.Float64("dc-lambda", d.DCLambda, "ps: DC-ASGD's λ: a server corrects a stale gradient g by λ·g⊙g⊙(w − w_bak) (0: off)")
	return func(policy staleness.Policy) train.PSConfig {
		c := d
		c.Servers, c.DCLambda, c.LR = *servers, *lambda, 0
		set := false
		fs.Visit(func(f *flag.Flag) { set = set || f.Name == "policy" })
		if set {
			c.Policy = policy
		}
		return c
	}
}

// checkModeFlags refuses flags that belong to another mode than --mode.
func checkModeFlags(fs *flag.FlagSet) error {
	mode := fs.Lookup("mode").Value.String()
	var bad []string
	fs.Visit(func(f *flag.Flag) {
		if ms, ok := modeOnlyFlags[f.Name]; ok && !slices.Contains(ms, mode) {
			bad = append(bad, fmt.Sprintf("--%s applies to --mode %s", f.Name, strings.Join(ms, "|")))
		}
	})
	if len(bad) > 0 {
		return fmt.Errorf("run: conflicting options: %s (this is --mode %s)", strings.Join(bad, "; "), mode)
	}
	return nil
}

// modeOnlyFlags names flags that only one mode reads.
var modeOnlyFlags = map[string][]string{
	"strategy": {"federated", "sync"}, "rounds": {"federated"}, "fraction": {"federated"}, "group-size": {"federated", "sync"}, "agree-every": {"sync"},
	"local-epochs": {"federated"}, "local-steps": {"federated"}, "round-timeout": {"federated"}, "overlap": {"federated"},
	"steps": {"sync", "async", "gossip", "ps"}, "eval-every": {"sync", "async", "gossip", "ps"},
	"step-timeout": {"sync"}, "join-lead": {"sync"}, "compress": {"sync", "async", "federated", "ps"}, // federated: streaming-diloco alone (peerrun.Options.Validate)
	"async": {"async"}, "policy": {"async", "ps"}, "servers": {"ps"}, "dc-lambda": {"ps"}, "alpha": {"async"}, "buffer-k": {"async"},
	"server-lr": {"async"}, "publish-every": {"async"}, "round-time": {"async"},
	"gossip": {"gossip"}, "gossip-every": {"gossip"}, "gossip-period": {"gossip"},
	"duration": {"async", "gossip", "ps"}, "clip-peers": {"async", "gossip"}, "buffer-rule": {"async"},
}

// Usage of the flags against lying peers, shared by peer run and peer
// experiment.
const (
	clipPeersUsage  = "move a peer's model towards this one's, before merging it, to within this many times the median distance of the other peers' (robust to a lying peer; 0: off)"
	bufferRuleUsage = "fedbuff: how buffered contributions combine: median or trimmed:β (peers publish models; each peer's latest is a standing vote, cut to the votes' median length; a step waits for new models from a majority of the live peers: robust to a minority of lying peers, needs a dense --compress) or mean (FedBuff as published: deltas; sooner on IID data, but one lying peer poisons it and peers stall on non-IID data; see the README)"
)
