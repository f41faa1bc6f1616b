package attack

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for s, want := range map[string]Attack{
		"scale:-10":            {Kind: Scale, Factor: -10},
		"scale":                {Kind: Scale, Factor: -10},
		"scale:s=3":            {Kind: Scale, Factor: 3},
		"signflip":             {Kind: SignFlip},
		"noise:0.5":            {Kind: Noise, Sigma: 0.5},
		"noise":                {Kind: Noise, Sigma: 1},
		"NaN":                  {Kind: NaN},
		"stale:3":              {Kind: Stale, K: 3},
		"flood":                {Kind: Flood, Count: 64, Size: 16},
		"flood:count=5,size=2": {Kind: Flood, Count: 5, Size: 2},
	} {
		got, err := Parse(s)
		if err != nil || got != want {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", s, got, err, want)
		}
		back, err := Parse(got.String())
		if err != nil || back != got {
			t.Errorf("Parse(%q) = %+v, %v: String does not round-trip", got.String(), back, err)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for s, want := range map[string]string{
		"":              "empty",
		"bribe":         "unknown attack",
		"scale:x":       `s="x"`,
		"scale:inf":     `s="inf"`,
		"noise:-1":      "> 0",
		"stale":         "missing k=",
		"stale:0":       "[1, 64]",
		"stale:65":      "[1, 64]",
		"nan:1":         "takes no arguments",
		"flood:count=0": "count",
		"flood:speed=3": "unknown parameter",
		"scale:1+nan":   "one term",
	} {
		_, err := Parse(s)
		if err == nil || !errors.Is(err, ErrBadSpec) || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("Parse(%q) = %v; want one line mentioning %q", s, err, want)
		}
	}
}

func TestUnmarshalNone(t *testing.T) {
	a := Attack{Kind: NaN}
	if err := a.UnmarshalText([]byte("none")); err != nil || !a.IsZero() {
		t.Fatalf("none: %+v, %v", a, err)
	}
	if err := a.UnmarshalText([]byte("signflip")); err != nil || a.Kind != SignFlip {
		t.Fatalf("signflip: %+v, %v", a, err)
	}
}

func apply(a Attack, src, ref []float32) []float32 {
	dst := make([]float32, len(src))
	NewTransformer(a, 1).Apply(dst, src, ref)
	return dst
}

func TestScaleAndSignFlip(t *testing.T) {
	src, ref := []float32{1, 2, -3}, []float32{1, 1, 1}
	cases := []struct {
		a        Attack
		ref, out []float32
	}{
		{Attack{Kind: Scale, Factor: -10}, nil, []float32{-10, -20, 30}},
		{Attack{Kind: Scale, Factor: -10}, ref, []float32{1, -9, 41}},
		{Attack{Kind: Scale, Factor: 2}, ref, []float32{1, 3, -7}},
		{Attack{Kind: SignFlip}, nil, []float32{-1, -2, 3}},
		{Attack{Kind: SignFlip}, ref, []float32{1, 0, 5}},
		{Attack{}, ref, src},
		{Attack{Kind: Flood, Count: 1, Size: 1}, ref, src},
	}
	for _, c := range cases {
		if got := apply(c.a, src, c.ref); !slices.Equal(got, c.out) {
			t.Errorf("%v from %v: %v, want %v", c.a, c.ref, got, c.out)
		}
	}
	// In place.
	x := slices.Clone(src)
	NewTransformer(Attack{Kind: SignFlip}, 1).Apply(x, x, nil)
	if !slices.Equal(x, []float32{-1, -2, 3}) {
		t.Errorf("in place: %v", x)
	}
}

func TestNoise(t *testing.T) {
	const n = 20000
	src := make([]float32, n)
	for i := range src {
		src[i] = 5
	}
	got := apply(Attack{Kind: Noise, Sigma: 0.5}, src, nil)
	var sum, sq float64
	for _, x := range got {
		d := float64(x) - 5
		sum += d
		sq += d * d
	}
	mean, sd := sum/n, math.Sqrt(sq/n)
	if math.Abs(mean) > 0.02 || math.Abs(sd-0.5) > 0.02 {
		t.Fatalf("noise: mean %v, sd %v; want 0 and 0.5", mean, sd)
	}
	if !slices.Equal(got, apply(Attack{Kind: Noise, Sigma: 0.5}, src, nil)) {
		t.Fatal("the same seed gave other noise")
	}
}

func TestNaN(t *testing.T) {
	for _, x := range apply(Attack{Kind: NaN}, []float32{1, 2, 3}, nil) {
		if !math.IsNaN(float64(x)) {
			t.Fatalf("nan: got %v", x)
		}
	}
}

func TestStale(t *testing.T) {
	tr := NewTransformer(Attack{Kind: Stale, K: 2}, 1)
	var got []float32
	for i := range 6 {
		src := []float32{float32(i), float32(10 * i)}
		dst := make([]float32, 2)
		tr.Apply(dst, src, nil)
		got = append(got, dst[0])
		if dst[1] != 10*dst[0] {
			t.Fatalf("call %d: %v mixes two contributions", i, dst)
		}
	}
	// Until there are k older ones, the oldest; then k calls ago.
	if want := []float32{0, 0, 0, 1, 2, 3}; !slices.Equal(got, want) {
		t.Fatalf("stale:2 sent %v, want %v", got, want)
	}
	if len(tr.hist) != 3 {
		t.Fatalf("stale:2 holds %d copies, want 3", len(tr.hist))
	}
	// The attacker's own vector is not touched when sent in place.
	src := []float32{7, 70}
	tr.Apply(src, src, nil)
	if !slices.Equal(src, []float32{4, 40}) {
		t.Fatalf("in place: %v", src)
	}
}
