package aggtest

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/starling-ml/starling/aggregate"
	"github.com/starling-ml/starling/peerid"
)

// At returns a hook that answers act to peer p's nth Send (counting from 1)
// of step s, to any destination, and Deliver to everything else. With act
// Kill or Stall the peer dies or freezes exactly there: KillAt(p,
// StepScatter, 1) before it sends anything, StepGather after it received
// its shard but before sharing the reduced one.
func At(p peerid.ID, s aggregate.Step, nth int, act Action) Hook {
	var count atomic.Int64
	return func(from, _ peerid.ID, tag aggregate.Tag, _ []float32) Action {
		if from != p || tag.Step != s {
			return Deliver
		}
		if count.Add(1) == int64(nth) {
			return act
		}
		return Deliver
	}
}

// KillAt is At(p, s, nth, Kill).
func KillAt(p peerid.ID, s aggregate.Step, nth int) Hook { return At(p, s, nth, Kill) }

// StallAt is At(p, s, nth, Stall).
func StallAt(p peerid.ID, s aggregate.Step, nth int) Hook { return At(p, s, nth, Stall) }

// Corrupt returns a hook that applies f to the data of every chunk peer p
// sends in step s whose chunk index is chunk (a tampering or buggy peer).
func Corrupt(p peerid.ID, s aggregate.Step, chunk uint32, f func([]float32)) Hook {
	return func(from, _ peerid.ID, tag aggregate.Tag, data []float32) Action {
		if from == p && tag.Step == s && tag.Chunk == chunk {
			f(data)
		}
		return Deliver
	}
}

// Chain runs hooks in order; the first answer other than Deliver wins.
func Chain(hs ...Hook) Hook {
	return func(from, to peerid.ID, tag aggregate.Tag, data []float32) Action {
		for _, h := range hs {
			if a := h(from, to, tag, data); a != Deliver {
				return a
			}
		}
		return Deliver
	}
}

// Outcome is one peer's side of a round run by RunRound.
type Outcome struct {
	Result  aggregate.Result
	Err     error
	Out     []float32     // the peer's dst
	Elapsed time.Duration // from the start of RunRound to this peer's return
}

// RunRound runs AllReduce on every runner at once, runner i contributing
// srcs[i] with weights[i] (a nil weights means 1 each), and returns the
// outcomes in runner order once all have returned.
func RunRound(ctx context.Context, runners []*aggregate.Runner, g aggregate.Group, srcs [][]float32, weights []float64) []Outcome {
	out := make([]Outcome, len(runners))
	var wg sync.WaitGroup
	start := time.Now()
	for i, r := range runners {
		out[i].Out = make([]float32, len(srcs[i]))
		w := 1.0
		if weights != nil {
			w = weights[i]
		}
		wg.Go(func() {
			out[i].Result, out[i].Err = r.AllReduce(ctx, g, out[i].Out, srcs[i], w)
			out[i].Elapsed = time.Since(start)
		})
	}
	wg.Wait()
	return out
}
