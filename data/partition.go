package data

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
)

// ErrPartition reports partition parameters that cannot be satisfied.
var ErrPartition = errors.New("data: cannot partition")

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0x5eed_da7a)) }

// IID splits the indices [0, n) uniformly at random into the given number
// of parts whose sizes differ by at most one.
func IID(n, parts int, seed uint64) ([][]int, error) {
	if parts <= 0 || parts > n {
		return nil, fmt.Errorf("%w: %d samples into %d parts", ErrPartition, n, parts)
	}
	perm := newRand(seed).Perm(n)
	out := make([][]int, parts)
	for p := range out {
		lo, hi := p*n/parts, (p+1)*n/parts
		out[p] = append([]int(nil), perm[lo:hi]...)
		sort.Ints(out[p])
	}
	return out, nil
}

// Shards is McMahan et al.'s pathological non-IID split: sort the samples
// by label, cut them into parts·perPart equal shards, and give each part
// perPart shards chosen at random. With 60000 MNIST samples, 100 parts and
// 2 shards each this is the paper's 200 shards of 300.
func Shards(labels []int32, parts, perPart int, seed uint64) ([][]int, error) {
	n := len(labels)
	shards := parts * perPart
	if parts <= 0 || perPart <= 0 || shards > n {
		return nil, fmt.Errorf("%w: %d samples into %d parts of %d shards", ErrPartition, n, parts, perPart)
	}
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return labels[order[a]] < labels[order[b]] })
	perm := newRand(seed).Perm(shards)
	out := make([][]int, parts)
	for p := range out {
		for s := 0; s < perPart; s++ {
			k := perm[p*perPart+s]
			out[p] = append(out[p], order[k*n/shards:(k+1)*n/shards]...)
		}
		sort.Ints(out[p])
	}
	return out, nil
}

// Dirichlet splits each class between the parts in proportions drawn from
// Dirichlet(α): small α gives each part few classes, large α approaches IID.
// A part that already holds n/parts samples gets no more of the next classes
// (the usual balancing of Hsu et al. 2019), and the draw is repeated until
// every part holds at least minSize samples.
func Dirichlet(labels []int32, parts int, alpha float64, minSize int, seed uint64) ([][]int, error) {
	n := len(labels)
	if parts <= 0 || !(alpha > 0) || math.IsInf(alpha, 0) || minSize < 0 || parts*minSize > n {
		return nil, fmt.Errorf("%w: %d samples into %d parts with α=%v and at least %d each", ErrPartition, n, parts, alpha, minSize)
	}
	byClass := map[int32][]int{}
	var classes []int32
	for i, l := range labels {
		if _, ok := byClass[l]; !ok {
			classes = append(classes, l)
		}
		byClass[l] = append(byClass[l], i)
	}
	sort.Slice(classes, func(a, b int) bool { return classes[a] < classes[b] })
	r := newRand(seed)
	const tries = 1000
	for try := 0; try < tries; try++ {
		out := make([][]int, parts)
		p := make([]float64, parts)
		for _, c := range classes {
			idx := append([]int(nil), byClass[c]...)
			r.Shuffle(len(idx), func(a, b int) { idx[a], idx[b] = idx[b], idx[a] })
			var sum float64
			for j := range p {
				p[j] = gamma(r, alpha)
				if len(out[j]) >= n/parts {
					p[j] = 0
				}
				sum += p[j]
			}
			if sum == 0 {
				for j := range p {
					p[j] = 1
				}
				sum = float64(parts)
			}
			start, acc := 0, 0.0
			for j := range p {
				acc += p[j] / sum
				end := int(math.Round(acc * float64(len(idx))))
				if j == parts-1 {
					end = len(idx)
				}
				end = max(end, start)
				out[j] = append(out[j], idx[start:end]...)
				start = end
			}
		}
		ok := true
		for _, o := range out {
			if len(o) < minSize {
				ok = false
				break
			}
		}
		if ok {
			for _, o := range out {
				sort.Ints(o)
			}
			return out, nil
		}
	}
	return nil, fmt.Errorf("%w: no Dirichlet(α=%v) draw in %d tries gave every one of %d parts %d samples; raise α or lower the minimum", ErrPartition, alpha, tries, parts, minSize)
}

// gamma draws from Gamma(a, 1) (Marsaglia and Tsang 2000).
func gamma(r *rand.Rand, a float64) float64 {
	if a < 1 {
		// Boost: Gamma(a) = Gamma(a+1)·U^(1/a).
		return gamma(r, a+1) * math.Pow(1-r.Float64(), 1/a)
	}
	d := a - 1.0/3
	c := 1 / math.Sqrt(9*d)
	for {
		x := r.NormFloat64()
		v := 1 + c*x
		if v <= 0 {
			continue
		}
		v = v * v * v
		u := 1 - r.Float64()
		if math.Log(u) < 0.5*x*x+d-d*v+d*math.Log(v) {
			return d * v
		}
	}
}

// LabelCounts returns how many samples of each class the indices hold.
func LabelCounts(labels []int32, idx []int, classes int) []int {
	c := make([]int, classes)
	for _, i := range idx {
		c[labels[i]]++
	}
	return c
}

// Partition splits ds between parts peers as spec says: "iid", "shards"
// (McMahan et al.'s pathological non-IID split, two label shards each) or
// "dirichlet:α" (label proportions drawn from Dir(α), at least 10 samples
// a part). The label-based specs need a Labeled dataset and fail with
// ErrUnlabeled otherwise.
func Partition(ds Dataset, parts int, spec string, seed uint64) ([][]int, error) {
	if spec == "iid" {
		return IID(ds.Len(), parts, seed)
	}
	var alpha float64
	if spec != "shards" {
		if _, err := fmt.Sscanf(spec, "dirichlet:%g", &alpha); err != nil {
			return nil, fmt.Errorf("%w: unknown partition %q (want iid, shards or dirichlet:α)", ErrPartition, spec)
		}
	}
	l, ok := ds.(Labeled)
	if !ok {
		return nil, fmt.Errorf("%w: partition %q needs labels and %T has none; use iid", ErrUnlabeled, spec, ds)
	}
	if spec == "shards" {
		return Shards(l.Labels(), parts, 2, seed)
	}
	return Dirichlet(l.Labels(), parts, alpha, 10, seed)
}
