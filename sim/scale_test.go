package sim

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/starling-ml/starling/gossip"
	"github.com/starling-ml/starling/internal/rusage"
)

func TestFormQuorum(t *testing.T) {
	for _, c := range []struct {
		n        int
		strategy string
		want     int
	}{
		{1, "adpsgd", 0},
		{4, "fedasync", 3},
		{17, "adpsgd", 16},
		{18, "adpsgd", 16},
		{18, "sgp", 16},
		{256, "adpsgd", 16},
		{256, "fedbuff", 16},
		{1024, "fedasync", 16},
		{256, "sync", 255},
		{256, "ps", 255},
		{256, "local", 0},
		{4, "local", 3},
	} {
		if got := formQuorum(c.n, c.strategy); got != c.want {
			t.Errorf("formQuorum(%d, %s) = %d, want %d", c.n, c.strategy, got, c.want)
		}
	}
}

func TestHeartbeat(t *testing.T) {
	for _, c := range []struct {
		n    int
		want time.Duration
	}{
		{1, 250 * time.Millisecond},
		{16, 256 * time.Millisecond},
		{17, 289 * time.Millisecond},
		{18, 810 * time.Millisecond},
		{256, 163840 * time.Millisecond},
		{1024, 2621440 * time.Millisecond},
	} {
		if got := heartbeat(c.n); got != c.want {
			t.Errorf("heartbeat(%d) = %v, want %v", c.n, got, c.want)
		}
	}
}

func TestDisseminationWait(t *testing.T) {
	for _, c := range []struct{ beat, want time.Duration }{
		{250 * time.Millisecond, 5 * time.Second},
		{time.Second, 20 * time.Second},
		{65 * time.Second, 3 * time.Minute},
	} {
		if got := disseminationWait(c.beat); got != c.want {
			t.Errorf("disseminationWait(%v) = %v, want %v", c.beat, got, c.want)
		}
	}
}

func TestDisseminationSources(t *testing.T) {
	for _, c := range []struct {
		n    int
		want []int
	}{{0, nil}, {1, nil}, {2, []int{0}}, {3, []int{0, 1, 2}}, {256, []int{0, 128, 255}}} {
		if got := disseminationSources(c.n); !slices.Equal(got, c.want) {
			t.Errorf("disseminationSources(%d) = %v, want %v", c.n, got, c.want)
		}
	}
}

func TestConfigRejectsBadScale(t *testing.T) {
	c := DefaultConfig()
	c.Quorum = c.Peers
	if c.Validate() == nil {
		t.Error("a quorum of every peer, self included, passed")
	}
	c = DefaultConfig()
	c.Heartbeat = -time.Second
	if c.Validate() == nil {
		t.Error("a negative heartbeat passed")
	}
}

// TestFormBeyondFullMesh forms a swarm larger than fullMesh (sparsely
// connected) with a quorum below its size, and checks that a heartbeat
// then reaches every peer, each within the deadline.
func TestFormBeyondFullMesh(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Peers, cfg.Strategy, cfg.Worker.Model = 18, "adpsgd", "logreg"
	// Formation does not wait a period (peers beat once connected), and
	// a long one keeps the periodic beats from loading a busy machine.
	cfg.Heartbeat = 10 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	sw, err := newNetwork(ctx, &cfg, slog.New(slog.DiscardHandler), formation{})
	if err != nil {
		t.Fatal(err)
	}
	defer sw.close()
	if sw.quorum != fullMesh {
		t.Errorf("quorum %d, want %d", sw.quorum, fullMesh)
	}
	for i, p := range sw.peers {
		if got := len(p.Swarm.Control.Peers()); got < sw.quorum {
			t.Errorf("peer %d sees %d peers, below the quorum %d", i, got, sw.quorum)
		}
	}
	took, reached := sw.dissemination(ctx, slog.New(slog.DiscardHandler))
	t.Logf("formed in %v; a heartbeat reached %d peers in %v", time.Since(start), reached, took)
	if reached != cfg.Peers-1 {
		t.Errorf("a heartbeat reached %d of %d peers", reached, cfg.Peers-1)
	}
	if took <= 0 || took >= disseminationWait(sw.beat) {
		t.Errorf("dissemination took %v, want in (0, %v)", took, disseminationWait(sw.beat))
	}
}

// TestScaleControlPlane: STARLING_SCALE=N peers (e.g. 128) form a swarm
// with heartbeats every STARLING_SCALE_BEAT (default: heartbeat(N)) and
// idle for 5 periods; it prints the process's CPU time per delivered
// heartbeat and per period. Long: only with the variable set; run it with
// -cpuprofile to see where the control plane's time goes.
func TestScaleControlPlane(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("STARLING_SCALE"))
	if n == 0 {
		t.Skip("set STARLING_SCALE=128 to run")
	}
	cfg := DefaultConfig()
	cfg.Peers, cfg.Strategy, cfg.Worker.Model = n, "adpsgd", "logreg"
	cfg.Heartbeat, _ = time.ParseDuration(os.Getenv("STARLING_SCALE_BEAT"))
	start := time.Now()
	sw, err := newNetwork(context.Background(), &cfg, slog.New(slog.DiscardHandler), formation{})
	if err != nil {
		t.Fatal(err)
	}
	defer sw.close()
	formed := time.Since(start)
	took, reached := sw.dissemination(context.Background(), slog.New(slog.DiscardHandler))
	delivered := func() (hb, throttled, undelivered, replays uint64) {
		for _, p := range sw.peers {
			s := p.Swarm.Control.Stats()
			hb += s.Heartbeats
			replays += s.Drop(gossip.DropReplay)
			throttled += s.Drop(gossip.DropThrottled)
			undelivered += s.Drop(gossip.DropUndelivered) + s.Drop(gossip.DropSendQueue)
		}
		return
	}
	hb0, _, _, rp0 := delivered()
	fmt.Printf("formed in %v: %d heartbeats delivered, %d duplicates validated\n", formed, hb0, rp0)
	cpu0 := rusage.CPU()
	time.Sleep(5 * sw.beat)
	cpu := rusage.CPU() - cpu0
	hb1, thr, und, rp1 := delivered()
	views := 0
	for _, p := range sw.peers {
		views += len(p.Swarm.Control.Peers())
	}
	fmt.Printf("%d peers, heartbeat %v: formed (quorum %d) in %v; dissemination %v (%.2f periods, %d reached); "+
		"idle 5 periods: CPU %v (%.2f cores), %d heartbeats delivered of %d, %.0f µs CPU each; mean view %.1f; %d duplicates validated; throttled %d, lost %d; max RSS %.0f MiB\n",
		n, sw.beat, sw.quorum, formed.Round(time.Millisecond), took, took.Seconds()/sw.beat.Seconds(), reached,
		cpu.Round(time.Millisecond), cpu.Seconds()/(5*sw.beat.Seconds()), hb1-hb0, 5*n*(n-1),
		float64(cpu.Microseconds())/float64(max(hb1-hb0, 1)), float64(views)/float64(n), rp1-rp0, thr, und, float64(rusage.PeakRSS())/(1<<20))
}

// TestSwarmConfigLongHeartbeat: a heartbeat period whose TTL outlasts
// the control plane's default replay retention still configures.
func TestSwarmConfigLongHeartbeat(t *testing.T) {
	for _, beat := range []time.Duration{0, 65 * time.Second, 4 * time.Minute, 20 * time.Minute} {
		cfg := DefaultConfig()
		cfg.Peers, cfg.Heartbeat = 256, beat
		sc := swarmConfig(&cfg, "m", slog.New(slog.DiscardHandler))
		if err := sc.Gossip.Validate(); err != nil {
			t.Errorf("heartbeat %v: %v", beat, err)
		}
	}
}
