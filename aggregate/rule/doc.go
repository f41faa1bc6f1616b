// Package rule holds Starling's reducers: pure functions that turn n
// contributions (vectors of one length, each with a weight) into one
// vector. Sum, Mean (weights = sample counts), Median, Trimmed (β), Krum
// (Multi-Krum with f, m) and CClip (centered clipping with τ, L
// iterations); Parse reads them from flag values ("mean", "trimmed:0.2",
// "krum:f=2,m=3", "cclip:tau=10,iters=3"). DistanceClip bounds how far one
// merged model can pull another where models are merged one at a time.
//
//	r, err := rule.Parse("trimmed:0.2")
//	err = rule.Reduce(r, dst, [][]float32{a, b, c}, []float64{1, 1, 1})
//
// Every rule also runs sharded, as aggregate's butterfly needs: each
// shard owner runs a Pass over the n contributions of its shard; Krum and
// CClip agree on their few global numbers (pairwise distances, norms) by
// summing each shard's Stats. Nothing here starts a goroutine, does I/O or
// reads a clock; rules are values, safe for concurrent use.
package rule
