package train

import (
	"context"
	"errors"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/starling-ml/starling/data"
)

var (
	mnistOnce             sync.Once
	mnistTrain, mnistTest *data.Set
	mnistErr              error
)

func mnist(t testing.TB) (*data.Set, *data.Set) {
	mnistOnce.Do(func() { mnistTrain, mnistTest, mnistErr = data.LoadMNIST("") })
	if mnistErr != nil {
		t.Fatal(mnistErr)
	}
	return mnistTrain, mnistTest
}

func TestLocalLearnsMNIST(t *testing.T) {
	tr, te := mnist(t)
	cfg := DefaultLocalConfig()
	cfg.Model = "mlp:784-64-10"
	cfg.Epochs = 1
	var last Progress
	_, sum, err := Local(context.Background(), cfg, tr.Head(10000), te.Head(2000), func(p Progress) { last = p })
	if err != nil {
		t.Fatal(err)
	}
	if sum.TestAccuracy < 0.88 {
		t.Fatalf("test accuracy %.3f after one epoch on 10k samples, want ≥ 0.88", sum.TestAccuracy)
	}
	if sum.Steps != 157 || !last.EpochDone || last.Step != 157 {
		t.Fatalf("steps %d, last progress %+v", sum.Steps, last)
	}
}

func TestLocalDivergesWithClearError(t *testing.T) {
	tr, _ := mnist(t)
	cfg := DefaultLocalConfig()
	cfg.Model = "mlp:784-64-10"
	cfg.LR = 1e30
	cfg.Optimizer = "sgd"
	_, _, err := Local(context.Background(), cfg, tr.Head(2000), nil, nil)
	if !errors.Is(err, ErrDiverged) {
		t.Fatalf("err = %v, want ErrDiverged", err)
	}
}

func TestLocalCancel(t *testing.T) {
	tr, _ := mnist(t)
	ctx, cancel := context.WithCancel(context.Background())
	cfg := DefaultLocalConfig()
	n := 0
	_, _, err := Local(ctx, cfg, tr.Head(5000), nil, func(Progress) {
		if n++; n == 3 {
			cancel()
		}
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
}

func TestLocalConfigValidate(t *testing.T) {
	for _, mut := range []func(*LocalConfig){
		func(c *LocalConfig) { c.Epochs = 0 },
		func(c *LocalConfig) { c.Batch = -1 },
		func(c *LocalConfig) { c.LR = 0 },
		func(c *LocalConfig) { c.ClipNorm = -1 },
	} {
		c := DefaultLocalConfig()
		mut(&c)
		if c.Validate() == nil {
			t.Errorf("%+v: want error", c)
		}
	}
	tr, _ := mnist(t)
	c := DefaultLocalConfig()
	c.Model = "vgg"
	if _, _, err := Local(context.Background(), c, tr.Head(100), nil, nil); err == nil {
		t.Fatal("unknown model: want error")
	}
}

// TestSlowdownIgnoresPauses checks that Slowdown multiplies a usual step's
// compute time, but not a pause that stretched one step: a worker 3×
// slower whose process stopped for a second during a 10 ms step must not
// then sleep another 2 s.
func TestSlowdownIgnoresPauses(t *testing.T) {
	w := &Worker{cfg: WorkerConfig{Slowdown: 3}}
	ms := time.Millisecond
	for i := range 50 {
		if got := w.slowWait(10 * ms); got != 20*ms {
			t.Fatalf("step %d of 10 ms: wait %v, want 20ms", i, got)
		}
	}
	if got := w.slowWait(time.Second); got != 2*slowCap*10*ms {
		t.Fatalf("a 1 s step after 10 ms ones: wait %v, want %v (capped)", got, 2*slowCap*10*ms)
	}
	if got := w.slowWait(10 * ms); got != 20*ms {
		t.Fatalf("a 10 ms step after the outlier: wait %v, want 20ms", got)
	}
	// A machine that really becomes 10× slower is followed: the first
	// steps are cut, later ones not.
	if got := w.slowWait(100 * ms); got >= 200*ms {
		t.Fatalf("first 100 ms step: wait %v, want it capped below 200ms", got)
	}
	var got time.Duration
	for range 20 {
		got = w.slowWait(100 * ms)
	}
	if got != 200*ms {
		t.Fatalf("after 20 steps of 100 ms: wait %v, want 200ms", got)
	}
}

// TestLocalStepLoss: each step's Progress carries that step's loss, whose
// mean over equal batches is the epoch's running mean.
func TestLocalStepLoss(t *testing.T) {
	tr, _ := mnist(t)
	cfg := DefaultLocalConfig()
	cfg.Model, cfg.Epochs = "logreg", 1
	var sum float64
	steps := 0
	_, _, err := Local(context.Background(), cfg, tr.Head(640), nil, func(p Progress) {
		if p.EpochDone || p.Evaluated {
			return
		}
		steps++
		sum += p.StepLoss
		if p.StepLoss <= 0 || math.Abs(sum/float64(steps)-p.Loss) > 1e-9 {
			t.Errorf("step %d: step loss %v, running mean %v, mean of step losses %v", p.Step, p.StepLoss, p.Loss, sum/float64(steps))
		}
	})
	if err != nil || steps != 10 {
		t.Fatalf("%d steps: %v", steps, err)
	}
}
