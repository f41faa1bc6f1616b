package device

import (
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func threadCPU() time.Duration {
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// measure returns GFLOP/s by thread CPU time, best of reps, single thread.
func measure(g *gemmImpl, tA, tB bool, m, n, k int) float64 {
	r := rand.New(rand.NewPCG(1, 1))
	a := make([]float32, m*k)
	b := make([]float32, k*n)
	c := make([]float32, m*n)
	for i := range a {
		a[i] = r.Float32()
	}
	for i := range b {
		b[i] = r.Float32()
	}
	lda, ldb := k, n
	if tA {
		lda = m
	}
	if tB {
		ldb = k
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	flops := 2 * float64(m) * float64(n) * float64(k)
	iters := max(1, int(2e8/flops))
	best := 0.0
	for rep := 0; rep < 7; rep++ {
		t0 := threadCPU()
		for i := 0; i < iters; i++ {
			g.serial(tA, tB, m, n, k, 1, a, lda, b, ldb, 0, c, n)
		}
		d := threadCPU() - t0
		best = max(best, flops*float64(iters)/d.Seconds()/1e9)
	}
	return best
}

func measureBE(be Backend, tA, tB bool, m, n, k int) float64 {
	r := rand.New(rand.NewPCG(1, 1))
	a := make([]float32, m*k)
	b := make([]float32, k*n)
	c := make([]float32, m*n)
	for i := range a {
		a[i] = r.Float32()
	}
	for i := range b {
		b[i] = r.Float32()
	}
	lda, ldb := k, n
	if tA {
		lda = m
	}
	if tB {
		ldb = k
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	flops := 2 * float64(m) * float64(n) * float64(k)
	iters := max(1, int(3e8/flops))
	best := 0.0
	for rep := 0; rep < 5; rep++ {
		t0 := threadCPU()
		for i := 0; i < iters; i++ {
			be.Gemm(tA, tB, m, n, k, 1, a, lda, b, ldb, 0, c, n)
		}
		d := threadCPU() - t0
		best = max(best, flops*float64(iters)/d.Seconds()/1e9)
	}
	return best
}

func TestScratchCPU(t *testing.T) {
	if os.Getenv("SCRATCH") == "" {
		t.Skip()
	}
	runtime.GOMAXPROCS(1)
	bes := []Backend{newFast("avx512"), newFast("avx2"), newFast("go"), NewCPU()}
	for _, s := range []struct {
		name    string
		tA, tB  bool
		m, n, k int
	}{
		{"mlp/fc1-fwd", false, true, 256, 128, 784},
		{"mlp/fc1-dW", true, false, 128, 784, 256},
		{"mlp/fc1-dX", false, false, 256, 784, 128},
		{"mlp/fc2-fwd", false, true, 256, 10, 128},
		{"mlp/fc2-dW", true, false, 10, 128, 256},
		{"mlp/fc2-dX", false, false, 256, 128, 10},
		{"cnn/conv1-fwd", false, true, 64 * 28 * 28, 32, 25},
		{"cnn/conv1-dW", true, false, 32, 25, 64 * 28 * 28},
		{"cnn/conv2-fwd", false, true, 64 * 14 * 14, 64, 800},
		{"cnn/conv2-dW", true, false, 64, 800, 64 * 14 * 14},
		{"cnn/conv2-dcol", false, false, 64 * 14 * 14, 800, 64},
		{"cnn/fc1-fwd", false, true, 64, 512, 3136},
		{"cnn/fc1-dW", true, false, 512, 3136, 64},
		{"cnn/fc1-dX", false, false, 64, 3136, 512},
		{"cnn/fc2-fwd", false, true, 64, 10, 512},
		{"cnn/fc2-dW", true, false, 10, 512, 64},
		{"cnn/fc2-dX", false, false, 64, 512, 10},
	} {
		line := fmt.Sprintf("%-16s", s.name)
		for _, be := range bes {
			line += fmt.Sprintf("  %s %6.1f", be.Name(), measureBE(be, s.tA, s.tB, s.m, s.n, s.k))
		}
		fmt.Println(line)
	}
}
