package node

import (
	"fmt"
	"testing"
	"time"
)

// TestRateLog: one line per key per interval, the held-back lines counted
// into the next; other keys are independent; the key table stays bounded.
func TestRateLog(t *testing.T) {
	t0 := time.Unix(1000, 0)
	r := newRateLog(10*time.Second, 3)
	steps := []struct {
		key      string
		at       time.Duration
		ok       bool
		wantHeld int
	}{
		{"a", 0, true, 0},
		{"a", time.Second, false, 0},
		{"a", 9 * time.Second, false, 0},
		{"b", 9 * time.Second, true, 0},
		{"a", 10 * time.Second, true, 2},
		{"a", 12 * time.Second, false, 0},
		{"a", 30 * time.Second, true, 1},
		{"a", 41 * time.Second, true, 0},
		{"c", 41 * time.Second, true, 0},
		// Full (a, b, c): b is stale and idle, so d takes its place.
		{"d", 42 * time.Second, true, 0},
		// Full again with fresh keys: e and f share the overflow key.
		{"e", 43 * time.Second, true, 0},
		{"f", 44 * time.Second, false, 0},
	}
	for i, s := range steps {
		ok, held := r.allow(s.key, t0.Add(s.at))
		if ok != s.ok || held != s.wantHeld {
			t.Fatalf("step %d (%s at %v): allow = %v, %d; want %v, %d", i, s.key, s.at, ok, held, s.ok, s.wantHeld)
		}
	}
	for i := range 100 {
		r.allow(fmt.Sprint("x", i), t0.Add(50*time.Second))
	}
	if len(r.keys) > 4 { // max, plus the overflow key
		t.Fatalf("%d keys kept, want at most 4", len(r.keys))
	}
}
