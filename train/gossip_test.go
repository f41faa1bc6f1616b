package train

import (
	"context"
	"errors"
	"math"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/starling-ml/starling/gossip/average"
	"github.com/starling-ml/starling/peerid"
)

func TestGossipConfigValidate(t *testing.T) {
	if err := DefaultGossipConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*GossipConfig){
		"algorithm": func(c *GossipConfig) { c.Algorithm = "ring" },
		"every":     func(c *GossipConfig) { c.Every = 0 },
		"timeout":   func(c *GossipConfig) { c.Timeout = 0 },
		"period":    func(c *GossipConfig) { c.Period = -1 },
		"steps":     func(c *GossipConfig) { c.MaxSteps = -1 },
	} {
		c := DefaultGossipConfig()
		mut(&c)
		if err := c.Validate(); !errors.Is(err, ErrStrategy) {
			t.Errorf("%s: %v, want ErrStrategy", name, err)
		}
	}
}

// sinkNet accepts every push-sum share and never sends one back: a peer
// whose out-neighbours die after taking its shares, or are all faster
// than its in-neighbours.
type sinkNet struct{ self peerid.ID }

func (n sinkNet) Self() peerid.ID { return n.self }

func (n sinkNet) Alive(peerid.ID) bool { return true }

func (n sinkNet) Bind(average.Handler, int) average.Exchanger { return sinkExchanger{} }

type sinkExchanger struct{}

func (sinkExchanger) Push(context.Context, peerid.ID, average.Share) error { return nil }

func (sinkExchanger) Swap(context.Context, peerid.ID, []float32, []float32) error {
	return average.ErrNotDelivered
}

// TestPushSumWeightFloor: a push-sum peer that only gives mass away stops
// pushing once its weight is small, instead of halving it every step until
// X/W underflows (which made a survivor of a killed peer diverge with NaN
// in sim's TestRunKilledPeer/sgp, weight 1.5e-63).
func TestPushSumWeightFloor(t *testing.T) {
	w := testWorker(t, shards(t, 2000, 1)[0], 1)
	cfg := DefaultGossipConfig()
	cfg.Algorithm, cfg.MaxSteps = GossipPushSum, 300
	sum, err := RunGossip(context.Background(), w, sinkNet{"p0"}, []peerid.ID{"p0", "p1"}, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Weight < minPushWeight/2 || sum.Skipped == 0 {
		t.Fatalf("weight %g after %d steps, %d pushes skipped", sum.Weight, sum.Steps, sum.Skipped)
	}
	for i, v := range w.Model.Params {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			t.Fatalf("parameter %d is %v", i, v)
		}
	}
}

// creepingNet is a sinkNet whose other peers report another step count
// at every look, never reaching MaxSteps: an active peer that is alive and
// counting but never done (or lies that it is).
type creepingNet struct {
	sinkNet
	n atomic.Int64
}

func (c *creepingNet) SetSteps(int) {}

func (c *creepingNet) Steps(peerid.ID) (int, bool) {
	return int(c.n.Add(1) % 2), true
}

// TestPassiveServesActivesBounded: a finished passive peer waits for an
// active one that keeps counting without ever finishing only serveMin
// (its own training took no time in the bubble). The exchange timeout is
// long enough that the count's stall (serveStall) does not end the wait
// first.
func TestPassiveServesActivesBounded(t *testing.T) {
	w := testWorker(t, shards(t, 1000, 1)[0], 1)
	synctest.Test(t, func(t *testing.T) {
		cfg := DefaultGossipConfig()
		cfg.MaxSteps, cfg.Timeout = 5, 2*time.Minute
		net := &creepingNet{sinkNet: sinkNet{self: "p1"}}
		sum, err := RunGossip(t.Context(), w, net, []peerid.ID{"a0", "p1"}, cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		if sum.Role != "passive" || sum.ServedS != serveMin.Seconds() {
			t.Fatalf("role %s served %.2fs, want a passive that waits %v", sum.Role, sum.ServedS, serveMin)
		}
	})
}
