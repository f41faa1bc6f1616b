package train_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/starling-ml/starling/data"
	"github.com/starling-ml/starling/nn"
	"github.com/starling-ml/starling/train"
	"github.com/starling-ml/starling/train/traintest"
)

// BenchmarkPipelineCharLM trains the default CharLM (0.83 M parameters,
// 128 positions, batch 32, AdamW, clip 1: workload.CharLMTuning) on one
// node and as K-stage pipelines in one process over traintest.MemPipe,
// and reports samples/s and the measured bubble, 1 − Σ busy / (K × wall),
// against the (K−1)/(M+K−1) bound. All stages share this machine's cores,
// so a pipeline cannot be faster than one node here; busy time includes
// the forwards re-run before a backward (GPipe's re-materialisation).
//
//	go test ./train -run '^$' -bench PipelineCharLM -benchtime 20x
func BenchmarkPipelineCharLM(b *testing.B) {
	cfg := nn.DefaultCharLMConfig()
	r := rand.New(rand.NewPCG(1, 2))
	tok := make([]int32, 64*cfg.Context+1)
	for i := range tok {
		tok[i] = int32(r.IntN(cfg.Vocab))
	}
	ds, err := data.NewWindows(tok, cfg.Vocab, cfg.Context, 0)
	if err != nil {
		b.Fatal(err)
	}
	worker := func() *train.Worker {
		w, err := train.NewWorker(train.WorkerConfig{Model: cfg.String(), Batch: 32, LR: 4e-3, Optimizer: "adamw", WeightDecay: 0.1, ClipNorm: 1, ModelSeed: 1, DataSeed: 1}, ds,
			train.WithModel(func(seed uint64) (*nn.Model, error) { return nn.NewCharLM(cfg, seed) }))
		if err != nil {
			b.Fatal(err)
		}
		return w
	}
	b.Run("single", func(b *testing.B) {
		w := worker()
		w.Step(context.Background()) // warm-up
		start := time.Now()
		for b.Loop() {
			if _, err := w.Step(context.Background()); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(32*b.N)/time.Since(start).Seconds(), "samples/s")
	})
	for _, sched := range []string{train.PipeGPipe, train.Pipe1F1B} {
		for _, k := range []int{2, 4} {
			for _, m := range []int{4, 8} {
				b.Run(fmt.Sprintf("%s/k=%d/m=%d", sched, k, m), func(b *testing.B) {
					pipe := traintest.NewMemPipe(k)
					ps := make([]*train.Pipeline, k)
					for i := range k {
						w := worker()
						sts, err := w.Model.Stages(k)
						if err != nil {
							b.Fatal(err)
						}
						if ps[i], err = train.NewPipeline(w, sts[i], pipe.Link(i), train.PipeConfig{Micro: m, Schedule: sched, Timeout: time.Minute}); err != nil {
							b.Fatal(err)
						}
					}
					ctx := context.Background()
					stepAll(ctx, ps) // warm-up
					var busy time.Duration
					recomputed := 0
					start := time.Now()
					for b.Loop() {
						res, errs := stepAll(ctx, ps)
						if err := errors.Join(errs...); err != nil {
							b.Fatal(err)
						}
						for _, r := range res {
							busy += r.Busy
							recomputed += r.Recomputed
						}
					}
					wall := time.Since(start)
					b.ReportMetric(float64(32*b.N)/wall.Seconds(), "samples/s")
					b.ReportMetric(100*(1-busy.Seconds()/(float64(k)*wall.Seconds())), "bubble%")
					b.ReportMetric(100*train.PipeBubbleBound(k, m), "bound%")
					b.ReportMetric(float64(recomputed)/float64(b.N), "recomputed/step")
				})
			}
		}
	}
}
