package nn

import (
	"math"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/starling-ml/starling/internal/rusage"
)

// precisions runs a benchmark once per precision, as sub-benchmarks
// "precision=fp32" and "precision=bf16" (compare them with
// benchstat -col /precision).
func precisions(b *testing.B, f func(b *testing.B, p Precision)) {
	for _, p := range []Precision{FP32, BF16} {
		b.Run("precision="+p.String(), func(b *testing.B) { f(b, p) })
	}
}

// BenchmarkMLPStep times one training step (forward, backward, SGD update)
// of an MLP 784-128-10 at batch 256, the shape ../shared/bench/torch_mlp.py
// times in PyTorch, and reports the GEMM throughput it reaches.
func BenchmarkMLPStep(b *testing.B) {
	precisions(b, func(b *testing.B, p Precision) { benchStep(b, "mlp:784-128-10", 256, p) })
}

// BenchmarkCNNStep times one training step of FedAvg's CNN at batch 64.
func BenchmarkCNNStep(b *testing.B) {
	precisions(b, func(b *testing.B, p Precision) { benchStep(b, "cnn", 64, p) })
}

// BenchmarkCharLMStep times one training step (forward, backward, AdamW
// update) of the default CharLM at batch 32 (4,096 positions).
func BenchmarkCharLMStep(b *testing.B) {
	precisions(b, func(b *testing.B, p Precision) {
		cfg := DefaultCharLMConfig()
		m, err := NewCharLM(cfg, 1, WithPrecision(p))
		if err != nil {
			b.Fatal(err)
		}
		const batch = 32
		r := rand.New(rand.NewPCG(1, 2))
		x := randTokens(r, batch*cfg.Context, cfg.Vocab)
		runSteps(b, m, x, randTargets(r, m, batch), NewAdam(AdamConfig{Decoupled: true, WeightDecay: 0.1}, WithBackend(m.Backend())), 1e-3)
	})
}

func benchStep(b *testing.B, arch string, batch int, p Precision) {
	m, err := New(arch, 1, WithPrecision(p))
	if err != nil {
		b.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	x := randInput(r, batch*m.Input.Size())
	y := make([]int32, batch)
	for i := range y {
		y[i] = int32(r.IntN(10))
	}
	runSteps(b, m, x, y, NewSGD(SGDConfig{}, WithBackend(m.Backend())), 0.01)
}

// runSteps times training steps of m on one batch and reports the GEMM
// throughput: forward GEMMs once, backward twice, less the first layer's
// input gradient (none for an Embedding); and the live heap after the
// warm-up steps (model, optimiser state, every layer's buffers and the
// batch: what a step keeps), in MB; and the process's CPU time per step.
func runSteps(b *testing.B, m *Model, x []float32, y []int32, opt Optimizer, lr float32) {
	for i := 0; i < 3; i++ {
		m.ForwardBackward(x, y)
		opt.Step(m.Params, m.Grads, lr)
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	live := float64(ms.HeapAlloc) / 1e6
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := rusage.CPU()
	for i := 0; i < b.N; i++ {
		m.ForwardBackward(x, y)
		opt.Step(m.Params, m.Grads, lr)
	}
	b.StopTimer()
	cpu := rusage.CPU() - cpu0
	if l, _ := m.ForwardBackward(x, y); math.IsNaN(l) || math.IsInf(l, 0) {
		b.Fatalf("loss %v after %d steps", l, b.N)
	}
	batch := len(y) / m.targets
	perStep := b.Elapsed().Seconds() / float64(b.N)
	var first float64
	if f, ok := m.Layers()[0].(flopser); ok {
		first = f.flops()
	}
	flops := (3*m.FLOPsPerSample() - first) * float64(batch)
	b.ReportMetric(perStep*1e3, "ms/step")
	b.ReportMetric(flops/perStep/1e9, "GFLOP/s")
	b.ReportMetric(float64(batch)/perStep, "samples/s")
	b.ReportMetric(live, "MB-live")
	// CPU time per step: on a shared machine, where the wall clock
	// includes waiting for a core, the steadier measure.
	if cpu > 0 {
		b.ReportMetric(cpu.Seconds()/float64(b.N)*1e3, "cpu-ms/step")
	}
	runtime.KeepAlive(opt)
}
