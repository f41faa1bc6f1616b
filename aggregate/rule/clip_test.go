package rule

import (
	"fmt"
	"math"
	"testing"
)

func l2dist(a, b []float32) float64 {
	var s float64
	for i := range a {
		d := float64(a[i]) - float64(b[i])
		s += d * d
	}
	return math.Sqrt(s)
}

// at returns ref moved by d along (0.6, 0.8).
func at(ref []float32, d float32) []float32 {
	return []float32{ref[0] + 0.6*d, ref[1] + 0.8*d}
}

// TestDistanceClip: the radius is Factor times the lower median of the
// other senders' latest distances (‖ref‖ before any other is known); a
// contribution within it passes unchanged, one beyond it is moved towards
// ref to exactly that radius along the same direction; a sender that
// floods far contributions is one vote and cannot set its own radius.
func TestDistanceClip(t *testing.T) {
	c := NewDistanceClip()
	ref := []float32{3, 4} // norm 5
	far := at(ref, 100)
	if s := c.Clip(far, ref, "liar"); math.Abs(l2dist(far, ref)-5) > 1e-5 || math.Abs(s-0.05) > 1e-6 {
		t.Fatalf("first contribution: distance %v (scale %v), want ‖ref‖ = 5", l2dist(far, ref), s)
	}
	if math.Abs(float64(far[1]-ref[1])/float64(far[0]-ref[0])-4.0/3) > 1e-5 {
		t.Fatalf("direction changed: %v", far)
	}
	for i := range 3 {
		if s := c.Clip(at(ref, 1), ref, fmt.Sprint("honest", i)); s != 1 && i > 0 {
			t.Fatalf("an honest distance of 1 was clipped (scale %v)", s)
		}
	}
	// The liar floods: each far contribution ends at 3 = 3×median{1,1,1}.
	for range 50 {
		v := at(ref, 1e6)
		c.Clip(v, ref, "liar")
		if d := l2dist(v, ref); math.Abs(d-3) > 1e-3 {
			t.Fatalf("flooded contribution left at distance %v, want 3", d)
		}
	}
	// Honest peers keep their radius: median of {1, 1, 1e6} (others of
	// honest0) is 1.
	if s := c.Clip(at(ref, 2.9), ref, "honest0"); s != 1 {
		t.Fatalf("honest distance 2.9 clipped (scale %v)", s)
	}
	// With {honest, liar} as the others, the lower median is the honest one.
	two := NewDistanceClip()
	two.Clip(at(ref, 1), ref, "a")
	two.Clip(at(ref, 1e6), ref, "liar")
	v := at(ref, 1e6)
	two.Clip(v, ref, "b")
	if d := l2dist(v, ref); math.Abs(d-3) > 1e-3 {
		t.Fatalf("lower median: distance %v, want 3", d)
	}
	// Non-finite input is left for the caller to refuse, and not recorded.
	n := len(c.last)
	if s := c.Clip([]float32{float32(math.NaN()), 0}, ref, "nan"); s != 1 || len(c.last) != n {
		t.Fatalf("NaN: scale %v, senders %d→%d", s, n, len(c.last))
	}
	// Senders beyond MaxSenders push out the one heard from longest ago.
	c.MaxSenders = 4
	c.Clip(at(ref, 1), ref, "new")
	if len(c.last) != 4 {
		t.Fatalf("%d senders remembered, want 4", len(c.last))
	}
	if c.Clipped() != 51 {
		t.Fatalf("clipped %d, want 51", c.Clipped())
	}
}
