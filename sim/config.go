package sim

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/starling-ml/starling/aggregate"
	"github.com/starling-ml/starling/compression"
	"github.com/starling-ml/starling/train"
)

// ErrConfig reports an unusable experiment configuration.
var ErrConfig = errors.New("sim: bad config")

// Config describes one experiment: the swarm, its network, the strategy
// and when to stop.
type Config struct {
	// Peers is the number of peers.
	Peers int `json:"peers"`
	// Strategy names a registered strategy (Strategies lists them).
	Strategy string `json:"strategy"`
	// Slow maps a peer index to its slowdown factor (Worker.Slowdown): 4
	// makes peer 0 four times slower with {0: 4}.
	Slow map[int]float64 `json:"slow,omitempty"`
	// Delay delays every message (an async contribution, a gossip
	// exchange, an all-reduce chunk) by a uniform random time in
	// [0, Delay].
	Delay time.Duration `json:"delay_ns,omitempty"`
	// Bandwidth is each link's bandwidth in bytes/s (0: unlimited).
	// 125e6 is 1 Gbit/s.
	Bandwidth float64 `json:"bandwidth_bps"`
	// Latency is each link's one-way latency. 500 µs is a LAN.
	Latency time.Duration `json:"latency_ns"`
	// Seed seeds everything random.
	Seed uint64 `json:"seed"`
	// Duration is the training phase's wall-clock budget.
	Duration time.Duration `json:"duration_ns"`
	// Target is the test accuracy whose time and updates to reach are
	// reported (0: none).
	Target float64 `json:"target,omitempty"`
	// StopAtTarget ends the run once the monitor sees the mean test
	// accuracy over peers reach Target.
	StopAtTarget bool `json:"stop_at_target,omitempty"`
	// MonitorEvery is the monitor's period (with StopAtTarget).
	MonitorEvery time.Duration `json:"monitor_every_ns,omitempty"`
	// Partition splits the training set: iid, shards or dirichlet:α.
	Partition string `json:"partition"`
	// TrainLimit and TestLimit keep the first N samples (0: all).
	TrainLimit int `json:"train_limit,omitempty"`
	TestLimit  int `json:"test_limit,omitempty"`
	// SnapshotEvery is how often each peer's parameters are recorded for
	// evaluation.
	SnapshotEvery time.Duration `json:"snapshot_every_ns"`
	// Kill maps a peer index to the time it dies (its training stops and
	// its node and host close).
	Kill map[int]time.Duration `json:"kill_ns,omitempty"`
	// StallTimeout is how long the all-reduce waits for a silent peer
	// before it goes on without it (aggregate.Config.StallTimeout).
	StallTimeout time.Duration `json:"stall_timeout_ns,omitempty"`
	// SyncAlgorithm is the sync strategy's all-reduce algorithm
	// (aggregate.ParseAlgorithm). "butterfly" by default, not aggregate's
	// auto (the ring above 64 KiB with 4 peers): every pair of simulated
	// peers has a link of its own, where the butterfly's two hops, on all
	// links at once, beat the ring's 2(n−1) on one link each (2.5× the
	// steps with 4 peers and the default MLP); on a switched LAN, where
	// each host's one link is the limit, the ring is as fast from 1 MB up.
	SyncAlgorithm string `json:"sync_algorithm"`
	// Compress is the codec of what peers send: the sync strategy's
	// all-reduce and the vectors fedasync and fedbuff publish; the zero
	// Spec keeps Async.Codec and float32 all-reduces.
	Compress compression.Spec `json:"compress,omitzero"`
	// Heartbeat is the control plane's heartbeat period (0: heartbeat of
	// the swarm's size).
	Heartbeat time.Duration `json:"heartbeat_ns,omitempty"`
	// Quorum is how many other peers each peer must see before training
	// starts (0: formQuorum of the swarm's size and strategy).
	Quorum int `json:"quorum,omitempty"`
	// Worker, Async, Gossip and PS configure the peers and the
	// strategies. The ps strategy takes its model id from the
	// architecture, its learning rate from Worker.LR when PS.LR is 0, its
	// codec from Compress and its call timeout from StallTimeout.
	Worker train.WorkerConfig `json:"worker"`
	Async  train.AsyncConfig  `json:"async"`
	Gossip train.GossipConfig `json:"gossip"`
	PS     train.PSConfig     `json:"ps"`
}

// DefaultConfig returns 4 IID peers on a 1 Gbit/s, 500 µs LAN training
// FedAvg's MLP on MNIST with FedAsync for 30 s.
func DefaultConfig() Config {
	w := train.DefaultWorkerConfig()
	a := train.DefaultAsyncConfig()
	g := train.DefaultGossipConfig()
	return Config{
		Peers: 4, Strategy: "fedasync", Bandwidth: 125e6, Latency: 500 * time.Microsecond, Seed: 1,
		Duration: 30 * time.Second, MonitorEvery: time.Second, Partition: "iid",
		SnapshotEvery: 250 * time.Millisecond, SyncAlgorithm: "butterfly", StallTimeout: aggregate.DefaultConfig().StallTimeout,
		Worker: w, Async: a, Gossip: g, PS: train.DefaultPSConfig(),
	}
}

// Validate reports settings that cannot work. It does not modify c.
func (c Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrConfig}, args...)...)
	}
	switch {
	case c.Peers < 1 || c.Peers > 1024:
		return bad("peers %d not in 1..1024", c.Peers)
	case !slices.Contains(Strategies(), c.Strategy):
		return bad("strategy %q, have %s", c.Strategy, strings.Join(Strategies(), ", "))
	case c.Delay < 0 || c.Latency < 0 || c.Bandwidth < 0 || math.IsNaN(c.Bandwidth) || math.IsInf(c.Bandwidth, 0):
		return bad("delay, latency and bandwidth must be ≥ 0")
	case c.Duration <= 0:
		return bad("duration %v must be > 0", c.Duration)
	case c.Target < 0 || c.Target > 1:
		return bad("target %v not in [0, 1]", c.Target)
	case c.StopAtTarget && (c.Target == 0 || c.MonitorEvery <= 0):
		return bad("stopping at the target needs a target and a monitor period")
	case c.SnapshotEvery <= 0:
		return bad("snapshot interval %v must be > 0", c.SnapshotEvery)
	case c.TrainLimit < 0 || c.TestLimit < 0:
		return bad("limits must be ≥ 0")
	case c.StallTimeout <= 0:
		return bad("stall timeout %v must be > 0", c.StallTimeout)
	case c.Heartbeat < 0:
		return bad("heartbeat %v must be ≥ 0", c.Heartbeat)
	case c.Quorum < 0 || c.Quorum > c.Peers-1:
		return bad("quorum %d not in 0..%d (the other peers)", c.Quorum, c.Peers-1)
	}
	if _, err := aggregate.ParseAlgorithm(c.SyncAlgorithm); err != nil {
		return bad("sync algorithm: %v", err)
	}
	for i, f := range c.Slow {
		if i < 0 || i >= c.Peers || !(f >= 1) || math.IsInf(f, 0) {
			return bad("slow peer %d factor %v: need a peer index below %d and a finite factor ≥ 1", i, f, c.Peers)
		}
	}
	for i, t := range c.Kill {
		if i < 0 || i >= c.Peers || t < 0 {
			return bad("kill peer %d at %v", i, t)
		}
	}
	if err := c.Worker.Validate(); err != nil {
		return err
	}
	a := c.Async
	if !c.Compress.IsZero() {
		a.Codec = c.Compress
	}
	if err := a.Validate(); err != nil {
		return err
	}
	return c.Gossip.Validate()
}

// ParseSlow parses "0:4,3:2" (peer index: slowdown factor) into a map.
func ParseSlow(s string) (map[int]float64, error) {
	out := map[int]float64{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	for _, part := range strings.Split(s, ",") {
		i, f, ok := strings.Cut(strings.TrimSpace(part), ":")
		if !ok {
			return nil, fmt.Errorf("%w: slow peer %q: want INDEX:FACTOR", ErrConfig, part)
		}
		idx, err := strconv.Atoi(i)
		if err != nil {
			return nil, fmt.Errorf("%w: slow peer %q: %v", ErrConfig, part, err)
		}
		fac, err := strconv.ParseFloat(f, 64)
		if err != nil {
			return nil, fmt.Errorf("%w: slow peer %q: %v", ErrConfig, part, err)
		}
		out[idx] = fac
	}
	return out, nil
}

// ParseKill parses "2:5s,3:10s" (peer index: time of death) into a map.
func ParseKill(s string) (map[int]time.Duration, error) {
	out := map[int]time.Duration{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	for _, part := range strings.Split(s, ",") {
		i, d, ok := strings.Cut(strings.TrimSpace(part), ":")
		if !ok {
			return nil, fmt.Errorf("%w: kill %q: want INDEX:DURATION", ErrConfig, part)
		}
		idx, err := strconv.Atoi(i)
		if err != nil {
			return nil, fmt.Errorf("%w: kill %q: %v", ErrConfig, part, err)
		}
		at, err := time.ParseDuration(d)
		if err != nil {
			return nil, fmt.Errorf("%w: kill %q: %v", ErrConfig, part, err)
		}
		out[idx] = at
	}
	return out, nil
}

// Label names the run: its strategy, and its policy when it has one.
func (c Config) Label() string {
	if c.Strategy == "fedasync" || c.Strategy == "fedbuff" {
		return c.Strategy + " " + c.Async.Policy.String()
	}
	if c.Strategy == "ps" && c.PS.Policy.String() != "const" {
		return c.Strategy + " " + c.PS.Policy.String()
	}
	return c.Strategy
}
