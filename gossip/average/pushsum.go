package average

import (
	"fmt"
	"math"
	"math/bits"
)

// ExpGraphOffsets returns how many distinct out-neighbour offsets the
// one-peer exponential graph has on n peers: offsets 1, 2, 4, …, 2^(m−1),
// all below n. It is 0 for n ≤ 1.
func ExpGraphOffsets(n int) int {
	if n <= 1 {
		return 0
	}
	return bits.Len(uint(n - 1))
}

// ExpGraphPeer returns the out-neighbour of peer i (0 ≤ i < n) at step k in
// the time-varying one-peer exponential graph of Stochastic Gradient Push
// (Assran et al. 2019): i + 2^(k mod m) mod n, m = ExpGraphOffsets(n). Over
// m consecutive steps every peer sends to peers 1, 2, 4, … ahead, so the
// union graph is strongly connected and, when n is a power of two, m
// steps of halving make every estimate the exact mean. It returns i for
// n ≤ 1.
func ExpGraphPeer(i, n int, k uint64) int {
	m := ExpGraphOffsets(n)
	if m == 0 {
		return i
	}
	return (i + 1<<(k%uint64(m))) % n
}

// ExpGraphInPeer returns the peer that sends to i at step k (the inverse of
// ExpGraphPeer), so a receiver knows whom to expect.
func ExpGraphInPeer(i, n int, k uint64) int {
	m := ExpGraphOffsets(n)
	if m == 0 {
		return i
	}
	off := 1 << (k % uint64(m))
	return ((i-off)%n + n) % n
}

// PushSum is one peer's push-sum state (Kempe et al. 2003; the mixing step
// of Stochastic Gradient Push): a numerator X and a weight W. The peer's
// estimate of the network mean is X/W. Mixing is column-stochastic: a peer
// keeps part of (X, W) and sends the rest, receivers add what arrives, so
// the sums of X and of W over peers and messages in flight never change,
// and every X/W converges to the mean of the initial X (W starts at 1).
// Delays and reordering only postpone mass; they do not bias the mean.
//
// In SGP the local optimiser steps X with the gradient taken at X/W.
// PushSum is pure and not safe for concurrent use.
type PushSum struct {
	X []float32 // numerator; the caller's model memory may back it
	W float64   // weight, > 0
}

// NewPushSum returns a state with numerator x (not copied) and weight 1.
func NewPushSum(x []float32) *PushSum { return &PushSum{X: x, W: 1} }

// Share splits the state for k ≥ 1 out-neighbours: the peer keeps
// 1/(k+1) of its mass and each neighbour gets 1/(k+1). The share's
// numerator is appended to dst[:0] (grown if short) and returned with the
// share's weight; send the same share to each of the k neighbours.
func (s *PushSum) Share(dst []float32, k int) ([]float32, float64) {
	if k < 1 {
		k = 1
	}
	f := 1 / float32(k+1)
	dst = growF32(dst, len(s.X))
	for i, v := range s.X {
		sh := v * f
		dst[i] = sh
		s.X[i] = v - float32(k)*sh
	}
	w := s.W / float64(k+1)
	s.W -= float64(k) * w
	return dst, w
}

// Absorb adds a received share (x, w). It checks the share first and
// leaves the state unchanged on error: a wrong length (ErrShape), a NaN or
// Inf (ErrNonFinite), or a weight that is not finite and > 0
// (ErrBadWeight).
func (s *PushSum) Absorb(x []float32, w float64) error {
	if err := s.check(x, w); err != nil {
		return err
	}
	s.add(x, w)
	return nil
}

// add adds a share that passed check.
func (s *PushSum) add(x []float32, w float64) {
	for i, v := range x {
		s.X[i] += v
	}
	s.W += w
}

// check is Absorb's check of a share.
func (s *PushSum) check(x []float32, w float64) error {
	if len(x) != len(s.X) {
		return fmt.Errorf("%w: share has %d values, state %d", ErrShape, len(x), len(s.X))
	}
	if !(w > 0) || math.IsInf(w, 0) {
		return fmt.Errorf("%w: %v", ErrBadWeight, w)
	}
	if i := firstNonFinite(x); i >= 0 {
		return fmt.Errorf("%w: share element %d is %v", ErrNonFinite, i, x[i])
	}
	return nil
}

// checkShare is a clipping peer's check of a received share (x, w): a
// weight above maxWeight, the group's whole weight, which no honest share
// carries (ErrBadWeight), then Absorb's checks.
func (s *PushSum) checkShare(x []float32, w, maxWeight float64) error {
	if w > maxWeight {
		return fmt.Errorf("%w: share weight %v > %v, the group's whole", ErrBadWeight, w, maxWeight)
	}
	return s.check(x, w)
}

// Estimate writes X/W, the de-biased model, to dst[:0] (grown if short)
// and returns it.
func (s *PushSum) Estimate(dst []float32) []float32 {
	dst = growF32(dst, len(s.X))
	inv := 1 / s.W
	for i, v := range s.X {
		dst[i] = float32(float64(v) * inv)
	}
	return dst
}

func firstNonFinite(x []float32) int {
	for i, v := range x {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return i
		}
	}
	return -1
}

func growF32(dst []float32, n int) []float32 {
	if cap(dst) >= n {
		return dst[:n]
	}
	return make([]float32, n)
}
