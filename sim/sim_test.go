package sim

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/starling-ml/starling/aggregate"
	"github.com/starling-ml/starling/aggregate/rule"
	"github.com/starling-ml/starling/data"
	"github.com/starling-ml/starling/internal/plot"
	"github.com/starling-ml/starling/train"
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

// small returns a quick configuration: 3 peers, a small MLP, MNIST subsets.
func small(strategy string, d time.Duration) Config {
	c := DefaultConfig()
	c.Peers, c.Strategy, c.Duration = 3, strategy, d
	c.TrainLimit, c.TestLimit = 3000, 1000
	c.Worker.Model = "mlp:784-32-10"
	c.Async.LocalSteps = 5
	c.SnapshotEvery = 100 * time.Millisecond
	c.Slow = map[int]float64{0: 2}
	return c
}

// TestRunStrategies runs every built-in strategy briefly on mocknet and
// checks that each peer learns and that the files are written.
func TestRunStrategies(t *testing.T) {
	tr, te := mnist(t)
	for _, name := range Strategies() {
		t.Run(name, func(t *testing.T) {
			cfg := small(name, 2*time.Second)
			cfg.Target = 0.5
			res, err := Run(context.Background(), cfg, tr, te)
			if err != nil {
				t.Fatal(err)
			}
			s := res.Summary
			t.Logf("%s: final %.3f (min %.3f), %d steps, %d merges, τ %.2f, %d exchanges, drops %v, to 0.5 in %.2fs",
				s.Label, s.FinalAccuracy, s.FinalMin, s.Steps, s.Merges, s.MeanTau, s.Exchanges, s.Drops, s.TimeToTarget)
			if s.FinalMin < 0.6 {
				t.Errorf("a peer ended at %.3f", s.FinalMin)
			}
			if len(res.Mean) == 0 || s.TimeToTarget < 0 {
				t.Errorf("no mean curve or target not reached: %d points", len(res.Mean))
			}
			switch name {
			case "fedasync", "fedbuff":
				if s.Merges == 0 {
					t.Error("no contribution merged")
				}
			case "adpsgd", "sgp":
				if s.Exchanges == 0 {
					t.Error("no exchange")
				}
			}
			if s.Drops["nonfinite"]+s.Drops["shape"]+s.Drops["model"] != 0 {
				t.Errorf("honest peers dropped contributions: %v", s.Drops)
			}
			dir := t.TempDir()
			if err := res.WriteFiles(dir); err != nil {
				t.Fatal(err)
			}
			want := []string{"points.csv", "mean.csv", "events.csv", "summary.json", "accuracy_time.png", "accuracy_updates.png"}
			if name == "fedasync" || name == "fedbuff" {
				want = append(want, "staleness.png")
			}
			for _, f := range want {
				if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
					t.Errorf("%s: %v", f, err)
				}
			}
		})
	}
}

// TestRunKilledPeer kills a peer mid-run: the run still ends on time and
// the survivors keep learning after the death.
func TestRunKilledPeer(t *testing.T) {
	tr, te := mnist(t)
	for _, name := range []string{"fedasync", "sgp", "adpsgd", "sync"} {
		t.Run(name, func(t *testing.T) {
			cfg := small(name, 3*time.Second)
			if name == "sync" {
				// The survivors go on once aggregate has detected the
				// death: a stall in the data phase, the vote window and
				// the re-run without p1 take 2–7 stall timeouts (the
				// bound aggregate's failure tests hold it to), so 2 s
				// stalls and 16 s leave room for the worst case. (With
				// 1 s stalls a live peer starved of CPU by the other
				// test binaries of a CI run was once blamed as well,
				// and the round fell below its quorum.)
				cfg.Duration, cfg.StallTimeout = 16*time.Second, 2*time.Second
			}
			cfg.Peers = 4
			cfg.Kill = map[int]time.Duration{1: 500 * time.Millisecond}
			start := time.Now()
			res, err := Run(context.Background(), cfg, tr, te)
			if err != nil {
				t.Fatal(err)
			}
			if el := time.Since(start); el > 30*time.Second {
				t.Errorf("run took %v", el)
			}
			late := map[string]int{}
			for _, p := range res.Points {
				if p.At > time.Second {
					late[p.Peer] = max(late[p.Peer], p.Updates)
				}
			}
			if late["p1"] != 0 {
				t.Errorf("dead peer p1 has snapshots after its death")
			}
			for _, p := range []string{"p0", "p2", "p3"} {
				if late[p] == 0 {
					t.Errorf("%s stopped training after p1 died: %v", p, late)
				}
			}
			if t.Failed() {
				t.Logf("summary: %+v", res.Summary)
				for _, e := range res.Events {
					if e.Kind != "step" {
						t.Logf("event %+v", e)
					}
				}
				last := map[string]train.Point{}
				for _, p := range res.Points {
					last[p.Peer] = p
				}
				t.Logf("last points: %+v", last)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*Config){
		"peers":    func(c *Config) { c.Peers = 0 },
		"strategy": func(c *Config) { c.Strategy = "nope" },
		"rule":     func(c *Config) { c.Strategy, c.Async.BufferRule = "fedbuff", rule.Krum{F: 1, M: 1} },
		"slow":     func(c *Config) { c.Slow = map[int]float64{9: 2} },
		"slow<1":   func(c *Config) { c.Slow = map[int]float64{0: 0.5} },
		"kill":     func(c *Config) { c.Kill = map[int]time.Duration{-1: 0} },
		"duration": func(c *Config) { c.Duration = 0 },
		"target":   func(c *Config) { c.Target = 2 },
		"stop":     func(c *Config) { c.StopAtTarget = true },
		"bw":       func(c *Config) { c.Bandwidth = -1 },
		"worker":   func(c *Config) { c.Worker.Batch = 0 },
		"gossip":   func(c *Config) { c.Gossip.Every = 0 },
		"algo":     func(c *Config) { c.SyncAlgorithm = "allgather" },
	} {
		c := DefaultConfig()
		mut(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestSyncAlgorithm: the sync strategy runs the butterfly unless told
// otherwise. aggregate's auto picks the ring above 64 KiB (4 peers),
// which on the simulated network (a link per pair of peers) took 2.5× the
// time per step of the default MLP, and so made sync look 2.5× slower
// than it is.
func TestSyncAlgorithm(t *testing.T) {
	c := DefaultConfig()
	if got := swarmConfig(&c, "mlp", nil).Aggregate.Algorithm; got != aggregate.Butterfly {
		t.Errorf("default: %v, want butterfly", got)
	}
	c.SyncAlgorithm = "ring"
	if got := swarmConfig(&c, "mlp", nil).Aggregate.Algorithm; got != aggregate.Ring {
		t.Errorf("ring: %v", got)
	}
}

func TestParseSlowKill(t *testing.T) {
	s, err := ParseSlow("0:4, 3:2.5")
	if err != nil || s[0] != 4 || s[3] != 2.5 || len(s) != 2 {
		t.Fatalf("%v %v", s, err)
	}
	for _, bad := range []string{"0", "x:2", "0:y"} {
		if _, err := ParseSlow(bad); !errors.Is(err, ErrConfig) {
			t.Errorf("ParseSlow(%q): %v", bad, err)
		}
	}
	k, err := ParseKill("2:5s,1:300ms")
	if err != nil || k[2] != 5*time.Second || k[1] != 300*time.Millisecond {
		t.Fatalf("%v %v", k, err)
	}
	if _, err := ParseKill("2:soon"); !errors.Is(err, ErrConfig) {
		t.Errorf("ParseKill: %v", err)
	}
}

// TestSwarmSeeded checks that a seed fixes the peers' identities (and so
// the gossip roles and graph).
func TestSwarmSeeded(t *testing.T) {
	ids := func(seed uint64) []string {
		c := DefaultConfig()
		c.Peers, c.Seed = 3, seed
		sw, err := newNetwork(context.Background(), &c, slog.New(slog.DiscardHandler), formation{})
		if err != nil {
			t.Fatal(err)
		}
		defer sw.close()
		var out []string
		for _, p := range sw.peers {
			out = append(out, string(p.ID))
		}
		return out
	}
	a, b, c := ids(7), ids(7), ids(8)
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("seed 7 gave %v then %v", a, b)
		}
		if a[i] == c[i] {
			t.Fatalf("seeds 7 and 8 share peer %d", i)
		}
	}
}

func TestCompare(t *testing.T) {
	mk := func(label string, seed uint64, ttt, acc float64) *Result {
		return &Result{Config: Config{Seed: seed}, Summary: Summary{Label: label, Seed: seed, TimeToTarget: ttt, FinalAccuracy: acc}}
	}
	results := []*Result{mk("sync", 1, 10, 0.975), mk("fedasync const", 1, 4, 0.978), mk("fedasync poly:0.5", 1, -1, 0.95), mk("sync", 2, 20, 0.97), mk("x", 2, 5, 0.97)}
	for i, r := range results {
		// Mean curves with 100·(i+1) steps in all at the end.
		r.Mean = []MeanPoint{{Seconds: 1, Mean: 0.5, Updates: 50}, {Seconds: 2, Mean: 0.6 + 0.01*float64(i), Updates: 100 * (i + 1)}}
	}
	rows := Compare(results, "sync")
	for i, r := range rows {
		if r.AtUpdates != 100 || r.AccAtUpdates != 0.6+0.01*float64(i) {
			t.Errorf("row %d: accuracy %v at %d steps", i, r.AccAtUpdates, r.AtUpdates)
		}
	}
	want := []struct{ ratio, delta float64 }{{1, 0}, {0.4, 0.3}, {0, -2.5}, {1, 0}, {0.25, 0}}
	for i, w := range want {
		if d := rows[i].TimeRatio - w.ratio; d > 1e-9 || d < -1e-9 {
			t.Errorf("row %d ratio %v, want %v", i, rows[i].TimeRatio, w.ratio)
		}
		if d := rows[i].AccuracyDelta - w.delta; d > 1e-9 || d < -1e-9 {
			t.Errorf("row %d delta %v, want %v", i, rows[i].AccuracyDelta, w.delta)
		}
	}
}

func TestBinHistogram(t *testing.T) {
	h, label := binHistogram(map[int]int{0: 1, 3: 2}, 64)
	if len(h) != 2 || h[3] != 2 || label != "τ (versions)" {
		t.Fatalf("%v %q", h, label)
	}
	h, _ = binHistogram(map[int]int{0: 1, 1: 1, 130: 5, 131: 1, 200: 2}, 64)
	// width 200/64+1 = 4
	if h[0] != 2 || h[32] != 6 || h[50] != 2 || len(h) != 3 {
		t.Fatalf("%v", h)
	}
}

func TestMeanCurve(t *testing.T) {
	pts := []train.Point{
		{Peer: "p0", At: 1 * time.Second, Accuracy: 0.5, Updates: 1},
		{Peer: "p1", At: 2 * time.Second, Accuracy: 0.7, Updates: 2},
		{Peer: "p0", At: 3 * time.Second, Accuracy: 0.9, Updates: 5},
	}
	m := meanCurve(pts, 2)
	if len(m) != 2 || m[0].Mean != 0.6 || m[0].Min != 0.5 || m[1].Mean != 0.8 || m[1].Min != 0.7 || m[1].Updates != 7 {
		t.Fatalf("%+v", m)
	}
}

func TestAverageSeries(t *testing.T) {
	s := []plot.Series{
		{Name: "a seed 1", X: []float64{0, 1, 2}, Y: []float64{0.1, 0.5, 0.9}},
		{Name: "b seed 1", X: []float64{0, 2}, Y: []float64{0.2, 0.4}},
		{Name: "a seed 2", X: []float64{0, 1, 3}, Y: []float64{0.3, 0.7, 1.0}},
	}
	out := averageSeries([]string{"a", "b", "a"}, s)
	if len(out) != 2 || out[0].Name != "a" || out[1].Name != "b" {
		t.Fatalf("groups %+v", out)
	}
	a := out[0]
	// a runs to x = 2 (the shorter seed's end); at x = 1.5 both seeds are
	// at their x = 1 values: (0.5 + 0.7) / 2.
	if a.X[0] != 0 || a.X[len(a.X)-1] != 2 {
		t.Fatalf("a spans %v..%v", a.X[0], a.X[len(a.X)-1])
	}
	for i, x := range a.X {
		want := 0.2
		switch {
		case x >= 2:
			want = (0.9 + 0.7) / 2
		case x >= 1:
			want = 0.6
		}
		if math.Abs(a.Y[i]-want) > 1e-12 {
			t.Fatalf("a(%v) = %v, want %v", x, a.Y[i], want)
		}
	}
	if b := out[1]; b.Y[0] != 0.2 || b.Y[len(b.Y)-1] != 0.4 {
		t.Fatalf("b = %v", b.Y)
	}
}

// TestLooseFormation checks that a federation's network goes on when the
// peers have not yet seen each other by the formation deadline, where a
// strict one would fail the run.
func TestLooseFormation(t *testing.T) {
	c := DefaultConfig()
	c.Peers = 3
	sw, err := newNetwork(context.Background(), &c, slog.New(slog.DiscardHandler), formation{loose: true, wait: time.Nanosecond})
	if err != nil {
		t.Fatalf("loose formation failed: %v", err)
	}
	defer sw.close()
	for i, p := range sw.peers {
		if len(p.Group) != c.Peers {
			t.Errorf("peer %d: group of %d, want %d", i, len(p.Group), c.Peers)
		}
	}
}
