package plot

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

func TestWritesPNGs(t *testing.T) {
	dir := t.TempDir()
	a := filepath.Join(dir, "a.png")
	if err := Lines(a, "acc", "round", "accuracy", []Series{{"x", []float64{1, 2, 3}, []float64{0.5, 0.8, 0.9}}, {"y", []float64{1, 2}, []float64{0.4, 0.7}}}); err != nil {
		t.Fatal(err)
	}
	h := filepath.Join(dir, "h.png")
	if err := Histogram(h, "staleness", "τ", map[int]int{0: 5, 1: 3, 4: 1}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{a, h} {
		b, err := os.ReadFile(p)
		if err != nil || !bytes.HasPrefix(b, []byte("\x89PNG")) {
			t.Fatalf("%s is not a PNG: %v", p, err)
		}
	}
	if err := Lines(a, "", "", "", []Series{{"bad", []float64{1}, nil}}); err == nil {
		t.Fatal("mismatched series: want error")
	}
}

func TestLegendAvoidsCurves(t *testing.T) {
	x := []float64{0, 1, 2, 3, 4}
	if !highOnRight([]Series{{"acc", x, []float64{0.1, 0.8, 0.9, 0.95, 0.97}}}) {
		t.Error("rising curve: legend should go to the bottom")
	}
	if highOnRight([]Series{{"loss", x, []float64{2, 0.5, 0.3, 0.2, 0.1}}}) {
		t.Error("falling curve: legend should stay on top")
	}
}
