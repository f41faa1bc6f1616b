// Package ui serves a live dashboard of a training run: per-peer accuracy
// and loss curves, the swarm's members and links, bytes sent and
// received, the staleness histogram, round times and the peers left out
// of rounds. A Board collects what the run reports; its Handler serves one
// page (embedded, no external assets) that polls /api/state.
package ui

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sort"
	"sync"
	"time"
)

//go:embed index.html
var assets embed.FS

// Point is one evaluation of one peer.
type Point struct {
	Round    int     `json:"round"`
	Seconds  float64 `json:"seconds"`
	Accuracy float64 `json:"accuracy"`
	Loss     float64 `json:"loss"`
	Peers    int     `json:"peers"`
}

// Event is something the dashboard lists: a peer left out of a round, a
// dropped contribution, a note of a round.
type Event struct {
	Seconds float64 `json:"seconds"`
	Peer    string  `json:"peer"`
	Kind    string  `json:"kind"`
	Detail  string  `json:"detail,omitempty"`
}

// Link is a connection between two peers.
type Link struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// Live is what the run knows now about the swarm, read on every request.
type Live struct {
	Members   []string `json:"members"`
	Links     []Link   `json:"links"`
	BytesSent int64    `json:"bytes_sent"`
	BytesRecv int64    `json:"bytes_recv"`
	// Counted says the byte counts are known (a peer's own streams); the
	// demo, which only reads its peers' progress, has none.
	Counted bool `json:"counted"`
}

// State is the JSON of /api/state.
type State struct {
	Title     string             `json:"title"`
	Seconds   float64            `json:"seconds"`
	Round     int                `json:"round"`
	Rounds    int                `json:"rounds"`
	Metric    string             `json:"metric"` // "accuracy" or "bits/char"
	Curves    map[string][]Point `json:"curves"`
	Live      Live               `json:"live"`
	Staleness []int              `json:"staleness"`  // merges by τ; the last bin is τ ≥ len−1
	RoundSecs []float64          `json:"round_secs"` // time between a peer's reported rounds, the last 200
	Events    []Event            `json:"events"`     // the last maxEvents
	Updates   int                `json:"updates"`    // reports so far: changes while the run is live
	Done      bool               `json:"done"`
}

const (
	maxEvents    = 200
	maxRoundSecs = 200
	maxPoints    = 2000
	staleBins    = 17
)

// Board collects a run's reports. It is safe for concurrent use.
type Board struct {
	mu        sync.Mutex
	clock     func() time.Time
	start     time.Time
	st        State
	lastAt    map[string]float64
	live      func() Live
	pointSeen map[string]int
}

// New returns an empty Board titled title; live (nil for none) is asked
// for the swarm's members, links and bytes on every request, and clock
// (time.Now when nil) times the reports.
func New(title string, rounds int, live func() Live, clock func() time.Time) *Board {
	if clock == nil {
		clock = time.Now
	}
	return &Board{clock: clock, start: clock(), live: live, lastAt: map[string]float64{}, pointSeen: map[string]int{},
		st: State{Title: title, Rounds: rounds, Metric: "accuracy", Curves: map[string][]Point{}, Staleness: make([]int, staleBins)}}
}

// SetMetric names what a Point's Accuracy… is shown as: "accuracy" for
// classifiers, "bits/char" for language models (then Loss is plotted in
// bits).
func (b *Board) SetMetric(m string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.st.Metric = m
}

// SetRounds sets the rounds the run is to take (0: unknown).
func (b *Board) SetRounds(n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.st.Rounds = n
}

func (b *Board) since() float64 { return b.clock().Sub(b.start).Seconds() }

// Point records peer's evaluation after a round (or step).
func (b *Board) Point(peer string, p Point) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.since()
	if p.Seconds == 0 {
		p.Seconds = now
	}
	c := b.st.Curves[peer]
	if len(c) >= maxPoints {
		c = append(c[:0:0], c[len(c)/2:]...)
	}
	b.st.Curves[peer] = append(c, p)
	if last, ok := b.lastAt[peer]; ok && p.Round > b.pointSeen[peer] {
		b.st.RoundSecs = appendBounded(b.st.RoundSecs, (p.Seconds-last)/float64(p.Round-b.pointSeen[peer]), maxRoundSecs)
	}
	b.lastAt[peer], b.pointSeen[peer] = p.Seconds, p.Round
	b.st.Round = max(b.st.Round, p.Round)
	b.st.Updates++
}

// Event records an event; a merge with staleness tau ≥ 0 also counts in
// the staleness histogram.
func (b *Board) Event(peer, kind, detail string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.st.Events = appendBounded(b.st.Events, Event{Seconds: b.since(), Peer: peer, Kind: kind, Detail: detail}, maxEvents)
	b.st.Updates++
}

// Merge counts a merged contribution of staleness tau.
func (b *Board) Merge(tau int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.st.Staleness[min(max(tau, 0), staleBins-1)]++
	b.st.Updates++
}

// Done marks the run finished.
func (b *Board) Done() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.st.Done = true
	b.st.Updates++
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func appendBounded[T any](s []T, x T, n int) []T {
	if len(s) >= n {
		s = append(s[:0:0], s[len(s)-n+1:]...)
	}
	return append(s, x)
}

// Snapshot returns the board's state now (a copy).
func (b *Board) Snapshot() State {
	var live Live
	if b.live != nil {
		live = b.live()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	st := b.st
	st.Seconds = b.since()
	st.Curves = make(map[string][]Point, len(b.st.Curves))
	for k, v := range b.st.Curves {
		st.Curves[k] = append([]Point(nil), v...)
	}
	st.Staleness = append([]int(nil), b.st.Staleness...)
	st.RoundSecs = append([]float64(nil), b.st.RoundSecs...)
	st.Events = append([]Event(nil), b.st.Events...)
	if live.Members == nil {
		for p := range b.st.Curves {
			live.Members = append(live.Members, p)
		}
	}
	sort.Strings(live.Members)
	// Empty lists, not null, for the page.
	live.Members = nonNil(live.Members)
	live.Links = nonNil(live.Links)
	st.RoundSecs = nonNil(st.RoundSecs)
	st.Events = nonNil(st.Events)
	st.Live = live
	return st
}

// Handler serves the page at / and the state at /api/state.
func (b *Board) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		page, _ := assets.ReadFile("index.html")
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		w.Write(page)
	})
	mux.HandleFunc("GET /api/state", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		json.NewEncoder(w).Encode(b.Snapshot())
	})
	return mux
}

// Serve serves b's Handler on addr until ctx ends and returns the page's
// URL. An address in use is an error that names it.
func Serve(ctx context.Context, addr string, b *Board) (string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("dashboard: %w", err)
	}
	srv := &http.Server{Handler: b.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			_ = err // the listener closed under us: nothing to serve any more
		}
	}()
	context.AfterFunc(ctx, func() {
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	})
	host, port, _ := net.SplitHostPort(ln.Addr().String())
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + "/", nil
}
