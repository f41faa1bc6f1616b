package sim

import (
	"context"
	"log/slog"
	"time"
)

// Scale is what a run costs and how its control plane performed: the
// figures of large swarms (docs/results, "256 libp2p peers").
type Scale struct {
	// FormS is the wall time from the first host to every peer seeing
	// Quorum others; HeartbeatS the control plane's period.
	FormS      float64 `json:"form_s"`
	HeartbeatS float64 `json:"heartbeat_s"`
	Quorum     int     `json:"quorum"`
	// DisseminationS is the longest time, over a few sources, for one
	// heartbeat to reach every other peer, and DisseminationBeats the
	// same in heartbeat periods; Reached is the fewest peers one reached
	// (all n−1 unless the wait's deadline passed).
	DisseminationS     float64 `json:"dissemination_s"`
	DisseminationBeats float64 `json:"dissemination_heartbeats"`
	Reached            int     `json:"dissemination_reached"`
	// TrainCPUS is the process's CPU time (user + system) during the
	// training phase; MaxRSSMiB its peak resident memory.
	TrainCPUS float64 `json:"train_cpu_s"`
	MaxRSSMiB float64 `json:"max_rss_mib"`
}

// disseminationSources are the peers whose heartbeat dissemination is
// measured: the first, the middle and the last.
func disseminationSources(n int) []int {
	switch {
	case n < 2:
		return nil
	case n < 3:
		return []int{0}
	}
	return []int{0, n / 2, n - 1}
}

// disseminationWait bounds the wait for one heartbeat to reach every
// peer: 20 heartbeat periods, at most 3 minutes (a heartbeat can be lost,
// and the period of a large simulated swarm is minutes).
func disseminationWait(beat time.Duration) time.Duration { return min(20*beat, 3*time.Minute) }

// disseminationPoll is how often the views are read while a heartbeat
// spreads: the resolution of the measurement.
const disseminationPoll = 2 * time.Millisecond

// dissemination publishes one heartbeat from each of a few peers, one
// after the other, and measures how long each takes to reach every other
// peer's view (its Seq there). It returns the longest, and the fewest
// peers one reached: each wait ends after disseminationWait.
func (sw *network) dissemination(ctx context.Context, log *slog.Logger) (time.Duration, int) {
	n := len(sw.peers)
	wait := disseminationWait(sw.beat)
	var worst time.Duration
	fewest := n - 1
	for _, src := range disseminationSources(n) {
		p := sw.peers[src]
		wctx, cancel := context.WithTimeout(ctx, wait)
		start := time.Now()
		seq, err := p.Swarm.Control.BeatSeq(wctx)
		if err != nil {
			cancel()
			log.Warn("sim: dissemination", "peer", src, "err", err)
			return 0, 0
		}
		got := make([]bool, n)
		got[src] = true
		left := n - 1
		t := time.NewTicker(disseminationPoll)
		for left > 0 && wctx.Err() == nil {
			for i, q := range sw.peers {
				if got[i] {
					continue
				}
				if pi, ok := q.Swarm.Control.Peer(p.ID); ok && pi.Seq >= seq {
					got[i] = true
					left--
				}
			}
			if left == 0 {
				break
			}
			select {
			case <-wctx.Done():
			case <-t.C:
			}
		}
		t.Stop()
		cancel()
		worst = max(worst, time.Since(start))
		fewest = min(fewest, n-1-left)
		log.Info("sim: dissemination", "peer", src, "took", time.Since(start), "reached", n-1-left)
	}
	return worst, fewest
}
