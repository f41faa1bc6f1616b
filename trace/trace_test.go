package trace

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeClock advances by step on every reading.
type fakeClock struct {
	mu   sync.Mutex
	t    time.Time
	step time.Duration
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(c.step)
	return c.t
}

func spansOf(t *testing.T, evs []Event) []Event {
	t.Helper()
	var out []Event
	for _, e := range evs {
		if e.Ph == "X" {
			out = append(out, e)
		}
	}
	return out
}

func TestTracerWritesSpans(t *testing.T) {
	var buf bytes.Buffer
	clk := &fakeClock{t: time.Unix(1000, 0), step: time.Millisecond}
	tr := New(&buf, "peerA", clk.now)
	ctx := With(context.Background(), tr)
	end := Start(ctx, Train, "compute", 3)
	endNet := StartArgs(ctx, Net, "allreduce", 3, Args{"bytes": 4096})
	endNet()
	end()
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	evs, err := Read(&buf)
	if err != nil {
		t.Fatalf("Read: %v\n%s", err, buf.String())
	}
	sp := spansOf(t, evs)
	if len(sp) != 2 {
		t.Fatalf("%d spans, want 2: %+v", len(sp), evs)
	}
	ar, comp := sp[0], sp[1]
	if ar.Name != "allreduce" || ar.Cat != Net || ar.TID != 2 || ar.Dur != 1000 || ar.Args["bytes"] != float64(4096) {
		t.Errorf("all-reduce span %+v", ar)
	}
	if comp.Name != "compute" || comp.TID != 1 || comp.Dur != 3000 || comp.TS != 1000e6+1000 {
		t.Errorf("compute span %+v (want ts 1e9+1000 µs, dur 3000 µs)", comp)
	}
	if r, ok := comp.Args.Round(); !ok || r != 3 || comp.Args["peer"] != "peerA" {
		t.Errorf("compute args %v", comp.Args)
	}
	if evs[0].Ph != "M" || evs[0].Args["name"] != "peerA" {
		t.Errorf("first event %+v, want the process name", evs[0])
	}
	// After Close nothing more is written.
	n := buf.Len()
	tr.Span(Train, "late", 4, clk.now(), nil)
	if buf.Len() != n {
		t.Error("a span after Close was written")
	}
}

func TestStartWithoutTracer(t *testing.T) {
	end := Start(context.Background(), Train, "compute", 1)
	end()
	if From(context.Background()) != nil {
		t.Error("From of a bare context is not nil")
	}
}

func TestReadCutShort(t *testing.T) {
	var buf bytes.Buffer
	tr := New(&buf, "p", nil)
	ctx := With(context.Background(), tr)
	for r := range int64(3) {
		Start(ctx, Train, "compute", r)()
	}
	// No Close: a killed peer's file, plus half of a further line.
	s := buf.String() + `,` + "\n" + `{"name":"comp`
	evs, err := Read(strings.NewReader(s))
	if err != nil {
		t.Fatal(err)
	}
	if got := len(spansOf(t, evs)); got != 3 {
		t.Errorf("%d spans read back from a cut file, want 3", got)
	}
	for _, bad := range []string{"", "hello", `[{"name":`, "[1,2]"} {
		if _, err := Read(strings.NewReader(bad)); !errors.Is(err, ErrFormat) {
			t.Errorf("Read(%q) = %v, want ErrFormat", bad, err)
		}
	}
	obj := `{"traceEvents":[{"name":"x","ph":"X","ts":1,"dur":2,"pid":1,"tid":1}]}`
	if evs, err := Read(strings.NewReader(obj)); err != nil || len(evs) != 1 {
		t.Errorf("object format: %v, %v", evs, err)
	}
}

func TestTracerConcurrent(t *testing.T) {
	var buf bytes.Buffer
	tr := New(&buf, "p", nil)
	ctx := With(context.Background(), tr)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range 50 {
				Start(ctx, Net, "send", int64(g*100+r))()
			}
		}()
	}
	wg.Wait()
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	evs, err := Read(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(spansOf(t, evs)); got != 400 {
		t.Errorf("%d spans, want 400", got)
	}
}

// peerTrace is a peer whose round r's all-reduce ends at base + r seconds
// of its own clock.
func peerTrace(name string, base float64, rounds ...int64) []Event {
	evs := []Event{{Name: "process_name", Ph: "M", Args: Args{"name": name}}}
	for _, r := range rounds {
		end := base + float64(r)*1e6
		evs = append(evs,
			Event{Name: "compute", Cat: Train, Ph: "X", TS: end - 9e5, Dur: 5e5, Args: Args{"round": float64(r)}},
			Event{Name: "allreduce", Cat: Net, Ph: "X", TS: end - 4e5, Dur: 4e5, Args: Args{"round": float64(r)}})
	}
	return evs
}

func TestMergeAlignsRounds(t *testing.T) {
	a := peerTrace("A", 100e6, 1, 2, 3, 4)
	b := peerTrace("B", 107e6, 2, 3, 4, 5) // its clock is 7 s ahead
	if off := Offset(a, b); off != -7e6 {
		t.Errorf("Offset = %v µs, want -7e6", off)
	}
	if off := Offset(a, peerTrace("C", 50e6, 8, 9)); off != 0 {
		t.Errorf("Offset with no common round = %v, want 0", off)
	}
	m := Merge([][]Event{a, b}, []string{"a.json", "b.json"})
	ends := map[int]map[int64]float64{1: {}, 2: {}}
	var first float64 = -1
	for _, e := range m {
		if e.Ph != "X" {
			continue
		}
		if first < 0 {
			first = e.TS
		}
		if e.Name == "allreduce" {
			r, _ := e.Args.Round()
			ends[e.PID][r] = e.TS + e.Dur
		}
	}
	if first != 0 {
		t.Errorf("merged timeline starts at %v, want 0", first)
	}
	for _, r := range []int64{2, 3, 4} {
		if ends[1][r] != ends[2][r] {
			t.Errorf("round %d ends at %v on A and %v on B after the merge", r, ends[1][r], ends[2][r])
		}
	}
	names := map[int]string{}
	for _, e := range m {
		if e.Ph == "M" && e.Name == "process_name" {
			names[e.PID] = e.Args["name"].(string)
		}
	}
	if names[1] != "A" || names[2] != "B" {
		t.Errorf("process names %v", names)
	}
	// A trace with no name takes its file's.
	m = Merge([][]Event{a, peerTrace("x", 0, 1)[1:]}, []string{"a.json", "b.json"})
	found := false
	for _, e := range m {
		found = found || e.Ph == "M" && e.PID == 2 && e.Args["name"] == "b.json"
	}
	if !found {
		t.Error("an unnamed trace is not named after its file")
	}
	var buf bytes.Buffer
	if err := Write(&buf, m); err != nil {
		t.Fatal(err)
	}
	back, err := Read(&buf)
	if err != nil || len(back) != len(m) {
		t.Errorf("Write/Read: %d events, %v; want %d", len(back), err, len(m))
	}
}
