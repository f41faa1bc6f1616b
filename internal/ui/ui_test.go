package ui

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func TestBoard(t *testing.T) {
	clk := &fakeClock{t: time.Unix(100, 0)}
	b := New("run", 10, nil, clk.now)
	clk.t = clk.t.Add(2 * time.Second)
	b.Point("A", Point{Round: 1, Accuracy: 0.5, Loss: 1})
	clk.t = clk.t.Add(3 * time.Second)
	b.Point("A", Point{Round: 2, Accuracy: 0.6, Loss: 0.9})
	clk.t = clk.t.Add(4 * time.Second)
	b.Point("A", Point{Round: 4, Accuracy: 0.7, Loss: 0.8}) // two rounds in 4 s
	b.Point("B", Point{Round: 1, Accuracy: 0.4, Loss: 1.2})
	b.Merge(2)
	b.Merge(40)
	b.Merge(-1)
	b.Event("B", "left out", "stalled 3 s")
	st := b.Snapshot()
	if st.Round != 4 || st.Seconds != 9 || len(st.Curves["A"]) != 3 || len(st.Curves["B"]) != 1 {
		t.Errorf("round %d, %v s, curves %v", st.Round, st.Seconds, st.Curves)
	}
	if want := []float64{3, 2}; len(st.RoundSecs) != 2 || st.RoundSecs[0] != want[0] || st.RoundSecs[1] != want[1] {
		t.Errorf("round times %v, want %v", st.RoundSecs, want)
	}
	if st.Staleness[0] != 1 || st.Staleness[2] != 1 || st.Staleness[staleBins-1] != 1 {
		t.Errorf("staleness %v", st.Staleness)
	}
	if strings.Join(st.Live.Members, ",") != "A,B" {
		t.Errorf("members without a live view %v, want the peers that reported", st.Live.Members)
	}
	if len(st.Events) != 1 || st.Events[0].Detail != "stalled 3 s" || st.Events[0].Seconds != 9 {
		t.Errorf("events %+v", st.Events)
	}
	// A snapshot is a copy.
	st.Curves["A"][0].Round = 99
	if b.Snapshot().Curves["A"][0].Round != 1 {
		t.Error("a snapshot shares the board's curve")
	}
	for range maxEvents + 10 {
		b.Event("A", "note", "")
	}
	if n := len(b.Snapshot().Events); n != maxEvents {
		t.Errorf("%d events kept, want %d", n, maxEvents)
	}
}

func TestEmptyBoardJSON(t *testing.T) {
	b, err := json.Marshal(New("x", 0, nil, nil).Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	// The page reads these as arrays: null would stop it.
	for _, want := range []string{`"events":[]`, `"round_secs":[]`, `"members":[]`, `"links":[]`, `"curves":{}`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("an empty board's state lacks %s: %s", want, b)
		}
	}
}

func TestHandler(t *testing.T) {
	b := New("run", 5, func() Live {
		return Live{Members: []string{"Q", "P"}, Links: []Link{{"P", "Q"}}, BytesSent: 10, BytesRecv: 20}
	}, nil)
	b.Point("P", Point{Round: 1, Accuracy: 0.9})
	srv := httptest.NewServer(b.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/api/state")
	if err != nil {
		t.Fatal(err)
	}
	var st State
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil || st.Round != 1 || strings.Join(st.Live.Members, ",") != "P,Q" || st.Live.BytesRecv != 20 {
		t.Errorf("state %+v, %v", st, err)
	}
	resp, err = http.Get(srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(page), "api/state") {
		t.Error("the page does not poll api/state")
	}
	if m := regexp.MustCompile(`(src|href)="(https?:)?//`).Find(page); m != nil {
		t.Errorf("the page loads an external asset: %s", m)
	}
	if resp, err := http.Get(srv.URL + "/nothing"); err != nil || resp.StatusCode != 404 {
		t.Errorf("GET /nothing: %v %v", resp.StatusCode, err)
	}
}

// chromium returns the path of a Chromium or Chrome binary, or "".
func chromium() string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// dumpDOM loads url in headless Chromium, lets its scripts run for a few
// seconds of virtual time and returns the resulting DOM (or with extra
// flags, such as --screenshot=FILE, does what they say instead).
func dumpDOM(t *testing.T, bin, url string, extra ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	args := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
		"--user-data-dir=" + t.TempDir(), "--virtual-time-budget=4000", "--window-size=1280,1000"}
	if len(extra) == 0 {
		extra = []string{"--dump-dom"}
	}
	args = append(args, extra...)
	cmd := exec.CommandContext(ctx, bin, append(args, url)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil || len(out) == 0 && extra[0] == "--dump-dom" {
		t.Fatalf("chromium: %v; it says:\n%s", err, lastLines(stderr.String(), 10))
	}
	return string(out)
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(l[max(0, len(l)-n):], "\n")
}

// TestDashboardInChromium drives the page in headless Chromium: it shows
// the board's data, and new reports appear on the next load.
func TestDashboardInChromium(t *testing.T) {
	bin := chromium()
	if bin == "" {
		t.Skip("no chromium on PATH (Debian: apt-get install chromium); .ci/run installs it")
	}
	if testing.Short() {
		t.Skip("starts a browser")
	}
	b := New("dashboard test", 10, func() Live {
		return Live{Members: []string{"12D3KooWpeerAAAAAA", "12D3KooWpeerBBBBBB"}, Links: []Link{{"12D3KooWpeerAAAAAA", "12D3KooWpeerBBBBBB"}}, BytesSent: 12_500_000, Counted: true}
	}, nil)
	for r := 1; r <= 3; r++ {
		b.Point("12D3KooWpeerAAAAAA", Point{Round: r, Accuracy: 0.8 + 0.05*float64(r), Loss: 1 / float64(r)})
		b.Point("12D3KooWpeerBBBBBB", Point{Round: r, Accuracy: 0.75 + 0.05*float64(r), Loss: 1.1 / float64(r)})
	}
	b.Event("12D3KooWpeerBBBBBB", "left out", "stalled past 1.5 stall timeouts")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	url, err := Serve(ctx, "127.0.0.1:0", b)
	if err != nil {
		t.Fatal(err)
	}
	dom := dumpDOM(t, bin, url)
	for _, want := range []string{`data-round="3"`, `<span id="round">3</span>`, `<span id="status">live</span>`, "…BBBBBB", "95.00%",
		"stalled past 1.5 stall timeouts", `<span id="sent">12.5 MB</span>`, "<path d="} {
		if !strings.Contains(dom, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("DOM:\n%s", dom)
		return
	}
	// Live: later reports show up.
	b.Point("12D3KooWpeerAAAAAA", Point{Round: 4, Accuracy: 0.97, Loss: 0.2})
	b.Done()
	dom = dumpDOM(t, bin, url)
	for _, want := range []string{`data-round="4"`, "97.00%", `<span id="status">finished</span>`} {
		if !strings.Contains(dom, want) {
			t.Errorf("after more reports the page lacks %q", want)
		}
	}
	if shot := os.Getenv("STARLING_DASHBOARD_SCREENSHOT"); shot != "" {
		abs, _ := filepath.Abs(shot)
		dumpDOM(t, bin, url, "--screenshot="+abs)
	}
}
