package trace

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
)

// ErrFormat reports a file that is not a trace Start's Tracer wrote (or
// another Chrome trace in the JSON array format).
var ErrFormat = errors.New("not a Chrome trace")

// Read decodes a trace in the JSON array format, also one cut short by a
// crash (no closing "]", a trailing comma, a half-written last line).
func Read(r io.Reader) ([]Event, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '{' { // the object format: {"traceEvents": […]}
		var obj struct {
			TraceEvents []Event `json:"traceEvents"`
		}
		if err := json.Unmarshal(b, &obj); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrFormat, err)
		}
		return obj.TraceEvents, nil
	}
	if len(b) == 0 || b[0] != '[' {
		return nil, fmt.Errorf("%w: it does not start with '[' or '{'", ErrFormat)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if _, err := dec.Token(); err != nil { // '['
		return nil, fmt.Errorf("%w: %v", ErrFormat, err)
	}
	var out []Event
	for dec.More() {
		var e Event
		if err := dec.Decode(&e); err != nil {
			if len(out) > 0 && errors.Is(err, io.ErrUnexpectedEOF) {
				break // the last event of a killed peer's file
			}
			return nil, fmt.Errorf("%w: event %d: %v", ErrFormat, len(out)+1, err)
		}
		out = append(out, e)
	}
	return out, nil
}

// roundEnds maps each round of a peer's spans to when its network work
// ended (the last Net span of the round, which all of the round's peers
// finish together); rounds without Net spans use their last span.
func roundEnds(evs []Event) map[int64]float64 {
	net, any := map[int64]float64{}, map[int64]float64{}
	for _, e := range evs {
		if e.Ph != "X" {
			continue
		}
		r, ok := e.Args.Round()
		if !ok {
			continue
		}
		end := e.TS + e.Dur
		if e.Cat == Net {
			net[r] = math.Max(net[r], end)
		}
		any[r] = math.Max(any[r], end)
	}
	for r, t := range any {
		if _, ok := net[r]; !ok {
			net[r] = t
		}
	}
	return net
}

// Offset returns what to add to the timestamps of evs to align them with
// ref by round: the median, over the rounds both have, of the difference
// between their rounds' ends. With no round in common it returns 0 (the
// files' clocks are taken as they are, right for peers on one machine).
func Offset(ref, evs []Event) float64 {
	a, b := roundEnds(ref), roundEnds(evs)
	var d []float64
	for r, t := range b {
		if u, ok := a[r]; ok {
			d = append(d, u-t)
		}
	}
	if len(d) == 0 {
		return 0
	}
	sort.Float64s(d)
	if len(d)%2 == 1 {
		return d[len(d)/2]
	}
	return (d[len(d)/2-1] + d[len(d)/2]) / 2
}

// Merge puts several peers' traces into one: peer i becomes process i+1,
// named by its file's process_name (or names[i] when it has none), its
// timestamps shifted to align its rounds with the first trace's (Offset),
// and the whole timeline starting at 0. Metadata comes first, spans in
// order of time.
func Merge(traces [][]Event, names []string) []Event {
	var meta, spans []Event
	lo := math.Inf(1)
	for i, evs := range traces {
		off := 0.0
		if i > 0 {
			off = Offset(traces[0], evs)
		}
		pid := i + 1
		named := false
		for _, e := range evs {
			e.PID = pid
			if e.Ph == "M" {
				named = named || e.Name == "process_name"
				meta = append(meta, e)
				continue
			}
			e.TS += off
			lo = math.Min(lo, e.TS)
			spans = append(spans, e)
		}
		if !named {
			name := fmt.Sprintf("peer %d", pid)
			if i < len(names) && names[i] != "" {
				name = names[i]
			}
			meta = append(meta, Event{Name: "process_name", Ph: "M", PID: pid, Args: Args{"name": name}})
		}
	}
	for i := range spans {
		spans[i].TS -= lo
	}
	sort.SliceStable(spans, func(i, j int) bool { return spans[i].TS < spans[j].TS })
	return append(meta, spans...)
}

// Write writes events as a JSON array, one event per line.
func Write(w io.Writer, evs []Event) error {
	if _, err := io.WriteString(w, "["); err != nil {
		return err
	}
	for i, e := range evs {
		b, err := json.Marshal(e)
		if err != nil {
			return err
		}
		sep := ",\n"
		if i == 0 {
			sep = "\n"
		}
		if _, err := io.WriteString(w, sep); err != nil {
			return err
		}
		if _, err := w.Write(b); err != nil {
			return err
		}
	}
	_, err := io.WriteString(w, "\n]\n")
	return err
}
