package rule

import (
	"math"
	"slices"
)

// DistanceClip bounds how far one peer's model can pull another's where
// models are merged one at a time (AD-PSGD's exchanges, FedAsync's mixing)
// and no robust rule sees several contributions at once: before it is
// merged, a
// contribution v is moved towards the receiver's model ref until
// ‖v − ref‖ ≤ τ. This is the clipped gossip of He, Karimireddy and Jaggi
// (2022, "Byzantine-robust decentralized learning via ClippedGossip"),
// with an adaptive radius: τ is Factor times the (lower) median of the
// latest distance of each other sender. Counting senders, not messages,
// keeps a peer that floods contributions to one vote, and leaving the
// sender out keeps it from setting its own radius; with an honest
// majority among the others, τ follows the honest peers' distances as
// training converges, and a minority sending models from far away (lying,
// or diverged) move the model by at most τ each. It bounds each pull, not
// their number: a sender merged far more often than the others still
// drags the model, so callers also bound how often one sender is merged
// (FedAsync: once per own round). Until another sender is known, τ is
// ‖ref‖. Not safe for concurrent use.
type DistanceClip struct {
	Factor float64 // τ in medians (3)
	// MaxSenders bounds the senders remembered (256); past it the one
	// heard from longest ago is forgotten.
	MaxSenders int

	last    map[string]heard
	tick    uint64
	clipped int
}

type heard struct {
	dist float64
	at   uint64
}

// NewDistanceClip returns a DistanceClip with the defaults.
func NewDistanceClip() *DistanceClip {
	return &DistanceClip{Factor: 3, MaxSenders: 256, last: map[string]heard{}}
}

// Clip moves v from sender from towards ref (same length) so that
// ‖v − ref‖ ≤ τ, records the distance it had, and returns the scale
// applied to v − ref (1 when v was within τ). A v that is not finite is
// left for the caller to refuse.
func (c *DistanceClip) Clip(v, ref []float32, from string) float64 {
	var sq float64
	for i, x := range v {
		d := float64(x) - float64(ref[i])
		sq += d * d
	}
	dist := math.Sqrt(sq)
	if math.IsNaN(dist) || math.IsInf(dist, 0) {
		return 1
	}
	tau, ok := c.radius(from)
	if !ok {
		tau = norm(ref)
	}
	c.record(from, dist)
	if dist <= tau {
		return 1
	}
	c.clipped++
	s := tau / dist
	for i, x := range v {
		v[i] = float32(float64(ref[i]) + s*(float64(x)-float64(ref[i])))
	}
	return s
}

// Clipped returns how many contributions Clip has moved.
func (c *DistanceClip) Clipped() int { return c.clipped }

// radius is τ for a contribution from from: Factor times the lower median
// of the other senders' latest distances (false when there is none).
func (c *DistanceClip) radius(from string) (float64, bool) {
	ds := make([]float64, 0, len(c.last))
	for s, h := range c.last {
		if s != from {
			ds = append(ds, h.dist)
		}
	}
	if len(ds) == 0 {
		return 0, false
	}
	slices.Sort(ds)
	return c.Factor * ds[(len(ds)-1)/2], true
}

func norm(x []float32) float64 {
	var s float64
	for _, v := range x {
		s += float64(v) * float64(v)
	}
	return math.Sqrt(s)
}

func (c *DistanceClip) record(from string, d float64) {
	if c.last == nil {
		c.last = map[string]heard{}
	}
	c.tick++
	if _, ok := c.last[from]; !ok && c.MaxSenders > 0 && len(c.last) >= c.MaxSenders {
		var oldest string
		var at uint64 = math.MaxUint64
		for s, h := range c.last {
			if h.at < at {
				oldest, at = s, h.at
			}
		}
		delete(c.last, oldest)
	}
	c.last[from] = heard{dist: d, at: c.tick}
}
