package train_test

import (
	"fmt"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/starling-ml/starling/compression"
	"github.com/starling-ml/starling/peerid"
	"github.com/starling-ml/starling/train"
	"github.com/starling-ml/starling/train/traintest"
)

// TestSyncDeMo: three peers train with DeMo over an all-reduce of sparse
// coefficients. They hold the same parameters after every step, learn
// (from 10 % to well above chance).
func TestSyncDeMo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// The race pass (-short) takes fewer steps and asks less.
		n, steps, want := 3, 150, 0.75
		if testing.Short() {
			steps, want = 40, 0.4
		}
		job := newMemJob(5 * time.Second)
		job.acfg.Compress = compression.MustSpec("sparse")
		tr, te := mnist(t)
		workers := make([]*train.Worker, n)
		nets := make([]*traintest.Net, n)
		for k := range n {
			cfg := train.DefaultWorkerConfig()
			cfg.Model, cfg.Optimizer, cfg.LR, cfg.Batch, cfg.DataSeed = syncWorkerModel, "sgd", 0.002, 32, uint64(k+1)
			w, err := train.NewWorker(cfg, tr.Subset(seq(k*2000, 2000)))
			if err != nil {
				t.Fatal(err)
			}
			workers[k] = w
			nets[k] = job.net(t, peerid.ID(fmt.Sprintf("peer%d", k)))
		}
		cfg := train.DefaultSyncConfig()
		cfg.Steps, cfg.Fixed = steps, true
		var err error
		if cfg.DeMo, err = train.ParseSyncStrategy("demo:chunk=16,k=2"); err != nil {
			t.Fatal(err)
		}
		_, acc0 := workers[0].Evaluate(te.Head(1000))
		errs := runMem(t, workers, nets, cfg, 0, func(int, train.StepInfo) bool { return false })
		for k, err := range errs {
			if err != nil {
				t.Fatalf("peer %d: %v", k, err)
			}
			if !slices.Equal(workers[k].Model.Params, workers[0].Model.Params) {
				t.Fatalf("peer %d holds other parameters than peer 0", k)
			}
		}
		_, acc := workers[0].Evaluate(te.Head(1000))
		t.Logf("DeMo, %d peers, %d steps: accuracy %.3f (from %.3f)", n, steps, acc, acc0)
		if acc < want {
			t.Fatalf("accuracy %.3f after %d DeMo steps", acc, steps)
		}
	})
}
