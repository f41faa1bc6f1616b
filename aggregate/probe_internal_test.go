package aggregate

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// silentProber answers no probe: each waits for its context to end.
type silentProber struct {
	Transport
	probes atomic.Int64
}

func (s *silentProber) Probe(ctx context.Context, p PeerID) error {
	s.probes.Add(1)
	<-ctx.Done()
	return ctx.Err()
}

// TestProbeVerdict runs a probe loop on a member that answers nothing and
// sends nothing: it is found unresponsive after 1.5 stall timeouts of
// silence, unless a send of ours to it overlaps every probe (the probe may
// have queued behind our data): then no verdict, however long the wait.
func TestProbeVerdict(t *testing.T) {
	for _, sending := range []bool{false, true} {
		synctest.Test(t, func(t *testing.T) {
			const stall = time.Second
			sp := &silentProber{}
			cfg := DefaultConfig()
			cfg.StallTimeout = stall
			r, err := NewRunner("a", sp, cfg)
			if err != nil {
				t.Fatal(err)
			}
			g, err := Form(1, []PeerID{"a", "b"})
			if err != nil {
				t.Fatal(err)
			}
			a := r.newAttempt(g, make([]float32, 4), make([]float32, 4), 1, false)
			j := g.Rank("b")
			if sending {
				a.sends[j].Add(1)
				a.sending[j].Add(1)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*stall)
			defer cancel()
			start := time.Now()
			var at time.Duration
			a.probe(ctx, sp, j, func() { at = time.Since(start) })
			switch {
			case !sending && at != 3*stall/2:
				t.Errorf("silent member found unresponsive after %v, want %v", at, 3*stall/2)
			case sending && at != 0:
				t.Errorf("a probe overlapping our send blamed the member after %v", at)
			case sending && sp.probes.Load() < 5:
				t.Errorf("%d probes in 10 stall timeouts: probing stopped", sp.probes.Load())
			}
		})
	}
}
