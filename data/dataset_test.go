package data

import (
	"errors"
	"reflect"
	"testing"
)

// toy is a Dataset that is not a Set: sample i is (i, 2i, 3i) with
// targets (i, i+1) mod classes, so any batch can be checked by formula.
type toy struct{ n, classes int }

func (d toy) Len() int           { return d.n }
func (d toy) InputShape() []int  { return []int{3} }
func (d toy) Targets() int       { return 2 }
func (d toy) NumClasses() int    { return d.classes }
func (d toy) target(i int) int32 { return int32(i % d.classes) }
func (d toy) Batch(idx []int, x []float32, y []int32) {
	for k, i := range idx {
		x[3*k], x[3*k+1], x[3*k+2] = float32(i), float32(2*i), float32(3*i)
		y[2*k], y[2*k+1] = d.target(i), d.target(i+1)
	}
}

// toyLabeled adds one label per sample: i mod classes.
type toyLabeled struct {
	toy
	labels []int32
}

func newToyLabeled(n, classes int) toyLabeled {
	l := make([]int32, n)
	for i := range l {
		l[i] = int32((i * 7) % classes)
	}
	return toyLabeled{toy{n, classes}, l}
}

func (d toyLabeled) Labels() []int32 { return d.labels }

// batchOf returns the samples of ds at idx, each sample's first input.
func batchOf(ds Dataset, idx []int) (first []float32, y []int32) {
	dim := InputSize(ds)
	x, y := make([]float32, len(idx)*dim), make([]int32, len(idx)*ds.Targets())
	ds.Batch(idx, x, y)
	for k := range idx {
		first = append(first, x[k*dim])
	}
	return first, y
}

func TestSubsetAndHead(t *testing.T) {
	base := newToyLabeled(500, 13)
	idx := make([]int, 200) // more than one chunk of the view's index buffer
	for k := range idx {
		idx[k] = (k * 37) % 500
	}
	sub := Subset(base, idx)
	if sub.Len() != 200 || sub.Targets() != 2 || sub.NumClasses() != 13 || InputSize(sub) != 3 {
		t.Fatalf("subset: len %d targets %d classes %d size %d", sub.Len(), sub.Targets(), sub.NumClasses(), InputSize(sub))
	}
	all := make([]int, 200)
	for k := range all {
		all[k] = 199 - k
	}
	first, y := batchOf(sub, all)
	for k, i := range all {
		if first[k] != float32(idx[i]) || y[2*k] != base.target(idx[i]) || y[2*k+1] != base.target(idx[i]+1) {
			t.Fatalf("subset sample %d: x %v y %v, want base sample %d", i, first[k], y[2*k:2*k+2], idx[i])
		}
	}
	l, ok := sub.(Labeled)
	if !ok {
		t.Fatal("a subset of a Labeled dataset is not Labeled")
	}
	for k, i := range idx {
		if l.Labels()[k] != base.labels[i] {
			t.Fatalf("subset label %d", k)
		}
	}
	if _, ok := Subset(base.toy, idx).(Labeled); ok {
		t.Fatal("a subset of an unlabeled dataset claims labels")
	}

	head := Head(sub, 10)
	first, _ = batchOf(head, []int{9, 0})
	if head.Len() != 10 || first[0] != float32(idx[9]) || first[1] != float32(idx[0]) {
		t.Fatalf("head of subset: len %d first %v", head.Len(), first)
	}
	if hl := head.(Labeled).Labels(); !reflect.DeepEqual(hl, l.Labels()[:10]) {
		t.Fatalf("head labels %v", hl)
	}
	if _, ok := Head(base, 0).(toyLabeled); !ok {
		t.Fatal("Head(ds, 0) must return ds")
	}
	if _, ok := Head(base, 500).(toyLabeled); !ok {
		t.Fatal("Head(ds, Len) must return ds")
	}
}

func TestSpread(t *testing.T) {
	base := toy{n: 10, classes: 7}
	sp := Spread(base, 4)
	first, _ := batchOf(sp, []int{0, 1, 2, 3})
	if sp.Len() != 4 || !reflect.DeepEqual(first, []float32{0, 2, 5, 7}) {
		t.Fatalf("Spread(10 samples, 4): len %d, samples %v, want 0 2 5 7", sp.Len(), first)
	}
	for _, n := range []int{0, -1, 10, 11} {
		if _, ok := Spread(base, n).(toy); !ok {
			t.Errorf("Spread(ds, %d) must return ds", n)
		}
	}
	if _, ok := Spread(newToyLabeled(10, 3), 3).(Labeled); !ok {
		t.Error("a spread of a Labeled dataset is not Labeled")
	}
}

func TestViewPanics(t *testing.T) {
	mustPanic := func(name string, f func()) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Errorf("%s: no panic", name)
			}
		}()
		f()
	}
	base := toy{10, 3}
	mustPanic("subset index", func() { Subset(base, []int{10}) })
	mustPanic("batch index", func() { batchOf(Head(base, 5), []int{5}) })
}

// TestSetAsDataset: a Set's Dataset view agrees with its fields, and
// iterating a Subset view gives what iterating the copied Set.Subset does.
func TestSetAsDataset(t *testing.T) {
	s := &Set{X: make([]float32, 50*4), Y: make([]int32, 50), Dim: 4, Classes: 5, Shape: [3]int{2, 2, 1}}
	for i := range s.Y {
		s.Y[i] = int32(i % 5)
		for j := 0; j < 4; j++ {
			s.X[4*i+j] = float32(10*i + j)
		}
	}
	if !reflect.DeepEqual(s.InputShape(), []int{2, 2, 1}) || s.Targets() != 1 || s.NumClasses() != 5 {
		t.Fatalf("shape %v targets %d classes %d", s.InputShape(), s.Targets(), s.NumClasses())
	}
	if got := (&Set{Dim: 7}).InputShape(); !reflect.DeepEqual(got, []int{7}) {
		t.Fatalf("shape without Shape: %v", got)
	}
	idx := []int{3, 9, 27, 1, 44, 0, 12, 30, 31}
	a, b := NewIterator(s.Subset(idx), 4, 5), NewIterator(Subset(s, idx), 4, 5)
	for e := 0; e < 2; e++ {
		for a.Next() {
			if !b.Next() {
				t.Fatal("view ends early")
			}
			xa, ya := a.Batch()
			xb, yb := b.Batch()
			if !reflect.DeepEqual(xa, xb) || !reflect.DeepEqual(ya, yb) {
				t.Fatalf("copy and view disagree: %v %v / %v %v", xa, ya, xb, yb)
			}
		}
		if b.Next() {
			t.Fatal("view runs on")
		}
	}
}

func TestIteratorManyTargets(t *testing.T) {
	it := NewIterator(toy{7, 100}, 3, 1)
	seen := 0
	for it.Next() {
		x, y := it.Batch()
		if len(y) != 2*len(x)/3 {
			t.Fatalf("%d inputs, %d targets", len(x), len(y))
		}
		for k := 0; k < len(x)/3; k++ {
			if i := int(x[3*k]); y[2*k] != int32(i) || y[2*k+1] != int32(i+1) {
				t.Fatalf("sample %d targets %v", i, y[2*k:2*k+2])
			}
		}
		seen += len(x) / 3
	}
	if seen != 7 {
		t.Fatalf("epoch saw %d samples", seen)
	}
}

func TestPartitionDataset(t *testing.T) {
	ds := newToyLabeled(3000, 13)
	for _, spec := range []string{"iid", "shards", "dirichlet:0.3"} {
		parts, err := Partition(ds, 10, spec, 4)
		if err != nil {
			t.Fatalf("%s: %v", spec, err)
		}
		checkCover(t, parts, ds.Len())
		again, _ := Partition(ds, 10, spec, 4)
		if !reflect.DeepEqual(parts, again) {
			t.Fatalf("%s: not deterministic", spec)
		}
		if spec == "shards" {
			// 20 shards of 150 over 13 classes of about 231: at most
			// two classes a shard, four a part.
			for _, p := range parts {
				classes := 0
				for _, c := range LabelCounts(ds.labels, p, 13) {
					if c > 0 {
						classes++
					}
				}
				if classes > 4 {
					t.Fatalf("shards: a part holds %d classes", classes)
				}
			}
		}
	}
	// Partitioning a view partitions its own indices.
	sub := Subset(ds, []int{5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16})
	parts, err := Partition(sub, 3, "shards", 1)
	if err != nil {
		t.Fatal(err)
	}
	checkCover(t, parts, 12)

	unl := toy{100, 4}
	if parts, err := Partition(unl, 4, "iid", 1); err != nil || len(parts) != 4 {
		t.Fatalf("iid on an unlabeled dataset: %v", err)
	}
	for _, spec := range []string{"shards", "dirichlet:0.5"} {
		if _, err := Partition(unl, 4, spec, 1); !errors.Is(err, ErrUnlabeled) {
			t.Fatalf("%s on an unlabeled dataset: err = %v, want ErrUnlabeled", spec, err)
		}
	}
	if _, err := Partition(ds, 4, "round-robin", 1); !errors.Is(err, ErrPartition) {
		t.Fatalf("unknown spec: err = %v", err)
	}
}
