package aggregate

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/starling-ml/starling/peerid"
)

// TestPartitionShape: every member in exactly one group, the groups' sizes
// within one of each other and at most size, ⌈n/size⌉ of them.
func TestPartitionShape(t *testing.T) {
	for _, tc := range []struct{ n, size int }{
		{1, 16}, {16, 16}, {17, 16}, {31, 16}, {32, 16}, {33, 16}, {255, 16}, {256, 16}, {1000, 16}, {1024, 16},
		{7, 1}, {10, 3}, {100, 7}, {5, 0}, {5, -1},
	} {
		t.Run(fmt.Sprintf("n=%d,size=%d", tc.n, tc.size), func(t *testing.T) {
			ps := peers(tc.n)
			for round := range uint64(5) {
				gs := Partition(9, round, ps, tc.size)
				wantK := 1
				if tc.size >= 1 {
					wantK = (tc.n + tc.size - 1) / tc.size
				}
				if len(gs) != wantK {
					t.Fatalf("round %d: %d groups, want %d", round, len(gs), wantK)
				}
				seen := map[peerid.ID]int{}
				lo, hi := math.MaxInt, 0
				for _, g := range gs {
					if !slices.IsSorted(g) {
						t.Fatalf("group not sorted: %v", g)
					}
					lo, hi = min(lo, len(g)), max(hi, len(g))
					for _, p := range g {
						seen[p]++
					}
				}
				if hi-lo > 1 || (tc.size >= 1 && hi > tc.size) {
					t.Fatalf("round %d: group sizes %d..%d with size %d", round, lo, hi, tc.size)
				}
				if len(seen) != tc.n {
					t.Fatalf("round %d: %d peers in groups, want %d", round, len(seen), tc.n)
				}
				for i, p := range ps {
					if seen[p] != 1 {
						t.Fatalf("round %d: %s in %d groups", round, p, seen[p])
					}
					if i%17 != 0 {
						continue
					}
					if g := GroupOf(9, round, ps, tc.size, p); !slices.Contains(g, p) {
						t.Fatalf("GroupOf(%s) = %v", p, g)
					}
				}
			}
		})
	}
	if Partition(1, 1, nil, 16) != nil || GroupOf(1, 1, peers(40), 16, "stranger") != nil {
		t.Fatal("empty membership or a stranger got a group")
	}
}

// TestPartitionSameView: peers holding the same membership in any order,
// with duplicates, derive the same groups.
func TestPartitionSameView(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	ps := peers(100)
	want := Partition(5, 42, ps, 16)
	for range 20 {
		view := slices.Clone(ps)
		rng.Shuffle(len(view), func(i, j int) { view[i], view[j] = view[j], view[i] })
		view = append(view, view[:7]...)
		if got := Partition(5, 42, view, 16); !slices.EqualFunc(got, want, slices.Equal) {
			t.Fatalf("groups depend on the order of the view")
		}
	}
	if got := Partition(6, 42, ps, 16); slices.EqualFunc(got, want, slices.Equal) {
		t.Fatal("the seed does not change the groups")
	}
}

// TestPartitionRedrawn: a peer's group partners change from round to round,
// and over rounds it meets most of the swarm.
func TestPartitionRedrawn(t *testing.T) {
	ps := peers(256)
	self := ps[0]
	met := map[peerid.ID]bool{}
	prev := GroupOf(1, 0, ps, 16, self)
	for round := uint64(1); round <= 40; round++ {
		g := GroupOf(1, round, ps, 16, self)
		if slices.Equal(g, prev) {
			t.Fatalf("round %d: same group as round %d", round, round-1)
		}
		common := 0
		for _, p := range g {
			met[p] = true
			if slices.Contains(prev, p) {
				common++
			}
		}
		// Random groups share about 16·16/256 = 1 peer besides self.
		if common > 8 {
			t.Fatalf("round %d: %d of 16 partners kept from the round before", round, common)
		}
		prev = g
	}
	if len(met) < 200 { // 1 − (15/255)... expected ≈ 256·(1−(1−15/255)^40) ≈ 232
		t.Fatalf("met only %d of 256 peers in 40 rounds", len(met))
	}
}

// mixRound replaces each value by its group's mean and returns the spread
// before and after: the mean squared distance to the mean of all.
func mixRound(x map[peerid.ID][]float64, groups [][]peerid.ID) (before, after float64) {
	spread := func() float64 {
		var d int
		for _, v := range x {
			d = len(v)
			break
		}
		mean := make([]float64, d)
		for _, v := range x {
			for i := range v {
				mean[i] += v[i] / float64(len(x))
			}
		}
		var s float64
		for _, v := range x {
			for i := range v {
				s += (v[i] - mean[i]) * (v[i] - mean[i])
			}
		}
		return s / float64(len(x))
	}
	before = spread()
	for _, g := range groups {
		m := make([]float64, len(x[g[0]]))
		for _, p := range g {
			for i, v := range x[p] {
				m[i] += v / float64(len(g))
			}
		}
		for _, p := range g {
			copy(x[p], m)
		}
	}
	return before, spread()
}

// TestPartitionMixing checks the contraction the theory predicts: one
// round of averaging in k random groups of n peers leaves (k−1)/(n−1) of
// the spread in expectation (for 256 peers in 16 groups of 16, 1/17), and
// since the groups are re-drawn each round, r rounds leave about its r-th
// power. Groups kept from round to round (the same seed and round) would
// stop after the first.
func TestPartitionMixing(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, tc := range []struct{ n, size int }{{256, 16}, {1000, 16}, {256, 32}, {100, 8}} {
		ps := peers(tc.n)
		k := (tc.n + tc.size - 1) / tc.size
		want := float64(k-1) / float64(tc.n-1)
		const d, trials = 16, 30
		var sumB, sumA float64
		for trial := range trials {
			x := map[peerid.ID][]float64{}
			for _, p := range ps {
				v := make([]float64, d)
				for i := range v {
					v[i] = rng.NormFloat64()
				}
				x[p] = v
			}
			b, a := mixRound(x, Partition(1, uint64(trial), ps, tc.size))
			sumB, sumA = sumB+b, sumA+a
		}
		got := sumA / sumB
		if math.Abs(got-want) > 0.1*want {
			t.Errorf("n=%d size=%d: one round keeps %.4f of the spread, theory (k−1)/(n−1) = %.4f", tc.n, tc.size, got, want)
		}
	}

	// Three rounds, re-drawn each time, against the same groups thrice.
	ps := peers(256)
	x := map[peerid.ID][]float64{}
	fixed := map[peerid.ID][]float64{}
	for _, p := range ps {
		v := []float64{rng.NormFloat64(), rng.NormFloat64(), rng.NormFloat64(), rng.NormFloat64()}
		x[p], fixed[p] = v, slices.Clone(v)
	}
	first, _ := mixRound(x, nil)
	var last, lastFixed float64
	for round := uint64(1); round <= 3; round++ {
		_, last = mixRound(x, Partition(1, round, ps, 16))
		_, lastFixed = mixRound(fixed, Partition(1, 1, ps, 16))
	}
	if want := math.Pow(15.0/255, 3); last/first > 3*want || last/first < want/3 {
		t.Errorf("3 re-drawn rounds keep %.2e of the spread, theory %.2e", last/first, want)
	}
	if lastFixed/first < 0.02 {
		t.Errorf("fixed groups kept %.2e: the test cannot tell re-drawing from not", lastFixed/first)
	}
}
