package staleness

import (
	"fmt"
	"math"
	"slices"

	"github.com/starling-ml/starling/aggregate/rule"
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
	// their mean: a robust rule (rule.Median, rule.Trimmed) so
	// that a lying contributor cannot move the model far. The buffer then
	// keeps one vote per contributor (AddFrom's voter; each of Add's
	// deltas is a voter of its own): the mean v_p of its weighted deltas
	// s(τ_i)·Δ_i. A step cuts each vote longer than the lower median of
	// their norms to that length and applies x ← x + η·(min(n, K)/K)·
	// Rule(clip(v_p)) for the n deltas buffered. A full buffer (n ≥ K)
	// waits for votes from Quorum voters (SetQuorum) before it steps, so
	// a contributor that floods deltas is still one vote among them, and
	// with fewer than half of the votes from liars neither their lengths
	// nor their values lead.
	Rule rule.Rule
	// Models, with a Rule, takes models rather than deltas. With AddFrom,
	// a voter's latest model m_p, from base b_p, is a standing vote
	// s(τ_p)·(m_p − x), τ_p its staleness at the step, until the voter
	// sends another model or standingSteps steps pass; a step needs K
	// models since the last one, from the quorum of voters. (Add's
	// anonymous models vote in one step only, as the weighted mean of
	// the voter's models minus x, times the mean weight.) A peer whose
	// model drifted from the others' then gets votes that pull it back
	// towards them: deltas, each from its sender's own model, cannot (the
	// peers of a swarm each keep a model of their own).
	Models bool
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
	if c.Models && c.Rule == nil {
		return fmt.Errorf("%w: a buffer of models needs a rule", ErrBadConfig)
	}
	if c.Rule != nil {
		// A local rule on one finite value: what fails here is the rule's
		// own settings (a trimmed mean's β).
		if !c.Rule.Local() {
			return fmt.Errorf("%w: buffer rule %v needs more than one pass", ErrBadConfig, c.Rule)
		}
		if err := rule.Reduce(c.Rule, make([]float32, 1), [][]float32{{0}}, []float64{1}); err != nil {
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
	sum   []float64 // without a Rule
	n     int
	stats Stats

	// With a Rule:
	votes  []*vote          // in order of arrival
	byFrom map[string]*vote // AddFrom's voters
	spare  []*vote          // recycled
	quorum int
	fresh  int         // votes new or renewed since the last step
	rows   [][]float32 // the votes, for the rule
	rowBuf [][]float32
	ones   []float64 // its weights (it ignores them)
	out    []float32 // its result
}

// vote is one contributor's weighted deltas in a Buffer with a Rule.
type vote struct {
	from string // its key in byFrom ("" for Add's votes)
	sum  []float32
	n    int
	w    float64 // Models: the sum of the weights
	// standing (Models, AddFrom): sum is the voter's latest model, from
	// base, and the vote stands across steps until the voter sends
	// another (fresh) or it expires (idle steps without one).
	standing bool
	fresh    bool
	base     Version
	idle     int
}

// standingSteps is how many steps a standing vote outlives its last
// renewal: a peer that stopped, or a straggler between its models, still
// votes, weighed by the staleness of its model; after that many steps
// without a new model it no longer does.
const standingSteps = 16

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
	} else {
		b.byFrom = make(map[string]*vote)
	}
	return b, nil
}

// SetQuorum sets how many voters' deltas a full buffer with a Rule waits
// for before it steps (1 at first): callers with a changing set of
// contributors set it before each AddFrom, to a majority of them. Without
// a Rule it has no effect.
func (b *Buffer) SetQuorum(q int) { b.quorum = q }

// Voters returns how many voters have deltas in the buffer (with a Rule;
// without one every delta counts as a voter).
func (b *Buffer) Voters() int {
	if b.cfg.Rule == nil {
		return b.n
	}
	return len(b.votes)
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
// does not retain delta. With a Rule, the delta is a vote of its own.
func (b *Buffer) Add(x, delta []float32, base Version) (d Decision, flushed bool, err error) {
	return b.add(x, delta, base, "", false)
}

// AddFrom is Add for a delta from voter from: with a Rule, it joins the
// voter's other deltas in the buffer as one vote, and a full buffer steps
// only once Quorum voters are in (see BufferConfig.Rule).
func (b *Buffer) AddFrom(x, delta []float32, base Version, from string) (d Decision, flushed bool, err error) {
	return b.add(x, delta, base, from, true)
}

func (b *Buffer) add(x, delta []float32, base Version, from string, keyed bool) (d Decision, flushed bool, err error) {
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
	} else if b.cfg.Models && keyed {
		// The voter's latest model replaces its earlier one; its weight
		// is taken at the step, from its staleness then.
		v := b.byFrom[from]
		if v == nil {
			v = b.newVote()
			v.standing, v.from = true, from
			b.byFrom[from] = v
		}
		copy(v.sum, delta)
		v.base, v.n, v.idle = base, 1, 0
		if !v.fresh {
			v.fresh = true
			b.fresh++
		}
	} else {
		v := b.byFrom[from]
		if v == nil || !keyed {
			v = b.newVote()
			b.fresh++
			if keyed {
				v.from = from
				b.byFrom[from] = v
			}
		}
		for i, x := range delta {
			v.sum[i] += float32(w * float64(x))
		}
		v.n++
		v.w += w
	}
	b.n++
	if b.n < b.cfg.K || b.cfg.Rule != nil && b.fresh < b.quorum {
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

// drop recycles v, which the caller removes from b.votes.
func (b *Buffer) drop(v *vote) {
	if b.byFrom[v.from] == v {
		delete(b.byFrom, v.from)
	}
	clear(v.sum)
	*v = vote{sum: v.sum}
	b.spare = append(b.spare, v)
}

// newVote returns a zeroed vote appended to b.votes.
func (b *Buffer) newVote() *vote {
	var v *vote
	if n := len(b.spare); n > 0 {
		v, b.spare = b.spare[n-1], b.spare[:n-1]
	} else {
		v = &vote{sum: make([]float32, b.dim)}
	}
	b.votes = append(b.votes, v)
	return v
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
		b.rows, b.ones = b.rows[:0], b.ones[:0]
		keep := b.votes[:0]
		for _, v := range b.votes {
			if len(b.rowBuf) == len(b.rows) {
				b.rowBuf = append(b.rowBuf, make([]float32, b.dim))
			}
			r := b.rowBuf[len(b.rows)]
			switch {
			case v.standing:
				tau, err := b.clock.Staleness(v.base)
				if err != nil {
					tau = 0
				}
				d := b.cfg.Policy.Decide(tau)
				if d.Action != Accept {
					b.drop(v) // beyond the staleness bound
					continue
				}
				for i, m := range v.sum {
					r[i] = float32(d.Weight * (float64(m) - float64(x[i])))
				}
			case b.cfg.Models && v.w > 0:
				// s̄·(Σ wᵢmᵢ/Σ wᵢ − x), s̄ = Σ wᵢ/n.
				f, sc := 1/v.w, v.w/float64(v.n)
				for i, m := range v.sum {
					r[i] = float32(sc * (f*float64(m) - float64(x[i])))
				}
			case b.cfg.Models:
				clear(r) // every weight 0: no pull
			default:
				f := 1 / float32(v.n)
				for i, m := range v.sum {
					r[i] = m * f
				}
			}
			b.rows, b.ones = append(b.rows, r), append(b.ones, 1)
			if v.standing && v.idle < standingSteps {
				v.fresh = false
				v.idle++
				keep = append(keep, v)
			} else {
				b.drop(v)
			}
		}
		clear(b.votes[len(keep):])
		b.votes = keep
		b.fresh = 0
		if len(b.rows) > 0 {
			b.clipNorms()
			// The deltas were checked finite, a weight is at most 1 and
			// Validate tried the rule: it cannot fail but on a bug.
			if err := rule.Reduce(b.cfg.Rule, b.out, b.rows, b.ones); err != nil {
				panic("staleness: buffer rule failed on checked deltas: " + err.Error())
			}
			scale *= float64(min(b.n, b.cfg.K))
			for i, v := range b.out {
				x[i] = float32(float64(x[i]) + scale*float64(v))
			}
		}
	}
	b.n = 0
	b.clock.Tick()
}

// clipNorms scales each vote longer than the lower median of their norms
// down to that length, before the rule runs: a coordinate-wise rule alone
// bounds an absurd delta by the honest values of each coordinate, but it
// still biases every coordinate the liar pushes the same way, step after
// step; cut to an honest length and spread over the whole model, the
// liar's values sit among the honest ones instead.
func (b *Buffer) clipNorms() {
	kept := b.rows
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
