package staleness

import (
	"fmt"
	"math"
)

// DefaultDCLambda is the default λ of Compensate. DC-ASGD tunes λ per task;
// small values (≈0.04 for the constant variant) keep the correction a
// perturbation of the stale gradient.
const DefaultDCLambda = 0.04

// Compensate is DC-ASGD's delay compensation (Zheng et al. 2017,
// DC-ASGD-c): it returns g + λ·g⊙g⊙(w − wBak), where g is a gradient
// computed at the backup weights wBak and w are the current weights: a
// first-order Taylor correction of g to w with the diagonal outer product
// g⊙g standing in for the Hessian.
//
// The result is written to dst[:0]'s backing array (grown if needed) and
// returned; dst may alias g. g, w and wBak must have the same length
// (ErrShape otherwise).
func Compensate(dst, g, w, wBak []float32, lambda float32) ([]float32, error) {
	if len(w) != len(g) || len(wBak) != len(g) {
		return dst, fmt.Errorf("%w: g %d, w %d, w_bak %d", ErrShape, len(g), len(w), len(wBak))
	}
	dst = grow(dst, len(g))
	w, wBak = w[:len(g)], wBak[:len(g)]
	for i, gi := range g {
		dst[i] = gi + lambda*gi*gi*(w[i]-wBak[i])
	}
	return dst, nil
}

// AdaptiveCompensator is DC-ASGD-a: λ varies per element as
// λ0/√(m_t + ε), with m_t = μ·m_{t−1} + (1−μ)·g⊙g a running mean square of
// the gradients it has seen, so the correction is scale-free.
//
// It holds the running mean square and is not safe for concurrent use.
type AdaptiveCompensator struct {
	Lambda0  float32 // λ0; the paper's adaptive runs use values around 1–2
	Momentum float32 // μ ∈ [0, 1), 0.95 by default
	Epsilon  float32 // ε > 0 guards the square root; 1e-7 by default
	ms       []float32
}

// NewAdaptiveCompensator returns a DC-ASGD-a compensator for dim-value
// gradients with λ0 = 2, μ = 0.95, ε = 1e-7.
func NewAdaptiveCompensator(dim int) *AdaptiveCompensator {
	return &AdaptiveCompensator{Lambda0: 2, Momentum: 0.95, Epsilon: 1e-7, ms: make([]float32, dim)}
}

// Compensate updates the running mean square with g and returns
// g + λ0/√(m+ε)·g⊙g⊙(w − wBak), appended to dst[:0] (dst may alias g).
func (a *AdaptiveCompensator) Compensate(dst, g, w, wBak []float32) ([]float32, error) {
	if len(w) != len(g) || len(wBak) != len(g) || len(a.ms) != len(g) {
		return dst, fmt.Errorf("%w: g %d, w %d, w_bak %d, state %d", ErrShape, len(g), len(w), len(wBak), len(a.ms))
	}
	dst = grow(dst, len(g))
	mu := a.Momentum
	for i, gi := range g {
		m := mu*a.ms[i] + (1-mu)*gi*gi
		a.ms[i] = m
		lam := a.Lambda0 / float32(math.Sqrt(float64(m+a.Epsilon)))
		dst[i] = gi + lam*gi*gi*(w[i]-wBak[i])
	}
	return dst, nil
}

// grow returns dst resliced to n values, reallocating if its capacity is
// short. Callers overwrite every value.
func grow(dst []float32, n int) []float32 {
	if cap(dst) >= n {
		return dst[:n]
	}
	return make([]float32, n)
}
