// Package trace writes a peer's timeline in the Chrome trace event format
// (chrome://tracing, ui.perfetto.dev): one complete ("X") event per span of
// work — compute, all-reduce, apply, fetch, … — with the round or step it
// belongs to and the peer's ID, and merges several peers' files into one
// view aligned by round.
//
// A Tracer travels in a context (With); code that does traced work calls
// Start(ctx, …) and the returned function when the work ends. Without a
// Tracer in the context Start costs a context lookup and nothing else, so
// instrumented code needs no flag of its own.
package trace

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
)

// Categories group spans into the rows (threads) of a peer's timeline:
// training work on one row and the network on another, so that work that
// overlaps (an all-reduce behind further compute) is shown side by side.
const (
	Train = "train" // compute, apply, evaluate
	Net   = "net"   // all-reduce, exchange, fetch, publish
)

// Event is one Chrome trace event: a complete span ("X"), or metadata
// ("M") that names a process or thread.
type Event struct {
	Name string  `json:"name"`
	Cat  string  `json:"cat,omitempty"`
	Ph   string  `json:"ph"`
	TS   float64 `json:"ts"`            // µs since the Unix epoch
	Dur  float64 `json:"dur,omitempty"` // µs
	PID  int     `json:"pid"`
	TID  int     `json:"tid"`
	Args Args    `json:"args,omitempty"`
}

// Args are an event's arguments: the round (or step) a span belongs to,
// the peer, and the span's own details.
type Args map[string]any

// Round returns the "round" argument and whether it is present.
func (a Args) Round() (int64, bool) {
	switch v := a["round"].(type) {
	case float64: // decoded JSON
		return int64(v), true
	case int64:
		return v, true
	case uint64:
		return int64(v), true
	case int:
		return int64(v), true
	}
	return 0, false
}

// tid is the row of a category; unknown categories share row 3.
func tid(cat string) int {
	switch cat {
	case Train:
		return 1
	case Net:
		return 2
	}
	return 3
}

// Tracer writes the spans of one peer to w as a JSON array, one event per
// line, as they end. The array is closed by Close; a file cut short by a
// crash still loads (the format allows a missing "]"). A Tracer is safe for
// concurrent use; a write error stops the tracing and is returned by Close.
type Tracer struct {
	mu    sync.Mutex
	w     *bufio.Writer
	c     io.Closer
	peer  string
	clock func() time.Time
	n     int
	err   error
}

// New returns a Tracer writing to w for the peer named peer, reading time
// from clock (time.Now when nil). If w is an io.Closer, Close closes it.
func New(w io.Writer, peer string, clock func() time.Time) *Tracer {
	if clock == nil {
		clock = time.Now
	}
	t := &Tracer{w: bufio.NewWriter(w), peer: peer, clock: clock}
	if c, ok := w.(io.Closer); ok {
		t.c = c
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.writeLocked(Event{Name: "process_name", Ph: "M", Args: Args{"name": peer}})
	for _, cat := range []string{Train, Net} {
		t.writeLocked(Event{Name: "thread_name", Ph: "M", TID: tid(cat), Args: Args{"name": cat}})
	}
	return t
}

// Peer is the name the Tracer gives its process.
func (t *Tracer) Peer() string { return t.peer }

// Span records a span of work that began at start and ends now.
func (t *Tracer) Span(cat, name string, round int64, start time.Time, args Args) {
	end := t.clock()
	a := Args{"round": round, "peer": t.peer}
	for k, v := range args {
		a[k] = v
	}
	e := Event{Name: name, Cat: cat, Ph: "X", TS: micros(start), Dur: float64(end.Sub(start).Nanoseconds()) / 1e3, TID: tid(cat), Args: a}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.writeLocked(e)
}

func micros(t time.Time) float64 { return float64(t.UnixNano()) / 1e3 }

func (t *Tracer) writeLocked(e Event) {
	if t.err != nil {
		return
	}
	b, err := json.Marshal(e)
	if err != nil {
		t.err = fmt.Errorf("trace: %w", err)
		return
	}
	sep := ",\n"
	if t.n == 0 {
		sep = "[\n"
	}
	t.n++
	if _, err := t.w.WriteString(sep); err != nil {
		t.err = err
		return
	}
	if _, err := t.w.Write(b); err != nil {
		t.err = err
		return
	}
	// Whole events reach the file as they end, so a killed peer's trace
	// holds everything up to its last span.
	if err := t.w.Flush(); err != nil {
		t.err = err
	}
}

// Close ends the JSON array, flushes and closes the writer.
func (t *Tracer) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	err := t.err
	if err == nil {
		if _, werr := t.w.WriteString("\n]\n"); werr != nil {
			err = werr
		} else {
			err = t.w.Flush()
		}
	}
	t.err = errors.New("trace: closed")
	if t.c != nil {
		err = errors.Join(err, t.c.Close())
	}
	return err
}

type ctxKey struct{}

// With returns ctx carrying t; Start on it and its children records to t.
func With(ctx context.Context, t *Tracer) context.Context {
	return context.WithValue(ctx, ctxKey{}, t)
}

// From returns the Tracer ctx carries, or nil.
func From(ctx context.Context) *Tracer {
	t, _ := ctx.Value(ctxKey{}).(*Tracer)
	return t
}

func nop() {}

// Start begins a span of category cat (Train or Net) for round (or step)
// round; calling the returned function ends it. Without a Tracer in ctx it
// returns a function that does nothing.
func Start(ctx context.Context, cat, name string, round int64) (end func()) {
	return StartArgs(ctx, cat, name, round, nil)
}

// StartArgs is Start with arguments shown with the span (bytes, peers, …).
func StartArgs(ctx context.Context, cat, name string, round int64, args Args) (end func()) {
	t := From(ctx)
	if t == nil {
		return nop
	}
	start := t.clock()
	return func() { t.Span(cat, name, round, start, args) }
}
