package staleness

import (
	"fmt"
	"math"
	"slices"

	"github.com/starling-ml/starling/aggregate"
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
	// Rule, if not nil, combines the buffered weighted deltas in place of
	// their mean: a robust rule (aggregate.Median, aggregate.Trimmed) so
	// that a lying contributor cannot move the model far. The buffer then
	// keeps the K deltas rather than their sum, cuts each delta longer
	// than the lower median of their norms to that length, and a step
	// applies x ← x + η·(n/K)·Rule(clip(s(τ_i)·Δ_i)) for the n deltas
	// buffered (n = K but on Flush). With fewer than half of the deltas
	// from liars, neither their lengths nor their values lead.
	Rule aggregate.Rule
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
	if c.Rule != nil {
		// A local rule on one finite value: what fails here is the rule's
		// own settings (a trimmed mean's β).
		if !c.Rule.Local() {
			return fmt.Errorf("%w: buffer rule %v needs more than one pass", ErrBadConfig, c.Rule)
		}
		if err := aggregate.Reduce(c.Rule, make([]float32, 1), [][]float32{{0}}, []float64{1}); err != nil {
			return fmt.Errorf("%w: buffer rule: %w", ErrBadConfig, err)
		}
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
	dim   int
	sum   []float64   // without a Rule
	kept  [][]float32 // with a Rule: the weighted deltas, kept[:n] in use
	ones  []float64   // with a Rule: its weights (it ignores them)
	out   []float32   // with a Rule: its result
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
	b := &Buffer{cfg: cfg, clock: clock, dim: dim}
	if cfg.Rule == nil {
		b.sum = make([]float64, dim)
	}
	return b, nil
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
	if len(x) != b.dim {
		return Decision{Action: Reject}, false, fmt.Errorf("%w: model has %d values, buffer %d", ErrShape, len(x), b.dim)
	}
	if err := checkVector(&b.stats, delta, b.dim); err != nil {
		return Decision{Action: Reject}, false, err
	}
	d, err = decide(&b.stats, b.cfg.Policy, b.clock, base)
	if err != nil || d.Action != Accept {
		return d, false, err
	}
	b.stats.Accepted++
	w := d.Weight
	if b.cfg.Rule == nil {
		for i, v := range delta {
			b.sum[i] += w * float64(v)
		}
	} else {
		if b.n == len(b.kept) {
			b.kept = append(b.kept, make([]float32, b.dim))
			b.ones = append(b.ones, 1)
		}
		k := b.kept[b.n]
		for i, v := range delta {
			k[i] = float32(w * float64(v))
		}
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
	if len(x) != b.dim {
		return false, fmt.Errorf("%w: model has %d values, buffer %d", ErrShape, len(x), b.dim)
	}
	if b.n == 0 {
		return false, nil
	}
	b.flush(x)
	return true, nil
}

func (b *Buffer) flush(x []float32) {
	scale := b.cfg.ServerLR / float64(b.cfg.K)
	if b.cfg.Rule == nil {
		for i, s := range b.sum {
			x[i] = float32(float64(x[i]) + scale*s)
			b.sum[i] = 0
		}
	} else {
		if b.out == nil {
			b.out = make([]float32, b.dim)
		}
		b.clipNorms()
		// The deltas were checked finite, a weight is at most 1 and
		// Validate tried the rule: it cannot fail but on a bug.
		if err := aggregate.Reduce(b.cfg.Rule, b.out, b.kept[:b.n], b.ones[:b.n]); err != nil {
			panic("staleness: buffer rule failed on checked deltas: " + err.Error())
		}
		scale *= float64(b.n)
		for i, v := range b.out {
			x[i] = float32(float64(x[i]) + scale*float64(v))
		}
	}
	b.n = 0
	b.clock.Tick()
}

// clipNorms scales each buffered delta longer than the lower median of
// their norms down to that length, before the rule runs: a coordinate-
// wise rule alone bounds an absurd delta by the honest values of each
// coordinate, but it still biases every coordinate the liar pushes the
// same way, step after step; cut to an honest length and spread over the
// whole model, the liar's values sit among the honest ones instead.
func (b *Buffer) clipNorms() {
	kept := b.kept[:b.n]
	norms := make([]float64, len(kept))
	for i, k := range kept {
		var ss float64
		for _, v := range k {
			ss += float64(v) * float64(v)
		}
		norms[i] = math.Sqrt(ss)
	}
	sorted := slices.Clone(norms)
	slices.Sort(sorted)
	r := sorted[(len(sorted)-1)/2]
	for i, k := range kept {
		if norms[i] > r {
			scale := float32(r / norms[i])
			for j := range k {
				k[j] *= scale
			}
		}
	}
}
