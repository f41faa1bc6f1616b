package main

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/starling-ml/starling/data"
)

// Spirals is a synthetic 2-D classification task: Classes interleaved
// spiral arms around the origin, one class each, with Gaussian noise on
// the angle. No straight line separates two arms: with the defaults (3
// arms, 0.3 rad of noise) a linear classifier gets under 50% where a small
// MLP gets over 95%, and chance is 33%. The points
// depend on the seed alone: every process that builds Spirals with the
// same arguments gets the same samples. A Spirals is read-only once built,
// so its methods are safe for concurrent use.
type Spirals struct {
	x       []float32 // (x, y) of every sample, in [-1.5, 1.5]
	labels  []int32
	classes int
}

var _ data.Labeled = (*Spirals)(nil)

// spiralTurn is the angle, in radians, an arm sweeps from the centre to
// its end: one and a half turns, enough that each arm wraps around its
// neighbours.
const spiralTurn = 3 * math.Pi

// NewSpirals draws perClass points on each of classes arms: a point at
// radius r ∈ [0.05, 1) lies at angle 2πk/classes + spiralTurn·r + noise·N(0, 1)
// on arm k.
func NewSpirals(classes, perClass int, noise float64, seed uint64) (*Spirals, error) {
	switch {
	case classes < 2:
		return nil, fmt.Errorf("spirals: need at least 2 classes, got %d", classes)
	case perClass < 1:
		return nil, fmt.Errorf("spirals: need at least 1 point per class, got %d", perClass)
	case !(noise >= 0) || math.IsInf(noise, 0):
		return nil, fmt.Errorf("spirals: noise must be finite and not negative, got %v", noise)
	}
	rng := rand.New(rand.NewPCG(seed, 0x5b1a1))
	s := &Spirals{x: make([]float32, 0, 2*classes*perClass), labels: make([]int32, 0, classes*perClass), classes: classes}
	for k := range classes {
		for range perClass {
			r := 0.05 + 0.95*rng.Float64()
			theta := 2*math.Pi*float64(k)/float64(classes) + spiralTurn*r + noise*rng.NormFloat64()
			s.x = append(s.x, float32(r*math.Cos(theta)), float32(r*math.Sin(theta)))
			s.labels = append(s.labels, int32(k))
		}
	}
	return s, nil
}

// Len implements data.Dataset.
func (s *Spirals) Len() int { return len(s.labels) }

// InputShape implements data.Dataset: a point is two coordinates.
func (s *Spirals) InputShape() []int { return []int{2} }

// Targets implements data.Dataset: one label per point.
func (s *Spirals) Targets() int { return 1 }

// NumClasses implements data.Dataset.
func (s *Spirals) NumClasses() int { return s.classes }

// Labels implements data.Labeled.
func (s *Spirals) Labels() []int32 { return s.labels }

// Batch implements data.Dataset.
func (s *Spirals) Batch(idx []int, x []float32, y []int32) {
	for k, i := range idx {
		copy(x[2*k:2*k+2], s.x[2*i:2*i+2])
		y[k] = s.labels[i]
	}
}
