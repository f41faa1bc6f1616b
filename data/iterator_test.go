package data

import (
	"fmt"
	"hash/fnv"
	"reflect"
	"testing"
)

// TestIteratorOrderPinned pins the batch order the Iterator gave a Set
// before it learnt to walk any Dataset: the same seed must keep giving the
// same batches, or runs and checkpoints made before would not replay.
func TestIteratorOrderPinned(t *testing.T) {
	s := &Set{X: make([]float32, 10*2), Y: make([]int32, 10), Dim: 2, Classes: 10}
	for i := 0; i < 10; i++ {
		s.X[2*i], s.X[2*i+1], s.Y[i] = float32(i), float32(-i), int32(i)
	}
	it := NewIterator(s, 4, 9)
	want := [][]int32{{8, 2, 0, 9, 6, 7, 1, 3, 4, 5}, {3, 0, 2, 4, 7, 1, 5, 6, 8, 9}}
	for e, w := range want {
		var got []int32
		for it.Next() {
			_, y := it.Batch()
			got = append(got, y...)
		}
		if !reflect.DeepEqual(got, w) {
			t.Fatalf("epoch %d: order %v, want %v", e, got, w)
		}
	}

	for _, c := range []struct {
		drop    bool
		batches int
		hash    uint64
	}{{false, 96, 0x47122e6d9f20fadb}, {true, 93, 0x13135b75e39d5937}} {
		const n = 1000
		big := &Set{X: make([]float32, n*3), Y: make([]int32, n), Dim: 3, Classes: n}
		for i := 0; i < n; i++ {
			big.Y[i], big.X[3*i] = int32(i), float32(i)
		}
		it := NewIterator(big, 32, 42)
		it.DropLast = c.drop
		h := fnv.New64a()
		batches := 0
		for e := 0; e < 3; e++ {
			for it.Next() {
				x, y := it.Batch()
				batches++
				for k := range y {
					fmt.Fprintf(h, "%d,%g;", y[k], x[3*k])
				}
				fmt.Fprint(h, "|")
			}
		}
		if batches != c.batches || h.Sum64() != c.hash {
			t.Errorf("DropLast=%v: %d batches, order hash %#x; want %d, %#x", c.drop, batches, h.Sum64(), c.batches, c.hash)
		}
	}
}
