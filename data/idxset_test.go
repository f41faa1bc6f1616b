package data

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// writeFiles writes name → content into a new folder and returns it.
func writeFiles(t *testing.T, files map[string][]byte) string {
	t.Helper()
	dir := t.TempDir()
	for name, b := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestLoadIDX(t *testing.T) {
	// Training inputs: 4 samples of 2×1×3 float32 (H, W, C) whose channel
	// c holds c·100 + sample·(c+1): per-channel means 100c + 1.5(c+1).
	img := func(n int, off float64) []byte {
		return idxTyped(IDXFloat32, []uint32{uint32(n), 2, 1, 3}, seq(n*6, func(j int) float64 {
			c, i := j%3, j/6
			return float64(c*100) + (float64(i)+off)*float64(c+1)
		}))
	}
	dir := writeFiles(t, map[string][]byte{
		"train-x": img(4, 0), "train-y": idxTyped(IDXInt16, []uint32{4}, []float64{0, 4, 1, 2}),
		"test-x": gz(img(2, 10)), "test-y": idxTyped(IDXUint8, []uint32{2}, []float64{3, 1}),
	})
	p := func(n string) string { return filepath.Join(dir, n) }
	tr, te, err := LoadIDX(p("train-x"), p("train-y"), p("test-x"), p("test-y"), DefaultIDXConfig())
	if err != nil {
		t.Fatal(err)
	}
	if tr.Len() != 4 || te.Len() != 2 || tr.Classes != 5 || te.Classes != 5 || tr.Dim != 6 ||
		!reflect.DeepEqual(tr.InputShape(), []int{2, 1, 3}) || !reflect.DeepEqual(te.Y, []int32{3, 1}) {
		t.Fatalf("train %d×%v classes %d, test %d labels %v", tr.Len(), tr.InputShape(), tr.Classes, te.Len(), te.Y)
	}
	// Each training channel is standardised: mean 0, deviation 1.
	for c := 0; c < 3; c++ {
		var sum, sq float64
		for j := c; j < len(tr.X); j += 3 {
			sum += float64(tr.X[j])
			sq += float64(tr.X[j]) * float64(tr.X[j])
		}
		mean, std := sum/8, math.Sqrt(sq/8-(sum/8)*(sum/8))
		if math.Abs(mean) > 1e-5 || math.Abs(std-1) > 1e-5 {
			t.Fatalf("train channel %d: mean %v std %v", c, mean, std)
		}
	}
	// The test split uses the training statistics: channel c of test
	// sample i is (i+10)(c+1) against a training mean of 1.5(c+1) and
	// deviation of sqrt(1.25)(c+1), so (i+8.5)/sqrt(1.25) for every c.
	for j, v := range te.X {
		want := (float64(j/6) + 8.5) / math.Sqrt(1.25)
		if math.Abs(float64(v)-want) > 1e-4 {
			t.Fatalf("test value %d = %v, want %v", j, v, want)
		}
	}

	// Global statistics; a given class count; no test split.
	tr, te, err = LoadIDX(p("train-x"), p("train-y"), "", "", IDXConfig{Classes: 9, Norm: NormGlobal})
	if err != nil || te != nil || tr.Classes != 9 {
		t.Fatalf("no test split: %v %v", err, te)
	}
	var sum float64
	for _, v := range tr.X {
		sum += float64(v)
	}
	if math.Abs(sum/24) > 1e-5 || tr.X[0] == tr.X[1] {
		t.Fatalf("global: mean %v", sum/24)
	}
	tr, _, err = LoadIDX(p("train-x"), p("train-y"), "", "", IDXConfig{Norm: NormNone})
	if err != nil || tr.X[5] != 200 {
		t.Fatalf("no normalisation: %v %v", err, tr.X[:6])
	}
}

func TestLoadIDXRanks(t *testing.T) {
	for _, c := range []struct {
		dims  []uint32
		shape []int
	}{
		{[]uint32{3}, []int{1}},
		{[]uint32{3, 5}, []int{5}},
		{[]uint32{3, 2, 2}, []int{2, 2, 1}},
		{[]uint32{3, 2, 2, 2, 2}, []int{2, 2, 2, 2}},
	} {
		n := 1
		for _, d := range c.dims {
			n *= int(d)
		}
		dir := writeFiles(t, map[string][]byte{
			"x": idxTyped(IDXUint8, c.dims, seq(n, func(i int) float64 { return float64(i % 7) })),
			"y": idxTyped(IDXUint8, []uint32{3}, []float64{0, 1, 0}),
		})
		tr, _, err := LoadIDX(filepath.Join(dir, "x"), filepath.Join(dir, "y"), "", "", IDXConfig{})
		if err != nil {
			t.Fatalf("dims %v: %v", c.dims, err)
		}
		if !reflect.DeepEqual(tr.InputShape(), c.shape) || InputSize(tr) != n/3 || tr.Classes != 2 {
			t.Fatalf("dims %v: shape %v size %d classes %d", c.dims, tr.InputShape(), InputSize(tr), tr.Classes)
		}
	}
}

func TestLoadIDXBad(t *testing.T) {
	x4 := idxTyped(IDXUint8, []uint32{4, 2, 2}, seq(16, func(i int) float64 { return float64(i) }))
	y4 := idxTyped(IDXUint8, []uint32{4}, []float64{0, 1, 2, 1})
	nan := idxTyped(IDXFloat64, []uint32{4, 2, 2}, seq(16, func(i int) float64 {
		if i == 9 {
			return math.NaN()
		}
		return 1
	}))
	cases := []struct {
		name         string
		x, y, tx, ty []byte
		cfg          IDXConfig
		want         error
		file         string // the file the message must name
	}{
		{"truncated inputs", x4[:20], y4, x4, y4, IDXConfig{}, ErrTruncated, "train-x"},
		{"truncated labels", x4, y4[:10], x4, y4, IDXConfig{}, ErrTruncated, "train-y"},
		{"count mismatch", x4, idxTyped(IDXUint8, []uint32{3}, []float64{0, 1, 2}), x4, y4, IDXConfig{}, ErrBadIDX, "train-y"},
		{"labels not a vector", x4, idxTyped(IDXUint8, []uint32{4, 1}, []float64{0, 1, 2, 1}), x4, y4, IDXConfig{}, ErrBadIDX, "train-y"},
		{"label out of range", x4, y4, x4, idxTyped(IDXUint8, []uint32{4}, []float64{0, 1, 3, 1}), IDXConfig{Classes: 3}, ErrLabelRange, "test-y"},
		{"negative label", x4, idxTyped(IDXInt8, []uint32{4}, []float64{0, -1, 2, 1}), x4, y4, IDXConfig{}, ErrLabelRange, "train-y"},
		{"float labels", x4, idxTyped(IDXFloat32, []uint32{4}, []float64{0, 1, 2, 1}), x4, y4, IDXConfig{}, ErrUnsupportedType, "train-y"},
		{"unknown type", append([]byte{0, 0, 0x0a, 1}, x4[4:]...), y4, x4, y4, IDXConfig{}, ErrUnsupportedType, "train-x"},
		{"test shape differs", x4, y4, idxTyped(IDXUint8, []uint32{4, 4}, make([]float64, 16)), y4, IDXConfig{}, ErrBadIDX, "test-x"},
		{"no samples", idxTyped(IDXUint8, []uint32{0, 2, 2}, nil), idxTyped(IDXUint8, []uint32{0}, nil), x4, y4, IDXConfig{}, ErrBadIDX, "train-x"},
		{"empty samples", idxTyped(IDXUint8, []uint32{4, 0}, nil), y4, x4, y4, IDXConfig{}, ErrBadIDX, "train-x"},
		{"NaN", nan, y4, x4, y4, IDXConfig{}, ErrBadIDX, "train-x"},
		{"missing file", x4, y4, nil, y4, IDXConfig{}, ErrNoDataset, "test-x"},
		{"bad config", x4, y4, x4, y4, IDXConfig{Classes: -1}, ErrConfig, ""},
	}
	for _, c := range cases {
		files := map[string][]byte{"train-x": c.x, "train-y": c.y, "test-x": c.tx, "test-y": c.ty}
		if c.tx == nil {
			delete(files, "test-x")
		}
		dir := writeFiles(t, files)
		p := func(n string) string { return filepath.Join(dir, n) }
		_, _, err := LoadIDX(p("train-x"), p("train-y"), p("test-x"), p("test-y"), c.cfg)
		switch {
		case err == nil:
			t.Errorf("%s: no error", c.name)
		case !errors.Is(err, c.want):
			t.Errorf("%s: err = %v, want %v", c.name, err, c.want)
		case !strings.Contains(err.Error(), c.file) || strings.Contains(err.Error(), "\n"):
			t.Errorf("%s: %q is not one line naming %s", c.name, err, c.file)
		}
	}
	if _, _, err := LoadIDX("a", "b", "c", "", IDXConfig{}); !errors.Is(err, ErrConfig) {
		t.Error("one test file: no error")
	}
}

// TestLoadIDXMatchesMNIST: the generic loader on MNIST's files agrees
// with LoadMNIST, whose constants are MNIST's own training statistics
// rounded to four digits.
func TestLoadIDXMatchesMNIST(t *testing.T) {
	if testing.Short() {
		t.Skip("reads MNIST")
	}
	dir, err := FindMNIST()
	if err != nil {
		t.Skip(err)
	}
	want, wantTest, err := LoadMNIST(dir)
	if err != nil {
		t.Fatal(err)
	}
	f := func(i int) string { return findFile(dir, mnistFiles[i]) }
	got, gotTest, err := LoadIDX(f(0), f(1), f(2), f(3), IDXConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Classes != 10 || got.Dim != 784 || got.Shape != want.Shape ||
		!reflect.DeepEqual(got.Y, want.Y) || !reflect.DeepEqual(gotTest.Y, wantTest.Y) {
		t.Fatalf("classes %d dim %d shape %v", got.Classes, got.Dim, got.Shape)
	}
	var worst float64
	for i := range got.X {
		worst = max(worst, math.Abs(float64(got.X[i]-want.X[i])))
	}
	if worst > 2e-3 {
		t.Fatalf("LoadIDX and LoadMNIST differ by up to %v", worst)
	}
}
