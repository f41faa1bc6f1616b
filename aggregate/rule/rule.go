package rule

import (
	"fmt"
	"math"
	"slices"

	"github.com/starling-ml/starling/device"
)

// A Rule turns n contributions (vectors of one length, each with a weight)
// into one vector. Rules are pure values, safe for concurrent use.
//
// Every rule runs sharded: the coordinates are split into shards, each shard
// is reduced by its own Pass, and the passes agree on the few global
// statistics a rule needs (Krum's pairwise distances, centered clipping's
// norms) by summing each pass's Stats across shards. Reduce is the one-shard
// case. Local rules (sum, mean, median, trimmed mean) need no statistics, so
// any slice of coordinates, down to one chunk, can be reduced on its own.
type Rule interface {
	// String returns the rule's canonical spec; Parse(r.String())
	// returns an equal rule.
	String() string
	// Linear reports whether the rule is a weighted sum whose partial sums
	// combine (sum, mean): only linear rules run on a tree.
	Linear() bool
	// Local reports whether output coordinate k depends only on coordinate
	// k of the contributions.
	Local() bool
	// MinInputs returns the fewest contributions the rule accepts.
	MinInputs() int
	// Start begins reducing one shard: srcs[i] is contribution i's values
	// for the shard's coordinates (all of one length) and w[i] its weight.
	// The values must be finite (Reduce and the all-reduce driver check
	// them); srcs must not change until Finish returns.
	Start(srcs [][]float32, w []float64) (Pass, error)
}

// Pass reduces one shard of the contributions. A Pass is not safe for
// concurrent use. Its caller loops:
//
//	for s := p.Stats(); s != nil; s = p.Stats() {
//		p.Absorb(sumOverShards(s)) // element-wise, in shard order
//	}
//	p.Finish(dst)
type Pass interface {
	// Stats returns this shard's share of the statistics the next step
	// needs, or nil when the pass can finish. The slice is owned by the
	// Pass and valid until the next call.
	Stats() []float64
	// Absorb takes the element-wise sum over all shards of their Stats.
	Absorb(global []float64) error
	// Finish writes the shard's result into dst (one value per coordinate).
	Finish(dst []float32) error
}

// Reduce runs r over whole vectors: dst = r(srcs, w). It checks its inputs
// (shapes, weights, finite values) and returns an error wrapping ErrBadInput,
// ErrTooFewInputs or ErrZeroWeight instead of a result it cannot stand by.
func Reduce(r Rule, dst []float32, srcs [][]float32, w []float64) error {
	if err := checkInputs(len(dst), srcs, w); err != nil {
		return err
	}
	for i, s := range srcs {
		if k := FirstNonFinite(s); k >= 0 {
			return fmt.Errorf("%w: contribution %d has %v at %d", ErrBadInput, i, s[k], k)
		}
	}
	if lr, ok := r.(LocalRule); ok {
		if err := checkLocal(lr, len(srcs)); err != nil {
			return err
		}
		var s Scratch
		return lr.ReduceLocal(dst, srcs, w, &s)
	}
	p, err := r.Start(srcs, w)
	if err != nil {
		return err
	}
	for st := p.Stats(); st != nil; st = p.Stats() {
		if err := p.Absorb(slices.Clone(st)); err != nil {
			return err
		}
	}
	return p.Finish(dst)
}

// LocalRule is implemented by the local rules (sum, mean, median,
// trimmed mean): any slice of coordinates, down to one chunk, reduces on
// its own and without allocating once s has grown.
type LocalRule interface {
	Rule
	// ReduceLocal sets dst from srcs (each at least len(dst) long).
	ReduceLocal(dst []float32, srcs [][]float32, w []float64, s *Scratch) error
}

// Scratch is reusable memory for ReduceLocal; the zero value is ready.
// Not safe for concurrent use.
type Scratch struct {
	// Backend computes the linear rules' sums (device.Default() when nil).
	Backend device.Backend

	w32  []float32
	col  []float32
	blk  []float32   // sortBlock's rows
	rows [][]float32 // views of blk
}

func (s *Scratch) backend() device.Backend {
	if s.Backend == nil {
		return device.Default()
	}
	return s.Backend
}

func (s *Scratch) weights(n int) []float32 {
	if cap(s.w32) < n {
		s.w32 = make([]float32, n)
	}
	return s.w32[:n]
}

func (s *Scratch) column(n int) []float32 {
	if cap(s.col) < n {
		s.col = make([]float32, n)
	}
	return s.col[:n]
}

// netMax is the most contributions whose columns sortBlock sorts; more
// go through sortSmall one column at a time. A network makes n²/2
// compare-exchanges a column: with AVX-512 (16 columns each) it beats
// insertion sorting up to 32 values and beyond, without only up to 8.
var netMax = 8

func init() {
	if device.MinMaxVectorized() {
		netMax = 32
	}
}

// colBlock is how many coordinates sortBlock sorts at once: n rows of it
// stay in the L1 cache.
const colBlock = 256

// sortBlock copies coordinates [lo, lo+m) of every src into n rows of
// Scratch and sorts each column across the rows, which it returns. It
// runs an odd–even transposition network (n rounds of compare-exchanges
// of neighbouring rows) on whole rows at once, as min and max: no
// branches, where sorting each column on its own mispredicts on about
// every other comparison of real data (BenchmarkReduce/median, 5
// contributions: 4× faster in Go, 28× with AVX-512). n ≤ netMax,
// m ≤ colBlock.
func (s *Scratch) sortBlock(srcs [][]float32, lo, m int) [][]float32 {
	n := len(srcs)
	if cap(s.blk) < n*colBlock {
		s.blk = make([]float32, n*colBlock)
	}
	s.rows = s.rows[:0]
	for i, src := range srcs {
		r := s.blk[i*colBlock : i*colBlock+m]
		copy(r, src[lo:lo+m])
		s.rows = append(s.rows, r)
	}
	for round := range n {
		for i := round % 2; i+1 < n; i += 2 {
			device.MinMax(s.rows[i], s.rows[i+1])
		}
	}
	return s.rows
}

func checkInputs(d int, srcs [][]float32, w []float64) error {
	if len(srcs) == 0 {
		return fmt.Errorf("%w: no contributions", ErrTooFewInputs)
	}
	if len(w) != len(srcs) {
		return fmt.Errorf("%w: %d weights for %d contributions", ErrBadInput, len(w), len(srcs))
	}
	for i, s := range srcs {
		if len(s) != d {
			return fmt.Errorf("%w: contribution %d has length %d, want %d", ErrBadInput, i, len(s), d)
		}
		if !ValidWeight(w[i]) {
			return fmt.Errorf("%w: contribution %d has weight %v", ErrBadInput, i, w[i])
		}
	}
	return nil
}

// ValidWeight reports whether w is a weight a reducer takes: finite and not
// negative.
func ValidWeight(w float64) bool { return w >= 0 && !math.IsInf(w, 1) } // NaN fails w >= 0

func checkLocal(r Rule, n int) error {
	if n < r.MinInputs() {
		return fmt.Errorf("%w: %s needs %d, got %d", ErrTooFewInputs, r, r.MinInputs(), n)
	}
	return nil
}

// FirstNonFinite returns the index of the first NaN or ±Inf in x, or -1.
// A finite x costs one device.AllFinite pass.
func FirstNonFinite(x []float32) int {
	if device.AllFinite(x) {
		return -1
	}
	for i, v := range x {
		if v-v != 0 { // NaN exactly when v is NaN or ±Inf
			return i
		}
	}
	return -1
}

// localPass adapts a local rule to the Pass interface.
type localPass struct {
	r    LocalRule
	srcs [][]float32
	w    []float64
}

func (p *localPass) Stats() []float64 { return nil }
func (p *localPass) Absorb(g []float64) error {
	return fmt.Errorf("%w: local rule takes no statistics", ErrBadInput)
}
func (p *localPass) Finish(dst []float32) error {
	if len(p.srcs) > 0 && len(dst) != len(p.srcs[0]) {
		return fmt.Errorf("%w: dst has length %d, shard %d", ErrBadInput, len(dst), len(p.srcs[0]))
	}
	var s Scratch
	return p.r.ReduceLocal(dst, p.srcs, p.w, &s)
}

func startLocal(r LocalRule, srcs [][]float32, w []float64) (Pass, error) {
	d := 0
	if len(srcs) > 0 {
		d = len(srcs[0])
	}
	if err := checkInputs(d, srcs, w); err != nil {
		return nil, err
	}
	if err := checkLocal(r, len(srcs)); err != nil {
		return nil, err
	}
	return &localPass{r: r, srcs: srcs, w: w}, nil
}

// Sum adds the contributions; weights are ignored.
type Sum struct{}

func (Sum) String() string                                      { return "sum" }
func (Sum) Linear() bool                                        { return true }
func (Sum) Local() bool                                         { return true }
func (Sum) MinInputs() int                                      { return 1 }
func (r Sum) Start(srcs [][]float32, w []float64) (Pass, error) { return startLocal(r, srcs, w) }

func (Sum) ReduceLocal(dst []float32, srcs [][]float32, _ []float64, s *Scratch) error {
	ws := s.weights(len(srcs))
	for i := range ws {
		ws[i] = 1
	}
	s.backend().WeightedSum(dst, srcs, ws)
	return nil
}

// Mean is the weighted mean Σ wᵢxᵢ / Σ wᵢ, with weights the sample counts
// behind each contribution (FedAvg). Weights must not all be zero.
type Mean struct{}

func (Mean) String() string                                      { return "mean" }
func (Mean) Linear() bool                                        { return true }
func (Mean) Local() bool                                         { return true }
func (Mean) MinInputs() int                                      { return 1 }
func (r Mean) Start(srcs [][]float32, w []float64) (Pass, error) { return startLocal(r, srcs, w) }

func (Mean) ReduceLocal(dst []float32, srcs [][]float32, w []float64, s *Scratch) error {
	var total float64
	for _, v := range w {
		total += v
	}
	if total <= 0 || math.IsInf(total, 0) {
		return fmt.Errorf("%w: Σw = %v", ErrZeroWeight, total)
	}
	ws := s.weights(len(srcs))
	for i := range ws {
		ws[i] = float32(w[i] / total)
	}
	s.backend().WeightedSum(dst, srcs, ws)
	return nil
}

// Median is the coordinate-wise median (the mean of the two middle values
// for an even count). Weights are ignored: a liar can claim any weight.
type Median struct{}

func (Median) String() string                                      { return "median" }
func (Median) Linear() bool                                        { return false }
func (Median) Local() bool                                         { return true }
func (Median) MinInputs() int                                      { return 1 }
func (r Median) Start(srcs [][]float32, w []float64) (Pass, error) { return startLocal(r, srcs, w) }

func (Median) ReduceLocal(dst []float32, srcs [][]float32, _ []float64, s *Scratch) error {
	n := len(srcs)
	if n <= netMax {
		for lo := 0; lo < len(dst); lo += colBlock {
			out := dst[lo:min(lo+colBlock, len(dst))]
			rows := s.sortBlock(srcs, lo, len(out))
			if n%2 == 1 {
				copy(out, rows[n/2])
				continue
			}
			a, b := rows[n/2-1], rows[n/2]
			for k := range out {
				out[k] = float32((float64(a[k]) + float64(b[k])) / 2) // medianSorted's
			}
		}
		return nil
	}
	col := s.column(n)
	for k := range dst {
		for i, src := range srcs {
			col[i] = src[k]
		}
		dst[k] = medianSorted(sortSmall(col))
	}
	return nil
}

// medianSorted returns the median of sorted, non-empty x.
func medianSorted(x []float32) float32 {
	n := len(x)
	if n%2 == 1 {
		return x[n/2]
	}
	return float32((float64(x[n/2-1]) + float64(x[n/2])) / 2)
}

// sortSmall sorts x in place (insertion sort for the usual few peers).
func sortSmall(x []float32) []float32 {
	if len(x) > 24 {
		slices.Sort(x)
		return x
	}
	for i := 1; i < len(x); i++ {
		v := x[i]
		j := i - 1
		for ; j >= 0 && x[j] > v; j-- {
			x[j+1] = x[j]
		}
		x[j+1] = v
	}
	return x
}

// Trimmed is the coordinate-wise β-trimmed mean: for each coordinate drop
// the ⌊β·n⌋ smallest and ⌊β·n⌋ largest values and average the rest.
// 0 ≤ β < 0.5. Weights are ignored.
type Trimmed struct {
	Beta float64
}

func (r Trimmed) String() string { return "trimmed:" + fmtFloat(r.Beta) }
func (Trimmed) Linear() bool     { return false }
func (Trimmed) Local() bool      { return true }
func (Trimmed) MinInputs() int   { return 1 }
func (r Trimmed) Start(srcs [][]float32, w []float64) (Pass, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return startLocal(r, srcs, w)
}

// Validate reports parameters the rule cannot run with, wrapping ErrBadSpec.
func (r Trimmed) Validate() error {
	if !(r.Beta >= 0 && r.Beta < 0.5) {
		return fmt.Errorf("%w: trimmed beta %v not in [0, 0.5)", ErrBadSpec, r.Beta)
	}
	return nil
}

// trimCount is ⌊β·n⌋, robust to β·n landing a hair under an integer.
func trimCount(beta float64, n int) int { return int(math.Floor(beta*float64(n) + 1e-9)) }

func (r Trimmed) ReduceLocal(dst []float32, srcs [][]float32, _ []float64, s *Scratch) error {
	if err := r.Validate(); err != nil {
		return err
	}
	n := len(srcs)
	k := trimCount(r.Beta, n)
	inv := 1 / float64(n-2*k)
	if n <= netMax {
		for lo := 0; lo < len(dst); lo += colBlock {
			out := dst[lo:min(lo+colBlock, len(dst))]
			rows := s.sortBlock(srcs, lo, len(out))[k : n-k]
			for c := range out {
				var acc float64
				for _, row := range rows {
					acc += float64(row[c])
				}
				out[c] = float32(acc * inv)
			}
		}
		return nil
	}
	col := s.column(n)
	for c := range dst {
		for i, src := range srcs {
			col[i] = src[c]
		}
		sortSmall(col)
		var acc float64
		for _, v := range col[k : n-k] {
			acc += float64(v)
		}
		dst[c] = float32(acc * inv)
	}
	return nil
}

// Krum is Multi-Krum (Blanchard et al., 2017) tolerating F Byzantine
// contributions: each contribution is scored by the sum of squared distances
// to its n−F−2 nearest others, and the M best-scored are averaged (M = 1 is
// Krum). It needs n ≥ 2F+3; M is clamped to n−F, since failures shrink n,
// and a driver runs Fit(r, n) on a group shrunk below 2F+3. Weights are
// ignored.
type Krum struct {
	F, M int
}

// Fit returns the rule to run on a group of n contributions: r, or for a
// Krum whose F needs more than n (n < 2F+3, n ≥ 3) the Krum of the largest
// F that n allows. aggregate fits every group: groups shrink when members
// fail or are excluded for sending bad values, and at 2F+3 members (5 for
// f=1) a single exclusion — one liar sending NaN — would otherwise fail
// every round for good. The smaller F still drops the contributions
// farthest from the rest. Fit depends on n alone, so every member of a
// group fits alike.
func Fit(r Rule, n int) Rule {
	k, ok := r.(Krum)
	if !ok || n >= k.MinInputs() || n < 3 {
		return r
	}
	k.F = (n - 3) / 2
	return k
}

func (r Krum) String() string {
	if r.M == 1 {
		return fmt.Sprintf("krum:f=%d", r.F)
	}
	return fmt.Sprintf("krum:f=%d,m=%d", r.F, r.M)
}
func (Krum) Linear() bool     { return false }
func (Krum) Local() bool      { return false }
func (r Krum) MinInputs() int { return 2*r.F + 3 }

// Validate reports parameters the rule cannot run with, wrapping ErrBadSpec.
func (r Krum) Validate() error {
	if r.F < 0 || r.M < 1 {
		return fmt.Errorf("%w: krum needs f ≥ 0 and m ≥ 1, got f=%d m=%d", ErrBadSpec, r.F, r.M)
	}
	return nil
}

// Start implements Rule.
func (r Krum) Start(srcs [][]float32, w []float64) (Pass, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	d := 0
	if len(srcs) > 0 {
		d = len(srcs[0])
	}
	if err := checkInputs(d, srcs, w); err != nil {
		return nil, err
	}
	n := len(srcs)
	if n < r.MinInputs() {
		return nil, fmt.Errorf("%w: %s needs %d, got %d", ErrTooFewInputs, r, r.MinInputs(), n)
	}
	return &krumPass{r: r, srcs: srcs, stats: make([]float64, n*(n-1)/2)}, nil
}

type krumPass struct {
	r        Krum
	srcs     [][]float32
	stats    []float64 // squared distances of pairs i<j, row-major upper triangle
	selected []int     // set by Absorb
	done     bool
}

func (p *krumPass) Stats() []float64 {
	if p.done {
		return nil
	}
	n := len(p.srcs)
	k := 0
	for i := 0; i < n; i++ {
		for j := i + 1; j < n; j++ {
			p.stats[k] = sqDist(p.srcs[i], p.srcs[j])
			k++
		}
	}
	return p.stats
}

func sqDist(a, b []float32) float64 {
	b = b[:len(a)]
	var s float64
	for i, v := range a {
		d := float64(v) - float64(b[i])
		s += d * d
	}
	return s
}

func (p *krumPass) Absorb(global []float64) error {
	if p.done {
		return fmt.Errorf("%w: krum absorbs once", ErrBadInput)
	}
	if len(global) != len(p.stats) {
		return fmt.Errorf("%w: krum got %d statistics, want %d", ErrBadInput, len(global), len(p.stats))
	}
	p.selected = krumSelect(len(p.srcs), p.r.F, p.r.M, global)
	p.done = true
	return nil
}

// krumSelect returns the indices of the m best Multi-Krum scores (ties go to
// the lower index) from the packed upper-triangle distances.
func krumSelect(n, f, m int, tri []float64) []int {
	dist := func(i, j int) float64 {
		if i > j {
			i, j = j, i
		}
		// Row i of the upper triangle starts at i*n - i*(i+1)/2.
		return tri[i*n-i*(i+1)/2+(j-i-1)]
	}
	near := n - f - 2
	scores := make([]float64, n)
	row := make([]float64, 0, n-1)
	for i := range n {
		row = row[:0]
		for j := range n {
			if j != i {
				row = append(row, dist(i, j))
			}
		}
		slices.Sort(row)
		var s float64
		for _, v := range row[:near] {
			s += v
		}
		scores[i] = s
	}
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		switch {
		case scores[a] < scores[b]:
			return -1
		case scores[a] > scores[b]:
			return 1
		}
		return 0
	})
	m = min(m, n-f)
	sel := idx[:m]
	slices.Sort(sel)
	return sel
}

func (p *krumPass) Finish(dst []float32) error {
	if !p.done {
		return fmt.Errorf("%w: krum finished before its statistics", ErrBadInput)
	}
	if len(p.srcs) > 0 && len(dst) != len(p.srcs[0]) {
		return fmt.Errorf("%w: dst has length %d, shard %d", ErrBadInput, len(dst), len(p.srcs[0]))
	}
	inv := 1 / float64(len(p.selected))
	for k := range dst {
		var acc float64
		for _, i := range p.selected {
			acc += float64(p.srcs[i][k])
		}
		dst[k] = float32(acc * inv)
	}
	return nil
}

// CClipStart is the point centered clipping starts its iterations from.
type CClipStart uint8

const (
	// StartMedian starts from the coordinate-wise median (the default): a
	// robust centre that needs no state from earlier rounds.
	StartMedian CClipStart = iota
	// StartZero starts from the zero vector.
	StartZero
)

// CClip is centered clipping (Karimireddy, He & Jaggi, 2021): starting from
// v₀, Iters times set v ← v + (1/n)·Σᵢ (xᵢ−v)·min(1, Tau/‖xᵢ−v‖). Weights are
// ignored.
type CClip struct {
	Tau   float64
	Iters int
	From  CClipStart // the starting point v₀
}

func (r CClip) String() string {
	s := "cclip:tau=" + fmtFloat(r.Tau) + fmt.Sprintf(",iters=%d", r.Iters)
	if r.From == StartZero {
		s += ",start=zero"
	}
	return s
}
func (CClip) Linear() bool   { return false }
func (CClip) Local() bool    { return false }
func (CClip) MinInputs() int { return 1 }

// Validate reports parameters the rule cannot run with, wrapping ErrBadSpec.
func (r CClip) Validate() error {
	if !(r.Tau > 0) || math.IsInf(r.Tau, 1) || r.Iters < 1 || r.Iters > maxCClipIters || r.From > StartZero {
		return fmt.Errorf("%w: cclip needs 0 < tau < Inf, 1 ≤ iters ≤ %d: %+v", ErrBadSpec, maxCClipIters, r)
	}
	return nil
}

const maxCClipIters = 100

// Start implements Rule.
func (r CClip) Start(srcs [][]float32, w []float64) (Pass, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	d := 0
	if len(srcs) > 0 {
		d = len(srcs[0])
	}
	if err := checkInputs(d, srcs, w); err != nil {
		return nil, err
	}
	v := make([]float64, d)
	if r.From == StartMedian {
		col := make([]float32, len(srcs))
		for k := range v {
			for i, s := range srcs {
				col[i] = s[k]
			}
			v[k] = float64(medianSorted(sortSmall(col)))
		}
	}
	return &cclipPass{r: r, srcs: srcs, v: v, stats: make([]float64, len(srcs)), scale: make([]float64, len(srcs))}, nil
}

type cclipPass struct {
	r     CClip
	srcs  [][]float32
	v     []float64
	stats []float64
	scale []float64
	iter  int
}

func (p *cclipPass) Stats() []float64 {
	if p.iter >= p.r.Iters {
		return nil
	}
	for i, s := range p.srcs {
		var acc float64
		for k, x := range s {
			d := float64(x) - p.v[k]
			acc += d * d
		}
		p.stats[i] = acc
	}
	return p.stats
}

func (p *cclipPass) Absorb(global []float64) error {
	if p.iter >= p.r.Iters {
		return fmt.Errorf("%w: cclip absorbed more than %d times", ErrBadInput, p.r.Iters)
	}
	if len(global) != len(p.srcs) {
		return fmt.Errorf("%w: cclip got %d statistics, want %d", ErrBadInput, len(global), len(p.srcs))
	}
	for i, g := range global {
		p.scale[i] = clipScale(p.r.Tau, g)
	}
	inv := 1 / float64(len(p.srcs))
	for k := range p.v {
		vk := p.v[k]
		var acc float64
		for i, s := range p.srcs {
			acc += (float64(s[k]) - vk) * p.scale[i]
		}
		p.v[k] = vk + acc*inv
	}
	p.iter++
	return nil
}

// clipScale is min(1, tau/√sq) (1 when sq is 0).
func clipScale(tau, sq float64) float64 {
	nrm := math.Sqrt(sq)
	if nrm <= tau {
		return 1
	}
	return tau / nrm
}

func (p *cclipPass) Finish(dst []float32) error {
	if p.iter < p.r.Iters {
		return fmt.Errorf("%w: cclip finished after %d of %d iterations", ErrBadInput, p.iter, p.r.Iters)
	}
	if len(dst) != len(p.v) {
		return fmt.Errorf("%w: dst has length %d, shard %d", ErrBadInput, len(dst), len(p.v))
	}
	for k, v := range p.v {
		dst[k] = float32(v)
	}
	return nil
}
