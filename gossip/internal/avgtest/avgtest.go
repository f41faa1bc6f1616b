// Package avgtest helps the tests of gossip averaging, in memory
// (gossip/average) and over node/ streams (gossip): random models far
// apart, and how far they still are from their mean.
package avgtest

import (
	"math"
	"math/rand/v2"
)

// Models returns n random d-vectors (peer i's values centred on i, so the
// initial spread is large) and their mean in float64.
func Models(r *rand.Rand, n, d int) ([][]float32, []float64) {
	xs := make([][]float32, n)
	mean := make([]float64, d)
	for i := range xs {
		xs[i] = make([]float32, d)
		for j := range xs[i] {
			xs[i][j] = float32(float64(i) + r.NormFloat64())
			mean[j] += float64(xs[i][j]) / float64(n)
		}
	}
	return xs, mean
}

// Spread returns max_i ‖x_i − mean‖₂.
func Spread(xs [][]float32, mean []float64) float64 {
	worst := 0.0
	for _, x := range xs {
		s := 0.0
		for j, v := range x {
			d := float64(v) - mean[j]
			s += d * d
		}
		worst = max(worst, math.Sqrt(s))
	}
	return worst
}
