// Compression experiments: what gradient compression costs synchronous
// data-parallel SGD in accuracy and saves in bytes. N peers, each a
// train.Worker on an IID shard of the training set, run train.Sync over
// the simulated network with Config.Compress set to the codec under test,
// and every peer's all-reduce sends are counted. The same seed gives every
// codec the same initial model, data shards and batch order, so the rows
// of the table differ only in the codec.
//
//	rows, err := sim.Compression(ctx, sim.DefaultCompressConfig(), trainSet, testSet, nil)
//
// Test accuracy is evaluated after every epoch from parameter snapshots,
// after the run, so evaluation never stalls an all-reduce.

package sim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/starling-ml/starling/aggregate"
	"github.com/starling-ml/starling/compression"
	"github.com/starling-ml/starling/data"
	"github.com/starling-ml/starling/train"
)

// CompressConfig describes one experiment.
type CompressConfig struct {
	// Peers is the number of peers. Default 4.
	Peers int
	// Epochs is the number of passes over each peer's shard. Default 5.
	Epochs int
	// Worker sets the model, per-peer batch, optimiser and learning rate;
	// ModelSeed, DataSeed and TotalSteps are derived from Seed and Epochs.
	// Default: FedAvg's 2NN (784-200-200-10), batch 64 per peer, SGD with
	// momentum 0.9 at 0.05 decayed on a cosine to 0 (so that the last
	// epoch's accuracy is a stable figure to compare codecs by).
	Worker train.WorkerConfig
	// Algorithm is the all-reduce algorithm. Default Auto (a butterfly
	// for the 2NN's 199 210 parameters).
	Algorithm aggregate.Algorithm
	// Codecs are the --compress specs to compare; "fp32" is the baseline
	// run of plain float32 chunks (aggregate's uncompressed path).
	Codecs []compression.Spec
	// Seed drives the shards, the batch order and the initial model.
	Seed uint64
	// StallTimeout bounds every wait on a peer (aggregate.Config).
	StallTimeout time.Duration
}

// DefaultCodecs are the rows of issue 5's table.
func DefaultCodecs() []compression.Spec {
	var out []compression.Spec
	for _, s := range []string{"fp32", "fp16", "bf16", "int8", "topk:0.01,ef", "topk:0.01", "sign:ef", "randk:0.01,ef", "powersgd:4,ef"} {
		out = append(out, compression.MustSpec(s))
	}
	return out
}

// DefaultCompressConfig returns the settings documented on CompressConfig.
func DefaultCompressConfig() CompressConfig {
	wc := train.DefaultWorkerConfig()
	wc.Model, wc.Batch, wc.LR, wc.Optimizer, wc.Schedule = "mlp", 64, 0.05, "momentum", "cosine"
	return CompressConfig{Peers: 4, Epochs: 5, Worker: wc, Codecs: DefaultCodecs(), Seed: 1, StallTimeout: aggregate.DefaultConfig().StallTimeout}
}

// Validate reports settings that cannot run.
func (c CompressConfig) Validate() error {
	switch {
	case c.Peers < 1:
		return fmt.Errorf("sim: %d peers", c.Peers)
	case c.Epochs < 1:
		return fmt.Errorf("sim: %d epochs", c.Epochs)
	case len(c.Codecs) == 0:
		return fmt.Errorf("sim: no codecs")
	}
	for _, s := range c.Codecs {
		nc := c.network(s)
		if err := swarmConfig(&nc, "mlp", nil).Aggregate.Validate(); err != nil {
			return err
		}
	}
	return c.Worker.Validate()
}

// network is the simulated network of a run of spec.
func (c CompressConfig) network(spec compression.Spec) Config {
	nc := DefaultConfig()
	nc.Peers, nc.Seed, nc.Worker, nc.Bandwidth, nc.Latency = c.Peers, c.Seed, c.Worker, 0, 0
	nc.SyncAlgorithm, nc.StallTimeout = c.Algorithm.String(), c.StallTimeout
	if spec.Desc().ID != compression.IDFP32 {
		nc.Compress = spec
	}
	return nc
}

// EpochPoint is the model's test accuracy after an epoch.
type EpochPoint struct {
	Epoch    int     `json:"epoch"`
	Steps    int     `json:"steps"`
	Accuracy float64 `json:"accuracy"`
	Loss     float64 `json:"loss"`
}

// CompressRow is one codec's outcome.
type CompressRow struct {
	Codec string `json:"codec"`
	// ErrorFeedback reports whether the codec ran with error feedback.
	ErrorFeedback bool `json:"error_feedback"`
	// LeftOut counts the steps some peer was left out of (a stall on a
	// starved machine); 0 in a clean run.
	LeftOut int `json:"left_out,omitempty"`
	// FinalAccuracy is the test accuracy after the last epoch.
	FinalAccuracy float64 `json:"final_accuracy"`
	// DeltaPP is FinalAccuracy minus the fp32 row's, in percentage points
	// (0 when there is no fp32 row).
	DeltaPP float64 `json:"delta_pp"`
	// BytesPerPeer is the mean over peers of the bytes each put on its link
	// during the whole run (data, headers and votes).
	BytesPerPeer float64 `json:"bytes_per_peer"`
	// BytesPerStep is BytesPerPeer per training step.
	BytesPerStep float64 `json:"bytes_per_step"`
	// Ratio is the fp32 row's BytesPerStep over this row's.
	Ratio float64 `json:"ratio"`
	// Steps is the number of synchronous steps.
	Steps int `json:"steps"`
	// DivergedAt is the step at which the training loss stopped being
	// finite (0: it did not); the run stops there, and FinalAccuracy and
	// Curve are those of the epochs completed before.
	DivergedAt int `json:"diverged_at,omitempty"`
	// TrainLoss is the last epoch's mean training loss on peer 0.
	TrainLoss float64 `json:"train_loss"`
	// WallS is the run's wall-clock time (peers share the machine's cores).
	WallS float64 `json:"wall_s"`
	// Curve is the test accuracy after every epoch.
	Curve []EpochPoint `json:"curve"`
}

// Compression runs every codec of cfg in turn and returns one row per codec, with
// DeltaPP and Ratio filled against the fp32 row when there is one.
// progress, if not nil, sees one line per finished epoch and run.
func Compression(ctx context.Context, cfg CompressConfig, trainSet, testSet *data.Set, progress func(string)) ([]CompressRow, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var rows []CompressRow
	for _, spec := range cfg.Codecs {
		row, err := CompressionOne(ctx, cfg, spec, trainSet, testSet, progress)
		if err != nil {
			return rows, fmt.Errorf("%s: %w", spec, err)
		}
		rows = append(rows, *row)
	}
	CompareCodecs(rows)
	return rows, nil
}

// CompareCodecs fills DeltaPP and Ratio against the fp32 row, if any.
func CompareCodecs(rows []CompressRow) {
	i := slices.IndexFunc(rows, func(r CompressRow) bool { return r.Codec == "fp32" })
	if i < 0 {
		return
	}
	base := rows[i]
	for k := range rows {
		rows[k].DeltaPP = 100 * (rows[k].FinalAccuracy - base.FinalAccuracy)
		if rows[k].BytesPerStep > 0 {
			rows[k].Ratio = base.BytesPerStep / rows[k].BytesPerStep
		}
	}
}

// CompressionOne trains with one codec and returns its row.
func CompressionOne(ctx context.Context, cfg CompressConfig, spec compression.Spec, trainSet, testSet *data.Set, progress func(string)) (*CompressRow, error) {
	nc := cfg.network(spec)
	parts, err := data.IID(trainSet.Len(), cfg.Peers, cfg.Seed)
	if err != nil {
		return nil, err
	}
	spe := math.MaxInt
	for _, p := range parts {
		spe = min(spe, (len(p)+cfg.Worker.Batch-1)/cfg.Worker.Batch)
	}
	netw, err := newNetwork(ctx, &nc, slog.New(slog.DiscardHandler), formation{})
	if err != nil {
		return nil, err
	}
	defer netw.close()
	workers := make([]*train.Worker, cfg.Peers)
	for i, p := range netw.peers {
		wc := cfg.Worker
		wc.ModelSeed, wc.DataSeed, wc.TotalSteps = cfg.Seed, cfg.Seed*1000+uint64(i)+1, cfg.Epochs*spe
		if workers[i], err = train.NewWorker(wc, trainSet.Subset(parts[i])); err != nil {
			return nil, err
		}
		if c := p.Swarm.Runner.Compression(); c != nil {
			if err := c.SetLayout(train.CompressionLayout(workers[i].Model)); err != nil {
				return nil, err
			}
		}
	}
	row := &CompressRow{Codec: spec.String(), Steps: cfg.Epochs * spe}
	if c := netw.peers[0].Swarm.Runner.Compression(); c != nil {
		row.ErrorFeedback = c.ErrorFeedback()
	}

	// Parameter snapshots of peer 0 after every epoch, evaluated later.
	snaps := make([][]float32, cfg.Epochs)
	losses := make([]float64, cfg.Epochs)
	start := time.Now()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]error, cfg.Peers)
	diverged := make([]int, cfg.Peers)
	leftOut := make([]int, cfg.Peers)
	var wg sync.WaitGroup
	for i := range cfg.Peers {
		wg.Go(func() {
			p := netw.peers[i]
			step, left, err := compressPeer(ctx, p.Swarm.Net(cfg.Worker.Batch), workers[i], row.Steps, spe, func(epoch int, loss float64) {
				if i == 0 {
					snaps[epoch] = slices.Clone(workers[i].Model.Params)
					losses[epoch] = loss
				}
			})
			leftOut[i] = left
			switch {
			case errors.Is(err, train.ErrDiverged):
				diverged[i] = step
				cancel()
			case err != nil && ctx.Err() == nil:
				errs[i] = fmt.Errorf("%s: %w", peerName(i), err)
				cancel()
			}
		})
	}
	wg.Wait()
	row.WallS = time.Since(start).Seconds()
	for i, s := range diverged {
		if s > 0 && (row.DivergedAt == 0 || s < row.DivergedAt) {
			row.DivergedAt = s
		}
		row.LeftOut += leftOut[i]
	}
	if err := errors.Join(errs...); err != nil && row.DivergedAt == 0 {
		return nil, err
	}
	if err := ctx.Err(); err != nil && row.DivergedAt == 0 {
		return nil, err
	}
	// Synchronous SGD keeps every replica identical: a cheap check that
	// every peer applied the same bits every step.
	for i, w := range workers[1:] {
		if row.DivergedAt == 0 && !slices.Equal(w.Model.Params, workers[0].Model.Params) {
			return nil, fmt.Errorf("sim: peer %d's parameters differ from peer 0's", i+1)
		}
	}
	for _, p := range netw.peers {
		row.BytesPerPeer += float64(p.sent.Load()) / float64(cfg.Peers)
	}
	ran := row.Steps
	if row.DivergedAt > 0 {
		ran = row.DivergedAt
	}
	row.BytesPerStep = row.BytesPerPeer / float64(ran)

	eval := workers[0]
	final := slices.Clone(eval.Model.Params)
	for e, p := range snaps {
		if p == nil {
			break // diverged
		}
		copy(eval.Model.Params, p)
		loss, acc := eval.Evaluate(testSet)
		row.Curve = append(row.Curve, EpochPoint{Epoch: e + 1, Steps: (e + 1) * spe, Accuracy: acc, Loss: loss})
		if progress != nil {
			progress(fmt.Sprintf("%-14s epoch %d  train loss %.4f  test acc %.2f%%  test loss %.4f", spec, e+1, losses[e], 100*acc, loss))
		}
	}
	copy(eval.Model.Params, final)
	if n := len(row.Curve); n > 0 {
		row.FinalAccuracy = row.Curve[n-1].Accuracy
		row.TrainLoss = losses[n-1]
	}
	if progress != nil && row.DivergedAt > 0 {
		progress(fmt.Sprintf("%-14s diverged at step %d of %d (loss not finite)", spec, row.DivergedAt, row.Steps))
	}
	if progress != nil {
		progress(fmt.Sprintf("%-14s done: test acc %.2f%%, %.0f bytes/peer (%.0f per step), %.0fs", spec, 100*row.FinalAccuracy, row.BytesPerPeer, row.BytesPerStep, row.WallS))
	}
	return row, nil
}

// compressPeer runs train.Sync for one peer for steps steps and calls
// epochEnd(e, meanLoss) after every spe steps it applied. It returns the
// last step the peer reached, the number of steps it was left out of, and
// Sync's error (wrapping train.ErrDiverged when the loss stopped being
// finite).
func compressPeer(ctx context.Context, net train.Net, w *train.Worker, steps, spe int, epochEnd func(int, float64)) (int, int, error) {
	cfg := train.DefaultSyncConfig()
	cfg.Steps, cfg.SnapshotEvery = steps, 0
	cfg.GroupSize = 0 // one group: codecs compare on identical replicas
	var (
		lossSum float64
		samples int
		last    int
		left    int
	)
	err := train.Sync(ctx, w, net, cfg, nil, func(si train.StepInfo) bool {
		switch {
		case si.Failed:
			left++
			return false
		case si.Joined:
			last = int(si.Step)
			return false
		}
		last = int(si.Step)
		lossSum += si.Loss * float64(si.Samples)
		samples += si.Samples
		if last%spe == 0 {
			epochEnd(last/spe-1, lossSum/float64(max(samples, 1)))
			lossSum, samples = 0, 0
		}
		return false
	})
	return last + 1, left, err
}

// CompressTable formats rows as an aligned text table.
func CompressTable(rows []CompressRow) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-15s %4s %9s %8s %14s %12s %9s\n", "codec", "EF", "test acc", "Δ pp", "bytes/peer", "bytes/step", "× fewer")
	for _, r := range rows {
		ef := "no"
		if r.ErrorFeedback {
			ef = "yes"
		}
		if r.DivergedAt > 0 {
			fmt.Fprintf(&b, "%-15s %4s  diverged at step %d of %d (loss NaN/Inf); %.0f bytes/step until then\n", r.Codec, ef, r.DivergedAt, r.Steps, r.BytesPerStep)
			continue
		}
		fmt.Fprintf(&b, "%-15s %4s %8.2f%% %+8.2f %14.0f %12.0f %9.1f\n", r.Codec, ef, 100*r.FinalAccuracy, r.DeltaPP, r.BytesPerPeer, r.BytesPerStep, r.Ratio)
	}
	return b.String()
}

// MeanCompressRows averages repeated runs of the same codecs (same order) into one
// row per codec: accuracies, losses and bytes are means; Curve is the
// first run's, and DivergedAt the first that diverged.
func MeanCompressRows(runs [][]CompressRow) []CompressRow {
	if len(runs) == 0 {
		return nil
	}
	out := slices.Clone(runs[0])
	for k := range out {
		var acc, loss, bytes, perStep, wall float64
		for _, run := range runs {
			acc += run[k].FinalAccuracy
			loss += run[k].TrainLoss
			bytes += run[k].BytesPerPeer
			perStep += run[k].BytesPerStep
			wall += run[k].WallS
			if out[k].DivergedAt == 0 {
				out[k].DivergedAt = run[k].DivergedAt
			}
		}
		n := float64(len(runs))
		out[k].FinalAccuracy, out[k].TrainLoss, out[k].BytesPerPeer, out[k].BytesPerStep, out[k].WallS = acc/n, loss/n, bytes/n, perStep/n, wall/n
	}
	CompareCodecs(out)
	return out
}
