package train_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/starling-ml/starling/data"
	"github.com/starling-ml/starling/nn"
	"github.com/starling-ml/starling/train"
	"github.com/starling-ml/starling/train/traintest"
)

var pipeLM = nn.CharLMConfig{Vocab: 11, Context: 6, Dim: 8, Heads: 2, Layers: 2, MLPRatio: 2}

func pipeData(t testing.TB) data.Dataset {
	t.Helper()
	r := rand.New(rand.NewPCG(7, 7))
	tok := make([]int32, 64*6+1)
	for i := range tok {
		tok[i] = int32(r.IntN(pipeLM.Vocab))
	}
	ds, err := data.NewWindows(tok, pipeLM.Vocab, pipeLM.Context, 0)
	if err != nil {
		t.Fatal(err)
	}
	return ds
}

func pipeWorker(t testing.TB, ds data.Dataset, opt string, clip ...float64) *train.Worker {
	t.Helper()
	cfg := train.WorkerConfig{Model: pipeLM.String(), Batch: 8, LR: 0.05, Optimizer: opt, ModelSeed: 3, DataSeed: 4}
	if len(clip) > 0 {
		cfg.ClipNorm = clip[0]
	}
	w, err := train.NewWorker(cfg, ds, train.WithModel(func(seed uint64) (*nn.Model, error) { return nn.NewCharLM(pipeLM, seed) }))
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// pipeStages builds k workers, each with stage i of its own model, linked
// by pipe.
func pipeStages(t testing.TB, ds data.Dataset, k int, pipe *traintest.MemPipe, cfg train.PipeConfig, opt string, clip ...float64) []*train.Pipeline {
	t.Helper()
	ps := make([]*train.Pipeline, k)
	for i := range k {
		w := pipeWorker(t, ds, opt, clip...)
		sts, err := w.Model.Stages(k)
		if err != nil {
			t.Fatal(err)
		}
		if ps[i], err = train.NewPipeline(w, sts[i], pipe.Link(i), cfg); err != nil {
			t.Fatal(err)
		}
	}
	return ps
}

// stepAll runs one step of every stage concurrently and returns their
// results and errors.
func stepAll(ctx context.Context, ps []*train.Pipeline) ([]train.PipeStep, []error) {
	res, errs := make([]train.PipeStep, len(ps)), make([]error, len(ps))
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Go(func() { res[i], errs[i] = p.Step(ctx) })
	}
	wg.Wait()
	return res, errs
}

// TestPipelineGradsMatchSingleNode trains the tiny CharLM for three steps
// on one node and as a pipeline of K stages over the in-memory link, and
// checks every step's loss, every stage's gradient and parameters against
// the single node's to 1e-5, for both schedules, with and without
// clipping by the global gradient norm (0.05 clips every step here).
// (SGD with momentum: Adam turns rounding-level gradients of opposite
// signs into full steps of opposite signs, so its parameters differ where
// the gradients agree to 1e-9.)
func TestPipelineGradsMatchSingleNode(t *testing.T) {
	ds := pipeData(t)
	for _, sched := range []string{train.PipeGPipe, train.Pipe1F1B} {
		for _, k := range []int{2, 3, 4} {
			for _, m := range []int{1, 4} {
				for _, clip := range []float64{0, 0.05} {
					t.Run(fmt.Sprintf("%s/k=%d/m=%d/clip=%v", sched, k, m, clip), func(t *testing.T) {
						ref := pipeWorker(t, ds, "momentum", clip)
						cfg := train.PipeConfig{Micro: m, Schedule: sched, Timeout: 10 * time.Second}
						ps := pipeStages(t, ds, k, traintest.NewMemPipe(k), cfg, "momentum", clip)
						for step := range 3 {
							wantLoss, _, err := ref.Grad(context.Background())
							if err != nil {
								t.Fatal(err)
							}
							res, errs := stepAll(context.Background(), ps)
							for i, err := range errs {
								if err != nil {
									t.Fatalf("step %d stage %d: %v", step, i, err)
								}
							}
							if got := res[k-1].Loss; math.Abs(got-wantLoss) > 1e-5 {
								t.Errorf("step %d: pipeline loss %v, single node %v", step, got, wantLoss)
							}
							for i, p := range ps {
								st := p.Stage()
								compare(t, fmt.Sprintf("step %d stage %d grad", step, i), st.Grads, ref.Model.Grads[st.Offset:st.Offset+len(st.Grads)])
							}
							ref.Apply(8)
							for i, p := range ps {
								st := p.Stage()
								compare(t, fmt.Sprintf("step %d stage %d params", step, i), st.Params, ref.Model.Params[st.Offset:st.Offset+len(st.Params)])
							}
							if sched == train.Pipe1F1B && res[k-1].Recomputed != 0 {
								t.Errorf("1F1B's last stage recomputed %d forwards", res[k-1].Recomputed)
							}
						}
					})
				}
			}
		}
	}
}

func compare(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range got {
		if d := math.Abs(float64(got[i] - want[i])); d > 1e-5 {
			t.Fatalf("%s[%d] = %v, single node %v (diff %g)", what, i, got[i], want[i], d)
		}
	}
}

// TestPipelineStageDies kills the middle stage of three after a step: the
// others stop within their deadline with an error naming the stage and
// what they waited for. The stages then restart from the checkpoints
// taken after the first step and end where an unbroken run does.
func TestPipelineStageDies(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ds := pipeData(t)
		cfg := train.PipeConfig{Micro: 2, Schedule: train.Pipe1F1B, Timeout: 5 * time.Second}
		ctx := context.Background()

		// The unbroken run: three steps.
		ref := pipeStages(t, ds, 3, traintest.NewMemPipe(3), cfg, "momentum")
		for range 3 {
			if _, errs := stepAll(ctx, ref); errors.Join(errs...) != nil {
				t.Fatal(errors.Join(errs...))
			}
		}

		pipe := traintest.NewMemPipe(3)
		ps := pipeStages(t, ds, 3, pipe, cfg, "momentum")
		if _, errs := stepAll(ctx, ps); errors.Join(errs...) != nil {
			t.Fatal(errors.Join(errs...))
		}
		cks := make([]*train.Checkpoint, 3)
		for i, p := range ps {
			cks[i] = &train.Checkpoint{Mode: "pipeline"}
			cks[i].Capture(p.Worker())
		}
		pipe.Kill(1)
		start := time.Now()
		_, errs := stepAll(ctx, ps)
		if el := time.Since(start); el > 2*cfg.Timeout {
			t.Errorf("the pipeline took %v to stop, deadline %v", el, cfg.Timeout)
		}
		for _, i := range []int{0, 2} {
			if !errors.Is(errs[i], train.ErrPipeline) || !strings.Contains(errs[i].Error(), "from stage 1") {
				t.Errorf("stage %d: %v, want ErrPipeline waiting on stage 1", i, errs[i])
			} else {
				t.Logf("stage %d: %v", i, errs[i])
			}
		}

		// Restart every stage from its checkpoint.
		pipe.Revive(1)
		pipe = traintest.NewMemPipe(3)
		restarted := make([]*train.Pipeline, 3)
		for i := range 3 {
			w := pipeWorker(t, ds, "momentum")
			if err := cks[i].Restore(w); err != nil {
				t.Fatal(err)
			}
			sts, _ := w.Model.Stages(3)
			var err error
			if restarted[i], err = train.NewPipeline(w, sts[i], pipe.Link(i), cfg); err != nil {
				t.Fatal(err)
			}
		}
		for range 2 {
			if _, errs := stepAll(ctx, restarted); errors.Join(errs...) != nil {
				t.Fatal(errors.Join(errs...))
			}
		}
		for i := range 3 {
			compare(t, fmt.Sprintf("resumed stage %d params", i), restarted[i].Stage().Params, ref[i].Stage().Params)
		}
	})
}

func TestPipelineBadConfig(t *testing.T) {
	ds := pipeData(t)
	w := pipeWorker(t, ds, "sgd")
	sts, _ := w.Model.Stages(2)
	for _, cfg := range []train.PipeConfig{
		{Micro: 0, Schedule: train.Pipe1F1B, Timeout: time.Second},
		{Micro: 2, Schedule: "zigzag", Timeout: time.Second},
		{Micro: 2, Schedule: train.Pipe1F1B},
		{Micro: 9, Schedule: train.Pipe1F1B, Timeout: time.Second}, // batch 8
	} {
		if _, err := train.NewPipeline(w, sts[0], traintest.NewMemPipe(2).Link(0), cfg); !errors.Is(err, train.ErrPipeline) {
			t.Errorf("%+v: %v, want ErrPipeline", cfg, err)
		}
	}
}

// TestPipelineEvaluate: a pipeline's evaluation of a dataset equals one
// node's, after a training step, on every stage count, in one batch and
// in 13 (the last one short).
func TestPipelineEvaluate(t *testing.T) {
	ds := pipeData(t)
	for _, c := range []struct{ k, batch int }{{1, 0}, {2, 0}, {4, 0}, {3, 5}} {
		k := c.k
		ref := pipeWorker(t, ds, "momentum")
		if _, err := ref.Step(context.Background()); err != nil {
			t.Fatal(err)
		}
		wantLoss, wantAcc := ref.Evaluate(ds)
		ps := pipeStages(t, ds, k, traintest.NewMemPipe(k), train.PipeConfig{Micro: 2, Schedule: train.Pipe1F1B, Timeout: 10 * time.Second, EvalBatch: c.batch}, "momentum")
		if _, errs := stepAll(context.Background(), ps); errors.Join(errs...) != nil {
			t.Fatal(errors.Join(errs...))
		}
		loss, acc := make([]float64, k), make([]float64, k)
		errs := make([]error, k)
		var wg sync.WaitGroup
		for i, p := range ps {
			var in data.Dataset
			if i == 0 {
				in = ds
			}
			wg.Go(func() { loss[i], acc[i], errs[i] = p.Evaluate(context.Background(), in) })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		if math.Abs(loss[k-1]-wantLoss) > 1e-5 || math.Abs(acc[k-1]-wantAcc) > 1e-9 {
			t.Errorf("k=%d batch %d: pipeline evaluates to %v, %v; one node %v, %v", k, c.batch, loss[k-1], acc[k-1], wantLoss, wantAcc)
		}
	}
}

// memAverage returns an Average for n replicas of one stage: each call
// waits for the n gradients of its step and takes their mean.
func memAverage(n int) func(ctx context.Context, step uint64, g []float32) error {
	type round struct {
		sum   []float32
		count int
		done  chan struct{}
	}
	var mu sync.Mutex
	rounds := map[uint64]*round{}
	return func(ctx context.Context, step uint64, g []float32) error {
		mu.Lock()
		r := rounds[step]
		if r == nil {
			r = &round{sum: make([]float32, len(g)), done: make(chan struct{})}
			rounds[step] = r
		}
		for i, v := range g {
			r.sum[i] += v
		}
		r.count++
		if r.count == n {
			for i := range r.sum {
				r.sum[i] /= float32(n)
			}
			close(r.done)
		}
		mu.Unlock()
		select {
		case <-r.done:
		case <-ctx.Done():
			return ctx.Err()
		}
		copy(g, r.sum)
		return nil
	}
}

// TestPipelinesAveraging runs two 2-stage pipelines whose stages average
// their gradients (pipeline × data parallelism): each stage's gradient
// equals the mean of two single nodes' that draw the two replicas'
// batches, and the replicas' parameters stay equal.
func TestPipelinesAveraging(t *testing.T) {
	ds := pipeData(t)
	const k, replicas = 2, 2
	avg := []func(context.Context, uint64, []float32) error{memAverage(replicas), memAverage(replicas)}
	var all []*train.Pipeline
	var refs []*train.Worker
	for r := range replicas {
		pipe := traintest.NewMemPipe(k)
		for i := range k {
			w := pipeWorker(t, ds, "momentum", 0.05)
			sts, _ := w.Model.Stages(k)
			p, err := train.NewPipeline(w, sts[i], pipe.Link(i), train.PipeConfig{Micro: 2, Schedule: train.Pipe1F1B, Timeout: 10 * time.Second, Replica: r, Average: avg[i]})
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, p)
		}
		// A single node that draws replica r's batches: a one-stage
		// pipeline of one micro-batch.
		w := pipeWorker(t, ds, "momentum")
		sts, _ := w.Model.Stages(1)
		if _, err := train.NewPipeline(w, sts[0], traintest.NewMemPipe(1).Link(0), train.PipeConfig{Micro: 1, Schedule: train.Pipe1F1B, Timeout: time.Second, Replica: r}); err != nil {
			t.Fatal(err)
		}
		refs = append(refs, w)
	}
	ref := pipeWorker(t, ds, "momentum", 0.05)
	for step := range 2 {
		want := make([]float32, len(ref.Model.Grads))
		var losses []float64
		for _, w := range refs {
			loss, _, err := w.Grad(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			losses = append(losses, loss)
			for i, g := range w.Model.Grads {
				want[i] += g / replicas
			}
			w.Apply(8) // keep the references at the pipelines' parameters
		}
		if losses[0] == losses[1] {
			t.Fatalf("step %d: both replicas drew batches of loss %v: they should differ", step, losses[0])
		}
		copy(ref.Model.Grads, want)
		nn.ClipGlobalNorm(ref.Model.Backend(), ref.Model.Grads, 0.05)
		if _, errs := stepAll(context.Background(), all); errors.Join(errs...) != nil {
			t.Fatal(errors.Join(errs...))
		}
		for j, p := range all {
			st := p.Stage()
			compare(t, fmt.Sprintf("step %d pipeline %d stage %d grad", step, j/k, st.Index), st.Grads, ref.Model.Grads[st.Offset:st.Offset+len(st.Grads)])
		}
		ref.Apply(16)
		for _, w := range refs {
			copy(w.Model.Params, ref.Model.Params)
		}
		for j, p := range all {
			st := p.Stage()
			compare(t, fmt.Sprintf("step %d pipeline %d stage %d params", step, j/k, st.Index), st.Params, ref.Model.Params[st.Offset:st.Offset+len(st.Params)])
		}
	}
}
