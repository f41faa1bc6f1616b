package node

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/metrics"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/prometheus/client_golang/prometheus"
)

// nodeMetrics are the collectors this package adds to the registry, next to
// libp2p's own (swarm, identify, resource manager, …).
type nodeMetrics struct {
	bw       *bandwidth
	tensors  *prometheus.CounterVec   // direction
	seconds  *prometheus.HistogramVec // direction
	rejected *prometheus.CounterVec   // reason
}

func newNodeMetrics(reg prometheus.Registerer) (*nodeMetrics, error) {
	m := &nodeMetrics{
		bw: newBandwidth(),
		tensors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "starling", Subsystem: "node", Name: "tensors_total",
			Help: "Tensors fully sent or received over /starling/tensor.",
		}, []string{"direction"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "starling", Subsystem: "node", Name: "transfer_seconds",
			Help:    "Time to send a tensor (first byte written to last stripe written) or to receive one (first header read to last byte verified).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 18), // 1 ms .. 131 s
		}, []string{"direction"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "starling", Subsystem: "node", Name: "frames_rejected_total",
			Help: "Tensor frames refused by this node, by reason; a refused or too-large-for-its-Recv tensor is drained, any other reason resets its stream.",
		}, []string{"reason"}),
	}
	for _, c := range []prometheus.Collector{m.bw, m.tensors, m.seconds, m.rejected} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *nodeMetrics) transfer(dir string, start time.Time) {
	m.tensors.WithLabelValues(dir).Inc()
	m.seconds.WithLabelValues(dir).Observe(time.Since(start).Seconds())
}

func (m *nodeMetrics) reject(err error) { m.rejected.WithLabelValues(Reason(err)).Inc() }

// bandwidth is a libp2p metrics.Reporter that counts stream bytes per
// (protocol, peer) and exports them as
// starling_node_stream_bytes_total{direction,protocol,peer}. libp2p calls it
// on every stream read and write, so it takes a read lock and two atomic
// adds on the hot path. Distinct label pairs are capped at maxPairs; past
// that, new peers are counted under peer="other".
type bandwidth struct {
	desc  *prometheus.Desc
	mu    sync.RWMutex
	pairs map[pairKey]*pairCount
	in    atomic.Int64 // connection-level totals (all protocols)
	out   atomic.Int64
}

type pairKey struct {
	proto protocol.ID
	peer  peer.ID
}

type pairCount struct{ in, out atomic.Int64 }

const maxPairs = 4096

// otherPeer stands for the peers past maxPairs.
const otherPeer peer.ID = "other"

var _ metrics.Reporter = (*bandwidth)(nil)

func newBandwidth() *bandwidth {
	return &bandwidth{
		desc: prometheus.NewDesc("starling_node_stream_bytes_total",
			"Bytes read from (received) and written to (sent) libp2p streams, per protocol and peer.",
			[]string{"direction", "protocol", "peer"}, nil),
		pairs: make(map[pairKey]*pairCount),
	}
}

func (b *bandwidth) count(proto protocol.ID, p peer.ID) *pairCount {
	k := pairKey{proto, p}
	b.mu.RLock()
	c := b.pairs[k]
	b.mu.RUnlock()
	if c != nil {
		return c
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if c = b.pairs[k]; c == nil {
		if len(b.pairs) >= maxPairs {
			k.peer = otherPeer
			if c = b.pairs[k]; c != nil {
				return c
			}
		}
		c = new(pairCount)
		b.pairs[k] = c
	}
	return c
}

func (b *bandwidth) LogSentMessage(n int64) { b.out.Add(n) }
func (b *bandwidth) LogRecvMessage(n int64) { b.in.Add(n) }
func (b *bandwidth) LogSentMessageStream(n int64, proto protocol.ID, p peer.ID) {
	b.count(proto, p).out.Add(n)
}
func (b *bandwidth) LogRecvMessageStream(n int64, proto protocol.ID, p peer.ID) {
	b.count(proto, p).in.Add(n)
}

func (b *bandwidth) sum(match func(pairKey) bool) metrics.Stats {
	var s metrics.Stats
	b.mu.RLock()
	defer b.mu.RUnlock()
	for k, c := range b.pairs {
		if match(k) {
			s.TotalIn += c.in.Load()
			s.TotalOut += c.out.Load()
		}
	}
	return s
}

func (b *bandwidth) GetBandwidthForPeer(p peer.ID) metrics.Stats {
	return b.sum(func(k pairKey) bool { return k.peer == p })
}
func (b *bandwidth) GetBandwidthForProtocol(proto protocol.ID) metrics.Stats {
	return b.sum(func(k pairKey) bool { return k.proto == proto })
}
func (b *bandwidth) GetBandwidthTotals() metrics.Stats {
	return metrics.Stats{TotalIn: b.in.Load(), TotalOut: b.out.Load()}
}
func (b *bandwidth) GetBandwidthByPeer() map[peer.ID]metrics.Stats {
	return groupBy(b, func(k pairKey) peer.ID { return k.peer })
}
func (b *bandwidth) GetBandwidthByProtocol() map[protocol.ID]metrics.Stats {
	return groupBy(b, func(k pairKey) protocol.ID { return k.proto })
}

// groupBy sums b's counts by key(pair).
func groupBy[K comparable](b *bandwidth, key func(pairKey) K) map[K]metrics.Stats {
	out := map[K]metrics.Stats{}
	b.mu.RLock()
	defer b.mu.RUnlock()
	for k, c := range b.pairs {
		s := out[key(k)]
		s.TotalIn += c.in.Load()
		s.TotalOut += c.out.Load()
		out[key(k)] = s
	}
	return out
}

// Reset and TrimIdle are no-ops: Prometheus counters only grow.
func (b *bandwidth) Reset()             {}
func (b *bandwidth) TrimIdle(time.Time) {}

func (b *bandwidth) Describe(ch chan<- *prometheus.Desc) { ch <- b.desc }

func (b *bandwidth) Collect(ch chan<- prometheus.Metric) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	for k, c := range b.pairs {
		proto := string(k.proto)
		if proto == "" {
			proto = "unknown"
		}
		p := k.peer.String()
		if k.peer == otherPeer {
			p = "other"
		}
		ch <- prometheus.MustNewConstMetric(b.desc, prometheus.CounterValue, float64(c.in.Load()), "received", proto, p)
		ch <- prometheus.MustNewConstMetric(b.desc, prometheus.CounterValue, float64(c.out.Load()), "sent", proto, p)
	}
}
