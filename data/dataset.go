package data

import (
	"errors"
	"fmt"
)

// Errors about datasets in general.
var (
	// ErrUnlabeled reports a label-based operation (label shards,
	// Dirichlet) asked of a Dataset that does not implement Labeled.
	ErrUnlabeled = errors.New("data: dataset has no class labels")
	// ErrConfig reports parameters a loader or constructor cannot follow.
	ErrConfig = errors.New("data: invalid parameters")
)

// Dataset is what the training loop iterates: Len samples, each an input of
// InputShape and Targets integer targets. Implementations are read-only
// after construction, so their methods are safe for concurrent use.
type Dataset interface {
	// Len returns the number of samples.
	Len() int
	// InputShape returns one sample's input shape, outermost first; its
	// product is the number of float32 values per sample. The caller must
	// not modify the slice.
	InputShape() []int
	// Targets returns the number of targets per sample: 1 for
	// classification, the sequence length for next-token prediction.
	Targets() int
	// NumClasses returns the number of classes (the vocabulary size for
	// token data); every target lies in [0, NumClasses).
	NumClasses() int
	// Batch writes the samples at idx into x (len(idx)·InputSize values)
	// and y (len(idx)·Targets values), sample by sample. Integer tokens
	// are written to x as exact float32 values. It panics if an index is
	// out of range or x or y is short.
	Batch(idx []int, x []float32, y []int32)
}

// Labeled is a Dataset with one class label per sample, which the
// label-based partitioners need.
type Labeled interface {
	Dataset
	// Labels returns the label of every sample, in [0, NumClasses). The
	// slice is owned by the dataset and must not be modified.
	Labels() []int32
}

var (
	_ Labeled = (*Set)(nil)
	_ Labeled = (*labeledView)(nil)
	_ Dataset = (*view)(nil)
)

// InputSize returns the number of float32 values in one sample of ds.
func InputSize(ds Dataset) int {
	n := 1
	for _, d := range ds.InputShape() {
		n *= d
	}
	return n
}

// InputShape returns the per-sample shape: Dims when set, else Shape
// (H, W, C) when it accounts for Dim values, else [Dim].
func (s *Set) InputShape() []int {
	switch {
	case s.Dims != nil:
		return s.Dims
	case s.Shape[0]*s.Shape[1]*s.Shape[2] == s.Dim && s.Dim > 0:
		return s.Shape[:]
	default:
		return []int{s.Dim}
	}
}

// Targets returns 1: a Set holds one label per sample.
func (s *Set) Targets() int { return 1 }

// NumClasses returns s.Classes.
func (s *Set) NumClasses() int { return s.Classes }

// Labels returns s.Y.
func (s *Set) Labels() []int32 { return s.Y }

// Batch copies the samples at idx into x and their labels into y.
func (s *Set) Batch(idx []int, x []float32, y []int32) {
	for k, i := range idx {
		copy(x[k*s.Dim:(k+1)*s.Dim], s.Sample(i))
		y[k] = s.Y[i]
	}
}

// Subset returns a view of the samples of ds at idx, in that order; it
// copies idx but no sample. The view is Labeled when ds is. It panics if
// an index is out of range.
func Subset(ds Dataset, idx []int) Dataset {
	n := ds.Len()
	for _, i := range idx {
		if i < 0 || i >= n {
			panic(fmt.Sprintf("data: Subset index %d out of range [0, %d)", i, n))
		}
	}
	v := &view{Dataset: ds, idx: append([]int(nil), idx...), n: len(idx)}
	l, ok := ds.(Labeled)
	if !ok {
		return v
	}
	labels, all := make([]int32, len(idx)), l.Labels()
	for k, i := range idx {
		labels[k] = all[i]
	}
	return &labeledView{view: v, labels: labels}
}

// Head returns a view of the first n samples of ds, or ds itself when
// n ≤ 0 or n ≥ ds.Len(). The view is Labeled when ds is.
func Head(ds Dataset, n int) Dataset {
	if n <= 0 || n >= ds.Len() {
		return ds
	}
	v := &view{Dataset: ds, n: n}
	if l, ok := ds.(Labeled); ok {
		return &labeledView{view: v, labels: l.Labels()[:n]}
	}
	return v
}

// Spread returns a view of n samples of ds evenly spaced over it (sample
// ⌊k·Len/n⌋ for k < n), or ds itself when n ≤ 0 or n ≥ ds.Len(): a fixed
// evaluation subset that samples the whole dataset, where Head would take
// its first documents only. The view is Labeled when ds is.
func Spread(ds Dataset, n int) Dataset {
	total := ds.Len()
	if n <= 0 || n >= total {
		return ds
	}
	idx := make([]int, n)
	for k := range idx {
		idx[k] = int(int64(k) * int64(total) / int64(n))
	}
	return Subset(ds, idx)
}

// view is a Subset (idx set) or a Head (idx nil: the first n samples) of
// another Dataset.
type view struct {
	Dataset
	idx []int
	n   int
}

func (v *view) Len() int { return v.n }

func (v *view) Batch(idx []int, x []float32, y []int32) {
	for _, i := range idx {
		if i < 0 || i >= v.n {
			panic(fmt.Sprintf("data: index %d out of range [0, %d)", i, v.n))
		}
	}
	if v.idx == nil {
		v.Dataset.Batch(idx, x, y)
		return
	}
	// Map the indices in chunks through a stack buffer: no allocation and
	// no shared scratch, so the view stays safe for concurrent use.
	var buf [64]int
	dx, dy := InputSize(v), v.Targets()
	for len(idx) > 0 {
		m := min(len(idx), len(buf))
		for k, i := range idx[:m] {
			buf[k] = v.idx[i]
		}
		v.Dataset.Batch(buf[:m], x[:m*dx], y[:m*dy])
		idx, x, y = idx[m:], x[m*dx:], y[m*dy:]
	}
}

type labeledView struct {
	*view
	labels []int32
}

func (v *labeledView) Labels() []int32 { return v.labels }
