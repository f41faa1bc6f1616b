package staleness

import "fmt"

// MixerConfig configures a FedAsync mixer.
type MixerConfig struct {
	// Alpha is the mixing rate α ∈ (0, 1]: a fresh contribution (s = 1)
	// moves the model a fraction α of the way to it. 0.6 is a middle value
	// of the range FedAsync experiments with; tune per task.
	Alpha float64
	// Policy weighs each contribution by its staleness. Default poly:0.5,
	// FedAsync's polynomial.
	Policy Policy
}

// DefaultMixerConfig returns α = 0.6 and the polynomial policy with a = 0.5.
func DefaultMixerConfig() MixerConfig {
	return MixerConfig{Alpha: 0.6, Policy: Polynomial(DefaultPolyA)}
}

// Validate reports whether c is usable. It does not modify c.
func (c MixerConfig) Validate() error {
	if !(c.Alpha > 0 && c.Alpha <= 1) {
		return fmt.Errorf("%w: mixer alpha %v not in (0, 1]", ErrBadConfig, c.Alpha)
	}
	return nil
}

// Mixer is FedAsync's update rule as a state machine over a model the
// caller owns: x ← (1−α·s(τ))·x + α·s(τ)·x_new, where τ is the staleness of
// x_new against the shared VersionClock. Each accepted mix ticks the clock
// (in FedAsync every server update is a new version).
//
// A Mixer is not safe for concurrent use.
type Mixer struct {
	cfg   MixerConfig
	clock *VersionClock
	stats Stats
}

// NewMixer returns a mixer that reads and ticks clock.
func NewMixer(cfg MixerConfig, clock *VersionClock) (*Mixer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if clock == nil {
		return nil, fmt.Errorf("%w: nil VersionClock", ErrBadConfig)
	}
	return &Mixer{cfg: cfg, clock: clock}, nil
}

// Config returns the mixer's configuration.
func (m *Mixer) Config() MixerConfig { return m.cfg }

// Stats returns a copy of the mixer's counters.
func (m *Mixer) Stats() Stats { return m.stats }

// Mix folds xNew, computed from version base, into x. It returns the
// decision; x changes only when the decision is Accept and err is nil.
// Errors (ErrShape, ErrNonFinite, ErrFutureVersion) mean the contribution
// was dropped and counted; a rejection by the SSP bound is not an error
// (Decision.Action == Reject). Mix reads xNew and does not retain it.
func (m *Mixer) Mix(x, xNew []float32, base Version) (Decision, error) {
	if err := checkVector(&m.stats, xNew, len(x)); err != nil {
		return Decision{Action: Reject}, err
	}
	d, err := decide(&m.stats, m.cfg.Policy, m.clock, base)
	if err != nil || d.Action != Accept {
		return d, err
	}
	m.stats.Accepted++
	a := m.cfg.Alpha * d.Weight
	if a > 0 {
		mixInto(x, xNew, a)
	}
	m.clock.Tick()
	return d, nil
}

// mixInto sets x = (1−a)·x + a·y in float64 per element, so that a = 1
// copies y exactly and a = 0 leaves x unchanged.
func mixInto(x, y []float32, a float64) {
	if a >= 1 {
		copy(x, y)
		return
	}
	y = y[:len(x)]
	for i := range x {
		xi := float64(x[i])
		x[i] = float32(xi + a*(float64(y[i])-xi))
	}
}
