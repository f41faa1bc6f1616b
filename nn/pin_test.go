package nn

import (
	"fmt"
	"hash/fnv"
	"math"
	"testing"
)

// paramHash digests a model's parameter names, shapes and values (the bits
// of every float32, in order) into one FNV-1a hash.
func paramHash(m *Model) string {
	h := fnv.New64a()
	var b [4]byte
	for _, v := range m.Views() {
		fmt.Fprintf(h, "%s%v;", v.Name, v.Shape)
		for _, x := range m.Param(v) {
			u := math.Float32bits(x)
			b[0], b[1], b[2], b[3] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
			h.Write(b[:])
		}
	}
	return fmt.Sprintf("%016x", h.Sum64())
}

// TestPinnedInit pins the initial parameters (names, shapes, values) of the
// built-in models, recorded before the public model API replaced their
// construction: the same seed must keep giving the same model.
func TestPinnedInit(t *testing.T) {
	want := map[string]string{
		"logreg":         "422da4dfd94eaba3",
		"mlp":            "aced2b2bdeed2921",
		"mlp:784-128-10": "62c6cb7d09a7bf17",
		"cnn":            "aef995bf5612e02c",
	}
	for arch, h := range want {
		m, err := New(arch, 42)
		if err != nil {
			t.Fatal(err)
		}
		if got := paramHash(m); got != h {
			t.Errorf("%s: initial parameter hash %s, want %s", arch, got, h)
		}
	}
}
