package peerrun

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/starling-ml/starling/peerid"
	"github.com/starling-ml/starling/train"
)

func TestLinger(t *testing.T) {
	ctx := context.Background()
	took := func(f func()) time.Duration { s := time.Now(); f(); return time.Since(s) }

	// Without a condition it waits min.
	if d := took(func() { linger(ctx, 50*time.Millisecond, nil, time.Hour) }); d < 50*time.Millisecond || d > 2*time.Second {
		t.Errorf("plain linger took %v", d)
	}
	// It waits while more holds, and stops once it does not.
	var calls atomic.Int32
	more := func() bool { return calls.Add(1) < 4 }
	if d := took(func() { linger(ctx, 10*time.Millisecond, more, time.Hour) }); d < 300*time.Millisecond || d > 3*time.Second {
		t.Errorf("linger while more took %v (%d calls)", d, calls.Load())
	}
	// max bounds it.
	if d := took(func() { linger(ctx, 10*time.Millisecond, func() bool { return true }, 400*time.Millisecond) }); d < 400*time.Millisecond || d > 3*time.Second {
		t.Errorf("linger bounded by max took %v", d)
	}
	// So does ctx.
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if d := took(func() { linger(cctx, 10*time.Millisecond, func() bool { return true }, time.Hour) }); d > 3*time.Second {
		t.Errorf("linger past ctx took %v", d)
	}
}

// TestSyncBehind: a sync peer that finished stays up while another live
// peer is joining or short of the last step without having stopped.
func TestSyncBehind(t *testing.T) {
	const total = 100
	for _, tc := range []struct {
		name     string
		statuses map[peerid.ID]train.Status
		want     bool
	}{
		{"nobody", nil, false},
		{"all finished", map[peerid.ID]train.Status{"a": {Version: total}, "b": {Version: total}}, false},
		{"one behind", map[peerid.ID]train.Status{"a": {Version: total}, "b": {Version: 80}}, true},
		{"one joining", map[peerid.ID]train.Status{"a": {Version: total}, "b": {JoinAt: 102}}, true},
		{"one stopped early", map[peerid.ID]train.Status{"a": {Version: total}, "b": {Version: 80, Done: true}}, false},
		{"one not started", map[peerid.ID]train.Status{"a": {}}, true},
	} {
		if got := syncBehind(tc.statuses, total); got != tc.want {
			t.Errorf("%s: syncBehind = %v, want %v", tc.name, got, tc.want)
		}
	}
}
