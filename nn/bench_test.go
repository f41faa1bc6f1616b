package nn

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkMLPStep times one training step (forward, backward, SGD update)
// of an MLP 784-128-10 at batch 256, the shape ../shared/bench/torch_mlp.py
// times in PyTorch, and reports the GEMM throughput it reaches.
func BenchmarkMLPStep(b *testing.B) {
	benchStep(b, "mlp:784-128-10", 256)
}

// BenchmarkCNNStep times one training step of FedAvg's CNN at batch 64.
func BenchmarkCNNStep(b *testing.B) {
	benchStep(b, "cnn", 64)
}

func benchStep(b *testing.B, arch string, batch int) {
	m, err := New(arch, 1)
	if err != nil {
		b.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	x := randInput(r, batch*m.Input.Size())
	y := make([]int32, batch)
	for i := range y {
		y[i] = int32(r.IntN(10))
	}
	opt := NewSGD(SGDConfig{})
	for i := 0; i < 3; i++ {
		m.ForwardBackward(x, y)
		opt.Step(m.Params, m.Grads, 0.01)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		m.ForwardBackward(x, y)
		opt.Step(m.Params, m.Grads, 0.01)
	}
	b.StopTimer()
	perStep := b.Elapsed().Seconds() / float64(b.N)
	// Forward GEMMs once, backward twice, less the first layer's dx GEMM.
	first := m.Layers()[0].(flopser).flops()
	flops := (3*m.FLOPsPerSample() - first) * float64(batch)
	b.ReportMetric(perStep*1e3, "ms/step")
	b.ReportMetric(flops/perStep/1e9, "GFLOP/s")
	b.ReportMetric(float64(batch)/perStep, "samples/s")
}
