// Package peerrun is `peer run`: it loads the workload (model and data,
// workload.Load), joins a swarm of peers training the same architecture,
// takes this peer's data shard, and trains with the chosen strategy, with
// checkpoints, progress and a summary. Strategy families register
// themselves as modes.
package peerrun

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/starling-ml/starling/compression"
	"github.com/starling-ml/starling/data"
	"github.com/starling-ml/starling/device"
	"github.com/starling-ml/starling/gossip"
	"github.com/starling-ml/starling/internal/attack"
	"github.com/starling-ml/starling/internal/plot"
	"github.com/starling-ml/starling/internal/ui"
	"github.com/starling-ml/starling/nn"
	"github.com/starling-ml/starling/swarm"
	"github.com/starling-ml/starling/trace"
	"github.com/starling-ml/starling/train"
	"github.com/starling-ml/starling/workload"
)

// ErrUsage reports options that contradict each other or cannot work.
var ErrUsage = errors.New("peer run")

// Options is everything `peer run` was told.
type Options struct {
	Mode string
	// Swarm configures the peer; Run sets Swarm.Gossip.Model to the
	// workload's ID.
	Swarm    swarm.Config
	Connect  []string      // multiaddrs to dial directly at start
	MinPeers int           // wait for this many live peers (with this one) before training
	Wait     time.Duration // how long to wait for them

	// DataDir is the workload's data: a folder of IDX files for the image
	// models (default MNIST), a text file or folder for charlm (default the
	// Go standard library's sources). Worker.Model is the model spec.
	DataDir   string
	Partition string // iid, shards, dirichlet:α (the last two need labels)
	Shard     int    // this peer's part …
	Shards    int    // … of this many
	DataSeed  uint64
	Limit     int // use the first N training samples only (0: all)

	// Worker configures local training. A schedule other than constant
	// spans the run: TotalSteps, when 0, becomes the steps the mode is to
	// take (Horizon).
	Worker train.WorkerConfig
	Fed    train.FedConfig
	// Init is a safetensors file every peer starts from (the model's state
	// dict exactly; "" for the seeded initialisation). A checkpoint
	// resumed from wins over it.
	Init string
	// Save receives the final model, as a PyTorch state dict in
	// safetensors form (nn.Model.SaveFile), when training ends well.
	Save string
	// Backend is the device the model and the all-reduce compute on
	// (nil: device.Default()).
	Backend device.Backend
	// Precision is the format the model computes in (nn.WithPrecision);
	// the parameters peers exchange stay float32 either way.
	Precision nn.Precision
	// Sync holds the settings of --mode sync.
	Sync SyncOptions
	// Async holds the settings of --mode async and --mode gossip, and
	// the steps, duration and evaluation interval of --mode ps.
	Async AsyncOptions
	// PS holds the settings of --mode ps (Run fills in the model id,
	// the steps and the codec; LR 0 takes the worker's).
	PS train.PSConfig
	// Pipeline holds the settings of --mode pipeline.
	Pipeline PipelineOptions
	// Compress is the codec of what this peer sends: sync's gradient
	// all-reduce, async's published models, streaming-diloco's outer
	// gradients. The zero Spec sends float32.
	Compress compression.Spec

	Checkpoint string // path of this peer's checkpoint file ("" for none)
	Resume     bool   // continue from Checkpoint
	Out        string // folder for summary.json and curve.csv ("" for none)
	// UI serves a live dashboard of this peer on this address ("" for
	// none; host:0 picks a port).
	UI string
	// Trace receives the peer's timeline in the Chrome trace event format
	// (package trace); "" for none.
	Trace string
	// Linger keeps the peer up this long after training ends, serving its
	// state to peers that finish a little later, and longer while the mode
	// says so (Env.LingerWhile).
	Linger time.Duration
	// ProgressJSON writes one JSON object per progress event to stdout
	// (the demo reads them) instead of human-readable lines.
	ProgressJSON bool
	// Attack makes this peer lie to the others (internal/attack), for
	// experiments on robust rules; Validate refuses it unless AllowAttack.
	Attack      attack.Attack
	AllowAttack bool
	// Log receives diagnostics.
	Log *slog.Logger
}

// Env is what a mode gets to run with.
type Env struct {
	Opts     *Options
	Peer     *swarm.Peer
	Worker   *train.Worker
	Workload *workload.Workload
	// Test is the test set: the workload's test split, or for text its
	// validation windows.
	Test     data.Dataset
	Recorder train.Recorder
	// Checkpoint is the loaded checkpoint when resuming (nil otherwise).
	Checkpoint *train.Checkpoint
	// Report sends a progress event to the user (and the demo).
	Report func(Progress)
	// Save writes ck to the checkpoint file, if one is configured.
	Save func(ck *train.Checkpoint) error
	Log  *slog.Logger
	// After training, the peer stays up past Options.Linger while it
	// serves a state transfer or, if a mode sets it, while LingerWhile
	// returns true (peers still finishing that may need this one's
	// state), for at most LingerMax in all (stateLingerMax if 0).
	LingerWhile func() bool
	LingerMax   time.Duration
}

// stateLingerMax bounds how long a peer that finished stays up when its
// mode sets no LingerMax.
const stateLingerMax = 30 * time.Second

// Progress is one line of progress: a round or step of this peer.
type Progress struct {
	Peer     string  `json:"peer"`
	Mode     string  `json:"mode"`
	Round    int     `json:"round"`
	Rounds   int     `json:"rounds"`
	Accuracy float64 `json:"accuracy"`
	Loss     float64 `json:"loss"`
	// BitsPerChar is Loss in bits (train.BitsPerToken) for a language
	// model: validation bits per character.
	BitsPerChar float64 `json:"bits_per_char,omitempty"`
	Peers       int     `json:"peers"`
	Seconds     float64 `json:"seconds"`
	Done        bool    `json:"done,omitempty"`
	Note        string  `json:"note,omitempty"`
}

// Summary is written to Out/summary.json.
type Summary struct {
	Peer          string  `json:"peer"`
	Mode          string  `json:"mode"`
	Strategy      string  `json:"strategy,omitempty"`
	Error         string  `json:"error,omitempty"`
	Model         string  `json:"model"`
	ModelID       string  `json:"model_id"`
	ShardSize     int     `json:"shard_size"`
	Rounds        int     `json:"rounds"`
	FinalAccuracy float64 `json:"final_accuracy"`
	// FinalLoss is the last evaluation's test loss; for a language model
	// ValBitsPerChar is the same in bits per character.
	FinalLoss      float64 `json:"final_loss"`
	ValBitsPerChar float64 `json:"val_bits_per_char,omitempty"`
	WallS          float64 `json:"wall_s"`
	// TensorBytesSent is what the peer wrote to tensor streams during
	// training: the all-reduce's chunks (federated, sync) or published
	// models (async); gossip and state transfers aside.
	TensorBytesSent int64      `json:"tensor_bytes_sent"`
	Curve           []Progress `json:"curve"`
}

// ModeFunc runs one strategy family until it is done or ctx ends.
type ModeFunc func(ctx context.Context, env *Env) error

var (
	modesMu sync.Mutex
	modes   = map[string]ModeFunc{}
)

// RegisterMode makes a strategy family available as --mode name.
func RegisterMode(name string, f ModeFunc) {
	modesMu.Lock()
	defer modesMu.Unlock()
	if _, dup := modes[name]; dup {
		panic("peerrun: duplicate mode " + name)
	}
	modes[name] = f
}

// Modes returns the registered mode names, sorted.
func Modes() []string {
	modesMu.Lock()
	defer modesMu.Unlock()
	out := make([]string, 0, len(modes))
	for k := range modes {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func lookupMode(name string) (ModeFunc, bool) {
	modesMu.Lock()
	defer modesMu.Unlock()
	f, ok := modes[name]
	return f, ok
}

// Validate checks options that do not need the network or the data.
func (o *Options) Validate() error {
	if _, ok := lookupMode(o.Mode); !ok {
		return fmt.Errorf("%w: unknown --mode %q (want one of %v)", ErrUsage, o.Mode, Modes())
	}
	if o.Shards <= 0 || o.Shard < 0 || o.Shard >= o.Shards {
		return fmt.Errorf("%w: --shard %d/%d: want K/N with 0 ≤ K < N", ErrUsage, o.Shard, o.Shards)
	}
	if o.Resume && o.Checkpoint == "" {
		return fmt.Errorf("%w: --resume needs --checkpoint FILE", ErrUsage)
	}
	if o.MinPeers < 1 {
		return fmt.Errorf("%w: --min-peers must be at least 1", ErrUsage)
	}
	for _, a := range o.Connect {
		if _, err := parseConnect(a); err != nil {
			return err
		}
	}
	if o.Wait < 0 || o.Linger < 0 || o.Limit < 0 {
		return fmt.Errorf("%w: --wait, --linger and --limit must not be negative", ErrUsage)
	}
	if o.Checkpoint != "" {
		// Found out now, not when the first round's checkpoint is due.
		dir := filepath.Dir(o.Checkpoint)
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			return fmt.Errorf("%w: --checkpoint %s: no folder %s to write it in", ErrUsage, o.Checkpoint, dir)
		}
	}
	if err := o.Worker.Validate(); err != nil {
		return err
	}
	if err := o.validateAttack(); err != nil {
		return err
	}
	if err := o.validateAsync(); err != nil {
		return err
	}
	if err := o.validatePS(); err != nil {
		return err
	}
	if o.Mode == "sync" {
		if err := o.Sync.validate(); err != nil {
			return err
		}
		if o.Sync.Sync.DeMo.On() && o.Worker.Optimizer != "sgd" {
			return fmt.Errorf("%w: --strategy demo takes a sign step with plain SGD: use --optimizer sgd, not %s", ErrUsage, o.Worker.Optimizer)
		}
	}
	if !o.Compress.IsZero() && o.Mode != "sync" && o.Mode != "async" && o.Mode != "ps" && !o.streaming() {
		return fmt.Errorf("%w: --compress applies to --mode sync, async, ps and federated with --strategy streaming-diloco or async-diloco, not %s", ErrUsage, o.Mode)
	}
	if o.streaming() && o.Compress.ErrorFeedback() {
		return fmt.Errorf("%w: --compress %s: streaming-diloco's fragments differ in length, so its all-reduce keeps no error-feedback residual (drop ,ef)", ErrUsage, o.Compress)
	}
	if o.Mode == "pipeline" {
		if err := o.Pipeline.validate(); err != nil {
			return err
		}
	}
	if o.Mode == "federated" {
		if err := o.Fed.Validate(); err != nil {
			return fmt.Errorf("%w: %w", ErrUsage, err)
		}
	}
	return o.Swarm.Validate()
}

// streaming reports a federated run of Streaming DiLoCo (or async
// DiLoCo), whose all-reduce carries outer gradients that --compress may
// quantise.
func (o *Options) streaming() bool {
	return o.Mode == "federated" && o.Fed.Streams()
}

// Run runs `peer run` with opts until training ends or ctx is cancelled.
func Run(ctx context.Context, opts Options, stdout, stderr io.Writer) (*Summary, error) {
	if opts.Log == nil {
		opts.Log = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	if opts.Mode == "sync" && opts.Sync.Sync.DeMo.On() && opts.Compress.IsZero() {
		opts.Compress = compression.MustSpec("sparse") // DeMo's coefficients, exactly
	}
	if opts.Mode == "sync" || opts.streaming() {
		opts.Swarm.Aggregate.Compress = opts.Compress
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	mode, _ := lookupMode(opts.Mode)
	var ck *train.Checkpoint
	if opts.Resume {
		var err error
		if ck, err = train.LoadCheckpoint(opts.Checkpoint, 1<<30); err != nil {
			return nil, err
		}
	}
	wl, err := workload.Load(workload.Config{Model: opts.Worker.Model, Data: opts.DataDir, Limit: opts.Limit, Seed: opts.DataSeed})
	if err != nil {
		return nil, err
	}
	parts, err := data.Partition(wl.Train, opts.Shards, opts.Partition, opts.DataSeed)
	if errors.Is(err, data.ErrUnlabeled) {
		return nil, fmt.Errorf("%w: --partition %s splits by label and %s has none: use --partition iid", ErrUsage, opts.Partition, opts.Worker.Model)
	}
	if err != nil {
		return nil, err
	}
	shard := data.Subset(wl.Train, parts[opts.Shard])
	wcfg := opts.Worker
	if wcfg.TotalSteps == 0 {
		wcfg.TotalSteps = opts.Horizon(shard.Len())
		wcfg.Schedule = openEnded(wcfg.Schedule, wcfg.TotalSteps)
	}
	models, err := wl.Models(opts.Backend, opts.Init, nn.WithPrecision(opts.Precision))
	if err != nil {
		return nil, fmt.Errorf("--init: %w", err)
	}
	w, err := train.NewWorker(wcfg, shard, train.WithModel(models))
	if err != nil {
		return nil, err
	}
	if opts.Mode == "pipeline" { // found out before the network starts
		if _, err := w.Model.Stages(opts.Pipeline.Stages); err != nil {
			return nil, fmt.Errorf("%w: --stages: %w", ErrUsage, err)
		}
	}
	// Peers of another architecture or vocabulary are not members of this
	// peer's swarm and never enter its rounds (swarm.Config).
	opts.Swarm.Gossip.Model = wl.ID()
	if ck != nil {
		if err := ck.Check(w, opts.Mode); err != nil {
			return nil, err
		}
		if err := ck.Restore(w); err != nil {
			return nil, fmt.Errorf("%w: %v", train.ErrCheckpoint, err)
		}
	}
	if opts.Out != "" {
		if err := os.MkdirAll(opts.Out, 0o755); err != nil {
			return nil, err
		}
	}

	var traceFile *os.File
	if opts.Trace != "" {
		if traceFile, err = os.Create(opts.Trace); err != nil {
			return nil, fmt.Errorf("--trace: %w", err)
		}
		defer traceFile.Close() // Tracer.Close closes it too; a double Close is harmless
	}
	if opts.Swarm.Log == nil {
		opts.Swarm.Log = opts.Log
	}
	var sopts []swarm.Option
	if opts.Backend != nil {
		sopts = append(sopts, swarm.WithBackend(opts.Backend))
	}
	if opts.Mode == "federated" {
		// No round of the others takes this peer in while it starts up
		// (train.Federated chooses the round it joins).
		sopts = append(sopts, swarm.WithJoinPending())
	}
	p, err := swarm.Start(ctx, opts.Swarm, sopts...)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	if traceFile != nil {
		tr := trace.New(traceFile, string(p.ID()), nil)
		defer func() {
			if err := tr.Close(); err != nil {
				opts.Log.Warn("writing the trace", "file", opts.Trace, "err", err)
			}
		}()
		ctx = trace.With(ctx, tr)
	}
	// --connect addresses are dialled in the background for the whole
	// run: one that is down must not stop it while --min-peers can be met,
	// and a peer that comes back is reconnected.
	dials, err := dialAll(ctx, p, opts.Connect, opts.Log)
	if err != nil {
		return nil, err
	}
	defer dials.Stop()
	dials.WaitFirst()
	opts.Log.Info("peer up", "id", p.ID(), "addrs", p.Node.Addrs(), "model", wl.ID(), "data", wl.Source, "shard", shard.Len())
	if opts.MinPeers > 1 {
		wctx, cancel := context.WithTimeout(ctx, opts.Wait)
		err := p.WaitPeers(wctx, opts.MinPeers)
		cancel()
		if err != nil {
			unreached := ""
			if f := dials.Failures(); len(f) > 0 {
				unreached = "; --connect not reached: " + strings.Join(f, "; ")
			}
			return nil, fmt.Errorf("waiting for %d peers (have %d) for %v: %w%s%s", opts.MinPeers, len(p.Members()), opts.Wait, err, unreached, otherModels(p, wl))
		}
	}

	met, err := newMetrics(p.Node.Registry())
	if err != nil {
		return nil, err
	}
	rec := &train.MemRecorder{MinGap: time.Second}
	var board *ui.Board
	if opts.UI != "" {
		board = ui.New(fmt.Sprintf("peer %s: %s, %s", p.ID(), opts.Mode, wl.ID()), 0, func() ui.Live { return liveView(p) }, nil)
		if wl.Text() {
			board.SetMetric("bits/char")
		}
		url, err := ui.Serve(ctx, opts.UI, board)
		if err != nil {
			return nil, fmt.Errorf("--ui: %w", err)
		}
		defer board.Done()
		fmt.Fprintf(stderr, "dashboard at %s\n", url)
	}
	start := time.Now()
	sum := &Summary{Peer: string(p.ID()), Mode: opts.Mode, Model: w.Model.Arch, ModelID: wl.ID(), ShardSize: shard.Len()}
	switch opts.Mode {
	case "federated":
		sum.Strategy = opts.Fed.Strategy
	case "async":
		sum.Strategy = opts.Async.Async.Mode + " " + opts.Async.Async.Policy.String()
	case "gossip":
		sum.Strategy = opts.Async.Gossip.Algorithm
	case "ps":
		sum.Strategy = "ps " + opts.PS.Policy.String()
	}
	var mu sync.Mutex
	report := func(pr Progress) {
		pr.Peer, pr.Mode = string(p.ID()), opts.Mode
		if wl.Text() {
			pr.BitsPerChar = train.BitsPerToken(pr.Loss)
		}
		if pr.Seconds == 0 {
			pr.Seconds = time.Since(start).Seconds()
		}
		if board != nil {
			board.Point(pr.Peer, ui.Point{Round: pr.Round, Seconds: pr.Seconds, Accuracy: pr.Accuracy, Loss: pr.Loss, Peers: pr.Peers})
			board.SetRounds(pr.Rounds)
			if pr.Note != "" {
				board.Event(pr.Peer, fmt.Sprintf("round %d", pr.Round), pr.Note)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		met.progress(pr)
		sum.Curve = append(sum.Curve, pr)
		if pr.Round > sum.Rounds {
			sum.Rounds = pr.Round
		}
		if pr.Accuracy > 0 {
			sum.FinalAccuracy = pr.Accuracy
		}
		if pr.Loss > 0 {
			sum.FinalLoss, sum.ValBitsPerChar = pr.Loss, pr.BitsPerChar
		}
		if opts.ProgressJSON {
			b, _ := json.Marshal(pr)
			fmt.Fprintf(stdout, "%s\n", b)
			return
		}
		note := ""
		if pr.Note != "" {
			note = "  " + pr.Note
		}
		if wl.Text() {
			fmt.Fprintf(stdout, "%s %d/%d  val %.3f bits/char  next-char acc %.2f%%  peers %d  %.0fs%s\n", roundWord(opts.Mode), pr.Round, pr.Rounds, pr.BitsPerChar, 100*pr.Accuracy, pr.Peers, pr.Seconds, note)
			return
		}
		fmt.Fprintf(stdout, "%s %d/%d  test acc %.2f%%  loss %.4f  peers %d  %.0fs%s\n", roundWord(opts.Mode), pr.Round, pr.Rounds, 100*pr.Accuracy, pr.Loss, pr.Peers, pr.Seconds, note)
	}
	env := &Env{
		Opts: &opts, Peer: p, Worker: w, Workload: wl, Test: wl.Test, Recorder: recorder{rec, met, board, string(p.ID())}, Checkpoint: ck,
		Report: report, Log: opts.Log,
		Save: func(c *train.Checkpoint) error {
			if opts.Checkpoint == "" {
				return nil
			}
			c.Mode = opts.Mode
			return c.Save(opts.Checkpoint)
		},
	}
	err = mode(ctx, env)
	sum.WallS = time.Since(start).Seconds()
	sum.TensorBytesSent = tensorBytesSent(p.Node.Registry())
	if err == nil && opts.Save != "" {
		// The worker's model is final: the modes return once training
		// and the exchanges that write it have ended.
		if err = wl.Save(w.Model, opts.Save); err != nil {
			err = fmt.Errorf("--save: %w", err)
		}
	}
	if err != nil {
		sum.Error = err.Error()
	}
	if err == nil && opts.Linger > 0 {
		most := cmp.Or(env.LingerMax, stateLingerMax)
		said := false
		linger(ctx, opts.Linger, func() bool {
			// Whatever the mode, a state transfer under way is let finish.
			m := !p.StateIdle(time.Second) || (env.LingerWhile != nil && env.LingerWhile())
			if m && !said {
				said = true
				opts.Log.Info("staying up: peers are still finishing or fetching state from this one", "at most", most)
			}
			return m
		}, most)
	}
	if opts.Out != "" {
		if werr := writeSummary(opts.Out, sum, rec); werr != nil && err == nil {
			err = werr
		}
	}
	return sum, err
}

// Horizon returns the local steps this peer is to take, which a schedule
// other than constant spans: the rounds times the local steps (or epochs
// of a shard of shardLen samples) of --mode federated, the job's steps of
// sync, --steps of async, gossip and ps (0 when only --duration bounds them).
func (o *Options) Horizon(shardLen int) int {
	switch o.Mode {
	case "federated":
		per := o.Fed.LocalSteps
		if per == 0 {
			per = o.Fed.LocalEpochs * ((shardLen + o.Worker.Batch - 1) / max(o.Worker.Batch, 1))
		}
		return o.Fed.Rounds * per
	case "sync":
		return o.Sync.Sync.Steps
	case "async", "gossip", "ps":
		return o.Async.Steps
	case "pipeline":
		return o.Pipeline.Steps
	}
	return 0
}

// openEnded returns schedule for a run of total steps, or for a run of no
// known length (total 0) its warmup, if any, followed by a constant rate:
// a decay needs to know where it ends.
func openEnded(schedule string, total int) string {
	if total > 0 {
		return schedule
	}
	if i := strings.LastIndex(schedule, "+"); i >= 0 && strings.HasPrefix(schedule, "warmup") {
		return schedule[:i+1] + "constant"
	}
	return "constant"
}

// otherModels explains a wait for peers that heard from peers of another
// model, which it ignored, or returns "".
func otherModels(p *swarm.Peer, wl *workload.Workload) string {
	n := p.Control.Stats().Drop(gossip.DropModel)
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(" (ignored %d messages from peers training another model: this peer trains %s, %s; peers average only models of the same architecture and vocabulary)", n, wl.ID(), wl.Arch())
}

// linger waits least, then while more() holds, until most has passed
// since it began or ctx ends.
func linger(ctx context.Context, least time.Duration, more func() bool, most time.Duration) {
	start := time.Now()
	select {
	case <-ctx.Done():
		return
	case <-time.After(least):
	}
	if more == nil {
		return
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for more() && time.Since(start) < most {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func roundWord(mode string) string {
	if mode == "federated" {
		return "round"
	}
	return "step"
}

// writeSummary writes summary.json, the accuracy curves and, when the
// strategy merged stale contributions, the staleness histogram.
func writeSummary(dir string, sum *Summary, rec *train.MemRecorder) error {
	b, err := json.MarshalIndent(sum, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "summary.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	var xs, ts, acc []float64
	for _, p := range sum.Curve {
		if p.Accuracy > 0 {
			xs, ts, acc = append(xs, float64(p.Round)), append(ts, p.Seconds), append(acc, p.Accuracy)
		}
	}
	name := sum.Mode + " " + sum.Strategy
	if err := plot.Lines(filepath.Join(dir, "accuracy.png"), "Test accuracy", roundWord(sum.Mode), "accuracy", []plot.Series{{Name: name, X: xs, Y: acc}}); err != nil {
		return err
	}
	if err := plot.Lines(filepath.Join(dir, "accuracy_time.png"), "Test accuracy over time", "seconds", "accuracy", []plot.Series{{Name: name, X: ts, Y: acc}}); err != nil {
		return err
	}
	hist := map[int]int{}
	for _, e := range rec.Events() {
		if e.Kind == "merge" {
			hist[e.Staleness]++
		}
	}
	if len(hist) > 0 {
		return plot.Histogram(filepath.Join(dir, "staleness.png"), "Staleness of merged contributions", "τ", hist)
	}
	return nil
}
