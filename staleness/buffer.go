package staleness

import (
	"fmt"
	"math"
)

// BufferConfig configures a FedBuff buffer.
type BufferConfig struct {
	// K is the number of accepted contributions buffered before one server
	// step. FedBuff's experiments mostly use K = 10.
	K int
	// ServerLR is the server learning rate η applied to the buffered mean
	// delta: x ← x + η·Σ s(τ_i)·Δ_i / K. 1 applies the mean delta as is.
	ServerLR float64
	// Policy weighs each delta by its staleness. Default sqrt,
	// FedBuff's 1/√(1+τ).
	Policy Policy
}

// DefaultBufferConfig returns K = 10, η = 1 and the 1/√(1+τ) policy.
func DefaultBufferConfig() BufferConfig {
	return BufferConfig{K: 10, ServerLR: 1, Policy: InvSqrt()}
}

// Validate reports whether c is usable. It does not modify c.
func (c BufferConfig) Validate() error {
	if c.K < 1 {
		return fmt.Errorf("%w: buffer K %d < 1", ErrBadConfig, c.K)
	}
	if !(c.ServerLR > 0) || math.IsInf(c.ServerLR, 0) {
		return fmt.Errorf("%w: buffer server learning rate %v not a finite number > 0", ErrBadConfig, c.ServerLR)
	}
	return nil
}

// Buffer is FedBuff's aggregation as a state machine: each accepted
// contribution Δ (a model delta, new − base) adds s(τ)·Δ to a running sum;
// the K-th one applies x ← x + η·sum/K to the caller's model, resets the sum
// and ticks the shared VersionClock. τ of buffered deltas is measured when
// they arrive.
//
// A Buffer is not safe for concurrent use.
type Buffer struct {
	cfg   BufferConfig
	clock *VersionClock
	sum   []float64
	n     int
	stats Stats
}

// NewBuffer returns a buffer for models of dim values that reads and ticks
// clock.
func NewBuffer(dim int, cfg BufferConfig, clock *VersionClock) (*Buffer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if dim < 0 {
		return nil, fmt.Errorf("%w: buffer dim %d < 0", ErrBadConfig, dim)
	}
	if clock == nil {
		return nil, fmt.Errorf("%w: nil VersionClock", ErrBadConfig)
	}
	return &Buffer{cfg: cfg, clock: clock, sum: make([]float64, dim)}, nil
}

// Config returns the buffer's configuration.
func (b *Buffer) Config() BufferConfig { return b.cfg }

// Stats returns a copy of the buffer's counters.
func (b *Buffer) Stats() Stats { return b.stats }

// Len returns the number of contributions buffered since the last step.
func (b *Buffer) Len() int { return b.n }

// Add buffers delta, computed from version base, and applies the buffer to
// x when it holds K contributions (flushed is then true). x and delta must
// have the buffer's dim. Errors (ErrShape, ErrNonFinite, ErrFutureVersion)
// mean the delta was dropped and counted; a rejection by the SSP bound is
// not an error (Decision.Action == Reject). x changes only on a flush. Add
// does not retain delta.
func (b *Buffer) Add(x, delta []float32, base Version) (d Decision, flushed bool, err error) {
	if len(x) != len(b.sum) {
		return Decision{Action: Reject}, false, fmt.Errorf("%w: model has %d values, buffer %d", ErrShape, len(x), len(b.sum))
	}
	if err := checkVector(&b.stats, delta, len(b.sum)); err != nil {
		return Decision{Action: Reject}, false, err
	}
	d, err = decide(&b.stats, b.cfg.Policy, b.clock, base)
	if err != nil || d.Action != Accept {
		return d, false, err
	}
	b.stats.Accepted++
	w := d.Weight
	for i, v := range delta {
		b.sum[i] += w * float64(v)
	}
	b.n++
	if b.n < b.cfg.K {
		return d, false, nil
	}
	b.flush(x)
	return d, true, nil
}

// Flush applies whatever is buffered to x now (fewer than K contributions,
// still divided by K as FedBuff's server does) and reports whether anything
// was buffered. Use it at the end of training or on a timeout.
func (b *Buffer) Flush(x []float32) (bool, error) {
	if len(x) != len(b.sum) {
		return false, fmt.Errorf("%w: model has %d values, buffer %d", ErrShape, len(x), len(b.sum))
	}
	if b.n == 0 {
		return false, nil
	}
	b.flush(x)
	return true, nil
}

func (b *Buffer) flush(x []float32) {
	scale := b.cfg.ServerLR / float64(b.cfg.K)
	for i, s := range b.sum {
		x[i] = float32(float64(x[i]) + scale*s)
		b.sum[i] = 0
	}
	b.n = 0
	b.clock.Tick()
}
