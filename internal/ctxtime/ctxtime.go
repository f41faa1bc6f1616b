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
