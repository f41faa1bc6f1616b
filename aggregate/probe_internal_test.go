package aggregate

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/starling-ml/starling/peerid"
)

// silentProber answers no probe: each waits for its context to end, or,
// with unreachable, fails at once as if there were no connection.
type silentProber struct {
	Transport
	unreachable bool
	probes      atomic.Int64
}

func (s *silentProber) Probe(ctx context.Context, p peerid.ID) error {
	s.probes.Add(1)
	if s.unreachable {
		return fmt.Errorf("%w: no connection", ErrUnreachable)
	}
	<-ctx.Done()
	return ctx.Err()
}

// TestProbeVerdict runs a probe loop on a member that answers nothing and
// sends nothing: it is found unresponsive after 1.5 stall timeouts of
// silence, unless a send of ours to it overlaps every probe (the probe may
// have queued behind our data), or the probes fail at once for want of a
// connection (the transport's disconnect handling speaks for that): then
// no verdict, however long the wait, and the probes go on.
func TestProbeVerdict(t *testing.T) {
	for _, c := range []struct{ sending, unreachable bool }{{false, false}, {true, false}, {false, true}} {
		noVerdict := c.sending || c.unreachable
		synctest.Test(t, func(t *testing.T) {
			const stall = time.Second
			sp := &silentProber{unreachable: c.unreachable}
			cfg := DefaultConfig()
			cfg.StallTimeout = stall
			r, err := NewRunner("a", sp, cfg)
			if err != nil {
				t.Fatal(err)
			}
			g, err := Form(1, []peerid.ID{"a", "b"})
			if err != nil {
				t.Fatal(err)
			}
			a := r.newAttempt(g, make([]float32, 4), make([]float32, 4), 1, false)
			j := g.Rank("b")
			if c.sending {
				a.sends[j].Add(1)
				a.sending[j].Add(1)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*stall)
			defer cancel()
			start := time.Now()
			var at time.Duration
			a.probe(ctx, sp, j, func() { at = time.Since(start) })
			switch {
			case !noVerdict && at != 3*stall/2:
				t.Errorf("silent member found unresponsive after %v, want %v", at, 3*stall/2)
			case noVerdict && at != 0:
				t.Errorf("%+v: the member was blamed after %v", c, at)
			case noVerdict && sp.probes.Load() < 5:
				t.Errorf("%d probes in 10 stall timeouts: probing stopped", sp.probes.Load())
			}
		})
	}
}
