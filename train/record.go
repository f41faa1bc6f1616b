package train

import (
	"encoding/csv"
	"fmt"
	"io"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/starling-ml/starling/data"
	"github.com/starling-ml/starling/nn"
)

// Recorder collects what strategies report as they run. Strategies call it
// at safe points (between steps) from their own goroutine; implementations
// must be safe for concurrent use and must not block for long.
type Recorder interface {
	// Snapshot records a copy of a peer's parameters at a point of the run,
	// to be evaluated later, off the clock. updates counts the model
	// updates the peer has applied (local steps, merges or rounds).
	Snapshot(peer string, at time.Duration, updates int, params []float32)
	// Event records one contribution, merge or round.
	Event(e Event)
}

// Event is one thing that happened to a peer's model.
type Event struct {
	Peer      string
	At        time.Duration // since the run started
	Kind      string        // "step", "merge", "round", "drop", …
	Loss      float64       // training loss, if known
	Staleness int           // τ of a merged contribution
	Weight    float64       // weight given to it
	Bytes     int64         // bytes sent for it
	Detail    string        // e.g. why a round failed
}

// Point is an evaluated snapshot.
type Point struct {
	Peer     string
	At       time.Duration
	Updates  int
	Loss     float64
	Accuracy float64
}

type snapshot struct {
	peer    string
	at      time.Duration
	updates int
	params  []float32
}

// MemRecorder keeps snapshots and events in memory and evaluates the
// snapshots after the run. It may keep at most every MinGap of a peer's
// snapshots to bound memory.
type MemRecorder struct {
	// MinGap drops a peer's snapshot taken sooner than MinGap after its
	// previous one (0 keeps all).
	MinGap time.Duration

	mu     sync.Mutex
	snaps  []snapshot
	last   map[string]time.Duration
	events []Event
}

var _ Recorder = (*MemRecorder)(nil)

// Snapshot implements Recorder.
func (r *MemRecorder) Snapshot(peer string, at time.Duration, updates int, params []float32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last == nil {
		r.last = map[string]time.Duration{}
	}
	if prev, ok := r.last[peer]; ok && r.MinGap > 0 && at-prev < r.MinGap {
		return
	}
	r.last[peer] = at
	r.snaps = append(r.snaps, snapshot{peer, at, updates, append([]float32(nil), params...)})
}

// Event implements Recorder.
func (r *MemRecorder) Event(e Event) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

// Events returns the recorded events in order of time.
func (r *MemRecorder) Events() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := append([]Event(nil), r.events...)
	sort.SliceStable(out, func(a, b int) bool { return out[a].At < out[b].At })
	return out
}

// Evaluate evaluates every snapshot with a model of the given architecture
// on test and returns the points in order of time.
func (r *MemRecorder) Evaluate(arch string, test *data.Set) ([]Point, error) {
	m, err := nn.New(arch, 0)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	snaps := append([]snapshot(nil), r.snaps...)
	r.mu.Unlock()
	sort.SliceStable(snaps, func(a, b int) bool { return snaps[a].at < snaps[b].at })
	pts := make([]Point, 0, len(snaps))
	for _, s := range snaps {
		if len(s.params) != len(m.Params) {
			return nil, fmt.Errorf("train: snapshot of %s has %d parameters, %s has %d", s.peer, len(s.params), arch, len(m.Params))
		}
		copy(m.Params, s.params)
		loss, acc := m.Evaluate(test.X, test.Y, 1000)
		pts = append(pts, Point{Peer: s.peer, At: s.at, Updates: s.updates, Loss: loss, Accuracy: acc})
	}
	return pts, nil
}

// TimeToAccuracy returns the earliest time at which a point of the given
// peer (any peer when peer is "") reached target, and whether one did.
func TimeToAccuracy(pts []Point, peer string, target float64) (time.Duration, bool) {
	for _, p := range pts {
		if (peer == "" || p.Peer == peer) && p.Accuracy >= target {
			return p.At, true
		}
	}
	return 0, false
}

// WritePointsCSV writes points as CSV with a header row.
func WritePointsCSV(w io.Writer, pts []Point) error {
	cw := csv.NewWriter(w)
	cw.Write([]string{"peer", "seconds", "updates", "test_loss", "test_accuracy"})
	for _, p := range pts {
		cw.Write([]string{p.Peer, strconv.FormatFloat(p.At.Seconds(), 'f', 3, 64), strconv.Itoa(p.Updates),
			strconv.FormatFloat(p.Loss, 'g', 6, 64), strconv.FormatFloat(p.Accuracy, 'f', 4, 64)})
	}
	cw.Flush()
	return cw.Error()
}
