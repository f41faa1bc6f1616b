package aggtest

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/starling-ml/starling/aggregate"
)

func TestNetworkTiming(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// 1 MB/s, 10 ms: a 4000-byte chunk takes 4 ms on each link.
		net := NewNetwork(Config{Latency: 10 * time.Millisecond, Bandwidth: 1e6})
		a, b := net.Join("a"), net.Join("b")
		tag := aggregate.Tag{Round: 1, Chunk: 1}
		start := time.Now()
		if err := a.Send(t.Context(), "b", tag, make([]float32, 1000)); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d != 4*time.Millisecond {
			t.Errorf("Send returned after %v, want the 4 ms transmission", d)
		}
		tag2 := tag
		tag2.Chunk = 2
		if err := a.Send(t.Context(), "b", tag2, make([]float32, 1000)); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d != 8*time.Millisecond {
			t.Errorf("second Send returned after %v, want 8 ms (the link is busy)", d)
		}
		dst := make([]float32, 1000)
		if err := b.Recv(t.Context(), "a", tag, dst); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d != 14*time.Millisecond {
			t.Errorf("first chunk arrived after %v, want 4+10 ms", d)
		}
		if err := b.Recv(t.Context(), "a", tag2, dst); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d != 18*time.Millisecond {
			t.Errorf("second chunk arrived after %v, want 8+10 ms", d)
		}
		if bytes, chunks := net.Sent("a"); bytes != 8000 || chunks != 2 {
			t.Errorf("Sent = %d bytes, %d chunks", bytes, chunks)
		}
	})
}

func TestNetworkFailures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		net := NewNetwork(Config{})
		a, b, c := net.Join("a"), net.Join("b"), net.Join("c")
		tag := aggregate.Tag{Round: 1}
		ctx := t.Context()

		// Stall: Sends block until Resume; chunks to the frozen peer still land.
		net.Stall("a")
		done := make(chan error)
		go func() { done <- a.Send(ctx, "b", tag, []float32{1}) }()
		synctest.Wait()
		select {
		case err := <-done:
			t.Fatalf("a frozen peer's Send returned %v", err)
		default:
		}
		if err := c.Send(ctx, "a", tag, []float32{2}); err != nil {
			t.Fatal(err)
		}
		net.Resume("a")
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if err := a.Recv(ctx, "c", tag, make([]float32, 1)); err != nil {
			t.Fatal(err)
		}
		short, cancel := context.WithTimeout(ctx, time.Second)
		net.Stall("a")
		if err := a.Send(short, "b", tag, []float32{1}); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("a frozen Send past its deadline: %v", err)
		}
		cancel()
		net.Resume("a")

		// Kill: the dead peer's calls fail, sends to it are refused.
		net.Kill("b")
		if err := b.Send(ctx, "a", tag, nil); !errors.Is(err, aggregate.ErrClosed) {
			t.Errorf("dead peer's Send: %v", err)
		}
		if err := b.Recv(ctx, "a", tag, nil); !errors.Is(err, aggregate.ErrClosed) {
			t.Errorf("dead peer's Recv: %v", err)
		}
		if err := c.Send(ctx, "b", tag, nil); !errors.Is(err, aggregate.ErrUnreachable) {
			t.Errorf("Send to a dead peer: %v", err)
		}

		// Hooks: drop, corrupt, kill at a point.
		net.SetHook(Chain(
			Corrupt("c", aggregate.StepScatter, 0, func(x []float32) { x[0] = -1 }),
			At("c", aggregate.StepGather, 2, Drop),
			KillAt("c", aggregate.StepVote, 1),
		))
		orig := []float32{5}
		if err := c.Send(ctx, "a", aggregate.Tag{Round: 1, Step: aggregate.StepScatter}, orig); err != nil {
			t.Fatal(err)
		}
		got := make([]float32, 1)
		if err := a.Recv(ctx, "c", aggregate.Tag{Round: 1, Step: aggregate.StepScatter}, got); err != nil || got[0] != -1 || orig[0] != 5 {
			t.Errorf("corrupt: got %v (sender's copy %v), %v", got, orig, err)
		}
		for i := range uint32(3) {
			if err := c.Send(ctx, "a", aggregate.Tag{Round: 1, Step: aggregate.StepGather, Chunk: i}, orig); err != nil {
				t.Fatal(err)
			}
		}
		if a.Pending() != 2 {
			t.Errorf("%d chunks pending, want the 2 of 3 not dropped", a.Pending())
		}
		if err := c.Send(ctx, "a", aggregate.Tag{Round: 1, Step: aggregate.StepVote}, orig); !errors.Is(err, aggregate.ErrClosed) {
			t.Errorf("killed at its first vote: %v", err)
		}
	})
}
