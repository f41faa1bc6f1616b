package peerrun

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/starling-ml/starling/internal/ui"
	"github.com/starling-ml/starling/node"
	"github.com/starling-ml/starling/swarm"
	"github.com/starling-ml/starling/train"
)

// metrics are the training series `peer run` adds to the node's registry
// (served at --metrics-addr next to libp2p's and the tensor protocol's).
type metrics struct {
	round, accuracy, loss, peers prometheus.Gauge
	roundSeconds                 prometheus.Histogram
	staleness                    prometheus.Histogram
	events                       *prometheus.CounterVec
	last                         time.Time
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		round:    prometheus.NewGauge(prometheus.GaugeOpts{Name: "starling_train_round", Help: "Last round (or step) this peer completed."}),
		accuracy: prometheus.NewGauge(prometheus.GaugeOpts{Name: "starling_train_test_accuracy", Help: "Test accuracy of the current model."}),
		loss:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "starling_train_test_loss", Help: "Test loss of the current model."}),
		peers:    prometheus.NewGauge(prometheus.GaugeOpts{Name: "starling_train_peers", Help: "Peers in the last round."}),
		roundSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "starling_train_round_seconds",
			Help: "Time between reported rounds.", Buckets: prometheus.ExponentialBuckets(0.05, 2, 14)}),
		staleness: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "starling_train_staleness",
			Help: "Staleness τ of merged contributions.", Buckets: prometheus.LinearBuckets(0, 1, 17)}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "starling_train_events_total",
			Help: "Strategy events by kind (round, round-failed, merge, drop, …)."}, []string{"kind"}),
		last: time.Now(),
	}
	for _, c := range []prometheus.Collector{m.round, m.accuracy, m.loss, m.peers, m.roundSeconds, m.staleness, m.events} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *metrics) progress(p Progress) {
	m.round.Set(float64(p.Round))
	m.accuracy.Set(p.Accuracy)
	m.loss.Set(p.Loss)
	m.peers.Set(float64(p.Peers))
	now := time.Now()
	m.roundSeconds.Observe(now.Sub(m.last).Seconds())
	m.last = now
}

// recorder forwards to an inner Recorder, counts events and shows them on
// the dashboard (board may be nil).
type recorder struct {
	train.Recorder
	m     *metrics
	board *ui.Board
	self  string
}

func (r recorder) Event(e train.Event) {
	r.m.events.WithLabelValues(e.Kind).Inc()
	if e.Kind == "merge" {
		r.m.staleness.Observe(float64(e.Staleness))
	}
	if r.board != nil {
		switch {
		case e.Kind == "merge":
			r.board.Merge(e.Staleness)
		case e.Kind == "round" || e.Kind == "publish" || e.Kind == "exchange" || e.Kind == "step":
			// routine: shown by the curves, the byte counts and the histogram
		default: // failed rounds, drops, admissions, exclusions
			peer := e.Peer
			if peer == "" {
				peer = r.self
			}
			r.board.Event(peer, e.Kind, e.Detail)
		}
	}
	r.Recorder.Event(e)
}

// liveView is the dashboard's view of the swarm from peer p: its members,
// its connections and the bytes its streams moved.
func liveView(p *swarm.Peer) ui.Live {
	l := ui.Live{Counted: true}
	for _, m := range p.Members() {
		l.Members = append(l.Members, string(m))
	}
	self := string(p.ID())
	for _, q := range p.Node.Peers() {
		l.Links = append(l.Links, ui.Link{From: self, To: q.String()})
	}
	l.BytesSent, l.BytesRecv = streamBytes(p.Node.Registry(), "")
	return l
}

// tensorBytesSent returns the bytes this peer wrote to tensor streams (the
// all-reduce's chunks and published models; not the control plane's
// gossip nor state transfers).
func tensorBytesSent(g prometheus.Gatherer) int64 {
	sent, _ := streamBytes(g, string(node.ProtocolID))
	return sent
}

// streamBytes sums the node's starling_node_stream_bytes_total by
// direction over the streams of protocol proto ("" for all); 0 if the
// registry has none.
func streamBytes(g prometheus.Gatherer, proto string) (sent, recv int64) {
	mfs, err := g.Gather()
	if err != nil {
		return 0, 0
	}
	for _, mf := range mfs {
		if mf.GetName() != "starling_node_stream_bytes_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			dir, pr := "", ""
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "direction":
					dir = l.GetValue()
				case "protocol":
					pr = l.GetValue()
				}
			}
			if proto != "" && pr != proto {
				continue
			}
			switch dir {
			case "sent":
				sent += int64(m.GetCounter().GetValue())
			case "received":
				recv += int64(m.GetCounter().GetValue())
			}
		}
	}
	return sent, recv
}
