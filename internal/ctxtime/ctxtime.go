// Package ctxtime holds the one wait every driver needs: a sleep that a
// context cuts short.
package ctxtime

import (
	"context"
	"time"
)

// Sleep waits d, or until ctx ends, and returns ctx's error if it ended
// first (or had already ended when d ≤ 0).
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Ended returns ctx's error, or context.DeadlineExceeded once ctx's
// deadline has passed even if its timer has not fired yet: a stream whose
// deadline was set from ctx's can fail a moment before ctx.Err() says so,
// and that failure is ctx's end, not the peer's.
func Ended(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		return context.DeadlineExceeded
	}
	return nil
}
