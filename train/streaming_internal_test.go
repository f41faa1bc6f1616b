package train

import (
	"slices"
	"testing"

	"github.com/starling-ml/starling/nn"
	"github.com/starling-ml/starling/peerid"
)

// Fragments are strided over the tensors and cover every value once.
func TestFragmentSpans(t *testing.T) {
	views := []nn.View{{Offset: 0, Len: 6}, {Offset: 6, Len: 2}, {Offset: 8, Len: 4}, {Offset: 12, Len: 1}, {Offset: 13, Len: 3}}
	got := fragmentSpans(views, 2)
	want := [][][2]int{{{0, 6}, {8, 12}, {13, 16}}, {{6, 8}, {12, 13}}}
	if len(got) != 2 || !slices.Equal(got[0], want[0]) || !slices.Equal(got[1], want[1]) {
		t.Fatalf("fragmentSpans = %v, want %v", got, want)
	}
	if spansLen(got[0])+spansLen(got[1]) != 16 {
		t.Fatal("fragments do not cover the model")
	}
	src := []float32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}
	packed := make([]float32, spansLen(got[1]))
	gather(packed, src, got[1])
	if !slices.Equal(packed, []float32{6, 7, 12}) {
		t.Fatalf("gather = %v", packed)
	}
	dst := make([]float32, 16)
	scatter(dst, packed, got[1])
	if dst[6] != 6 || dst[7] != 7 || dst[12] != 12 || dst[0] != 0 {
		t.Fatalf("scatter = %v", dst)
	}
	if e := fragmentSpans(views[:1], 3); len(e) != 3 || len(e[1]) != 0 {
		t.Fatalf("more fragments than tensors: %v", e)
	}
}

// Each fragment syncs once per outer step, staggered through it, and
// every (outer step, fragment) gets its own increasing round.
func TestSyncSchedule(t *testing.T) {
	h, f := 10, 4
	var rounds []uint64
	seen := map[[2]int]int{}
	for step := 1; step <= 3*h; step++ {
		o, p, ok := syncAt(step, h, f)
		if !ok {
			continue
		}
		if o != (step-1)/h {
			t.Fatalf("step %d: outer %d", step, o)
		}
		seen[[2]int{o, p}] = step
		r := fragmentRound(o, p, f)
		if oo, pp := fragmentOf(r, f); oo != o || pp != p {
			t.Fatalf("round %d decodes to (%d, %d), want (%d, %d)", r, oo, pp, o, p)
		}
		rounds = append(rounds, r)
	}
	if len(seen) != 3*f || !slices.IsSorted(rounds) || rounds[0] != 1 || rounds[len(rounds)-1] != uint64(3*f) {
		t.Fatalf("syncs %v rounds %v", seen, rounds)
	}
	// Fragment 3 (the last) syncs at the end of each outer step; the
	// others in between, h/f apart.
	if seen[[2]int{0, 0}] != 2 || seen[[2]int{0, 1}] != 5 || seen[[2]int{0, 3}] != 10 || seen[[2]int{2, 3}] != 30 {
		t.Fatalf("schedule %v", seen)
	}
	if _, _, ok := syncAt(0, h, f); ok {
		t.Fatal("step 0 syncs")
	}
}

func TestParseStreamingDiLoCo(t *testing.T) {
	var c FedConfig
	c.Rounds, c.Fraction, c.RoundTimeout = 1, 1, 1
	if err := c.ParseStrategy("streaming-diloco:h=40,fragments=4,alpha=0.25,overlap=3"); err != nil {
		t.Fatal(err)
	}
	if c.LocalSteps != 40 || c.Fragments != 4 || c.Alpha != 0.25 || c.Overlap != 3 || c.ServerLR != 0.7 || c.ServerMomentum != 0.9 {
		t.Fatalf("parsed %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"streaming-diloco:h=2,fragments=4", "streaming-diloco:h=40,fragments=4,overlap=40", "streaming-diloco:alpha=2", "streaming-diloco:fragments=0"} {
		c := c
		err := c.ParseStrategy(bad)
		if err == nil {
			err = c.Validate()
		}
		if err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
}

func TestParseAsyncDiLoCo(t *testing.T) {
	var c FedConfig
	c.Rounds, c.Fraction, c.RoundTimeout = 1, 1, 1
	if err := c.ParseStrategy("async-diloco:h=20,lr=0.5"); err != nil {
		t.Fatal(err)
	}
	if !c.Streams() || c.LocalSteps != 20 || c.Fragments != 1 || c.Overlap != 20 || c.ServerLR != 0.5 || c.ServerMomentum != 0.9 {
		t.Fatalf("parsed %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := c.ParseStrategy("async-diloco:fragments=2"); err == nil {
		t.Fatal("async-diloco took fragments")
	}
	c.ParseStrategy("async-diloco:h=20")
	c.Overlap = 3
	if err := c.Validate(); err == nil {
		t.Fatal("async-diloco with overlap 3 passed Validate")
	}
}

// A peer is left behind in an outer step once another member has
// completed the step after it, or the run's last step; a member at the
// step itself may still be merging it, and one stopped or unknown says
// nothing.
func TestLeftBehind(t *testing.T) {
	group := []peerid.ID{"a", "b", "c"}
	for _, tc := range []struct {
		name          string
		outer, rounds uint64
		st            map[peerid.ID]Status
		want          []peerid.ID
	}{
		{"all at the step", 1, 5, map[peerid.ID]Status{"b": {Version: 1}, "c": {Version: 1}}, nil},
		{"one completed it", 1, 5, map[peerid.ID]Status{"b": {Version: 2}, "c": {Version: 1}}, nil},
		{"one completed the next", 1, 5, map[peerid.ID]Status{"b": {Version: 3}, "c": {Version: 1}}, []peerid.ID{"b"}},
		{"one completed the last", 4, 5, map[peerid.ID]Status{"b": {Version: 5}}, []peerid.ID{"b"}},
		{"self ahead says nothing", 1, 5, map[peerid.ID]Status{"a": {Version: 3}}, nil},
		{"not in the group", 1, 5, map[peerid.ID]Status{"d": {Version: 3}}, nil},
		{"stopped", 1, 5, map[peerid.ID]Status{"b": {Version: 3, Done: true}}, nil},
	} {
		if got := leftBehind("a", tc.outer, tc.rounds, group, tc.st); !slices.Equal(got, tc.want) {
			t.Errorf("%s: leftBehind = %v, want %v", tc.name, got, tc.want)
		}
	}
}
