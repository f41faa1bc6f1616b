package data

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
)

func idxBytes(dims []uint32, payload []byte) []byte {
	var b bytes.Buffer
	b.Write([]byte{0, 0, 8, byte(len(dims))})
	for _, d := range dims {
		binary.Write(&b, binary.BigEndian, d)
	}
	b.Write(payload)
	return b.Bytes()
}

func gz(b []byte) []byte {
	var out bytes.Buffer
	w := gzip.NewWriter(&out)
	w.Write(b)
	w.Close()
	return out.Bytes()
}

func TestReadIDX(t *testing.T) {
	raw := idxBytes([]uint32{2, 3}, []byte{1, 2, 3, 4, 5, 6})
	for name, in := range map[string][]byte{"raw": raw, "gzip": gz(raw)} {
		got, err := ReadIDX(bytes.NewReader(in))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !reflect.DeepEqual(got.Dims, []int{2, 3}) || !bytes.Equal(got.Data, []byte{1, 2, 3, 4, 5, 6}) {
			t.Fatalf("%s: got %+v", name, got)
		}
	}
}

func TestReadIDXBad(t *testing.T) {
	cases := map[string]struct {
		in   []byte
		want error
	}{
		"empty":        {nil, ErrTruncated},
		"wrong magic":  {append([]byte{0x12, 0x34, 8, 1}, 0, 0, 0, 1, 7), ErrBadIDX},
		"float type":   {append([]byte{0, 0, 0x0d, 1}, 0, 0, 0, 1, 7), ErrBadIDX},
		"no dims":      {[]byte{0, 0, 8, 0}, ErrBadIDX},
		"short dims":   {[]byte{0, 0, 8, 2, 0, 0, 0, 1}, ErrTruncated},
		"short data":   {idxBytes([]uint32{10, 10}, make([]byte, 99)), ErrTruncated},
		"huge claim":   {idxBytes([]uint32{1 << 20, 1 << 20}, nil), ErrBadIDX},
		"gzip garbage": {[]byte{0x1f, 0x8b, 1, 2, 3}, ErrBadIDX},
		"gzip short":   {gz(idxBytes([]uint32{5}, []byte{1, 2}))[:20], ErrTruncated},
	}
	for name, c := range cases {
		_, err := ReadIDX(bytes.NewReader(c.in))
		if !errors.Is(err, c.want) {
			t.Errorf("%s: err = %v, want %v", name, err, c.want)
		}
	}
}

// FuzzReadIDX: whatever either reader accepts has the size its header
// claims and writes back to a file that reads the same; what ReadIDX
// accepts ReadIDXAny reads alike.
func FuzzReadIDX(f *testing.F) {
	f.Add(idxBytes([]uint32{2, 2}, []byte{1, 2, 3, 4}))
	f.Add(gz(idxBytes([]uint32{3}, []byte{1, 2, 3})))
	f.Add([]byte{0, 0, 8, 3, 0, 0, 0, 1, 0, 0, 0, 28, 0, 0, 0, 28})
	f.Add(idxTyped(IDXFloat32, []uint32{2, 2}, []float64{1, -2, 3.5, 4}))
	f.Add(gz(idxTyped(IDXInt16, []uint32{3}, []float64{1, -2, 3})))
	f.Add(idxTyped(IDXFloat64, []uint32{1, 1, 1, 1, 1, 2}, []float64{1, 2}))
	f.Add([]byte{0, 0, 0x0c, 2, 0, 0, 0, 1, 0, 0, 0, 28})
	f.Fuzz(func(t *testing.T, in []byte) {
		bytesOnly, errBytes := ReadIDX(bytes.NewReader(in))
		x, err := ReadIDXAny(bytes.NewReader(in))
		if errBytes == nil && (err != nil || !reflect.DeepEqual(bytesOnly, x)) {
			t.Fatalf("ReadIDX reads %+v, ReadIDXAny %+v, %v", bytesOnly, x, err)
		}
		if err != nil {
			return
		}
		n := 1
		for _, d := range x.Dims {
			n *= d
		}
		if len(x.Data) != n*x.Type.Size() || x.Len() != n || len(x.Float32s(nil)) != n {
			t.Fatalf("dims %v of %v but %d bytes", x.Dims, x.Type, len(x.Data))
		}
		var b bytes.Buffer
		b.Write([]byte{0, 0, byte(x.Type), byte(len(x.Dims))})
		for _, d := range x.Dims {
			binary.Write(&b, binary.BigEndian, uint32(d))
		}
		b.Write(x.Data)
		y, err := ReadIDXAny(&b)
		if err != nil || !reflect.DeepEqual(x, y) {
			t.Fatalf("re-read: %v", err)
		}
	})
}

func TestLoadMNISTMissing(t *testing.T) {
	dir := t.TempDir()
	_, _, err := LoadMNIST(dir)
	if !errors.Is(err, ErrNoDataset) || !strings.Contains(err.Error(), "go mod download") {
		t.Fatalf("err = %v, want ErrNoDataset saying how to get it", err)
	}
}

func TestLoadMNISTCorrupt(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, b []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("train-images-idx3-ubyte", idxBytes([]uint32{2, 28, 28}, make([]byte, 2*784-10))) // truncated
	write("train-labels-idx1-ubyte", idxBytes([]uint32{2}, []byte{1, 2}))
	write("t10k-images-idx3-ubyte", idxBytes([]uint32{1, 28, 28}, make([]byte, 784)))
	write("t10k-labels-idx1-ubyte", idxBytes([]uint32{1}, []byte{3}))
	if _, _, err := LoadMNIST(dir); !errors.Is(err, ErrTruncated) {
		t.Fatalf("truncated images: err = %v", err)
	}
	write("train-images-idx3-ubyte", idxBytes([]uint32{2, 28, 28}, make([]byte, 2*784)))
	write("train-labels-idx1-ubyte", idxBytes([]uint32{3}, []byte{1, 2, 3}))
	if _, _, err := LoadMNIST(dir); !errors.Is(err, ErrBadIDX) {
		t.Fatalf("label count mismatch: err = %v", err)
	}
	write("train-labels-idx1-ubyte", idxBytes([]uint32{2}, []byte{1, 12}))
	if _, _, err := LoadMNIST(dir); !errors.Is(err, ErrBadIDX) {
		t.Fatalf("label 12: err = %v", err)
	}
	write("train-labels-idx1-ubyte", idxBytes([]uint32{2}, []byte{1, 2}))
	tr, te, err := LoadMNIST(dir)
	if err != nil || tr.Len() != 2 || te.Len() != 1 || te.Y[0] != 3 {
		t.Fatalf("valid small set: %v", err)
	}
}

func TestLoadMNISTFromModuleCache(t *testing.T) {
	dir, err := FindMNIST()
	if err != nil {
		t.Fatal(err)
	}
	train, test, err := LoadMNIST(dir)
	if err != nil {
		t.Fatal(err)
	}
	if train.Len() != 60000 || test.Len() != 10000 || train.Dim != 784 {
		t.Fatalf("sizes %d/%d dim %d", train.Len(), test.Len(), train.Dim)
	}
	// Known class counts of MNIST's training set.
	want := []int{5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949}
	all := make([]int, train.Len())
	for i := range all {
		all[i] = i
	}
	if got := LabelCounts(train.Y, all, 10); !reflect.DeepEqual(got, want) {
		t.Fatalf("train label counts %v, want %v", got, want)
	}
}

func checkCover(t *testing.T, parts [][]int, n int) {
	t.Helper()
	seen := make([]bool, n)
	total := 0
	for _, p := range parts {
		for _, i := range p {
			if seen[i] {
				t.Fatalf("index %d in two parts", i)
			}
			seen[i] = true
			total++
		}
	}
	if total != n {
		t.Fatalf("parts hold %d of %d samples", total, n)
	}
}

func synthLabels(n, classes int) []int32 {
	l := make([]int32, n)
	for i := range l {
		l[i] = int32((i * 7) % classes)
	}
	return l
}

func TestIID(t *testing.T) {
	p, err := IID(1003, 10, 1)
	if err != nil {
		t.Fatal(err)
	}
	checkCover(t, p, 1003)
	for _, part := range p {
		if len(part) < 100 || len(part) > 101 {
			t.Fatalf("part size %d", len(part))
		}
	}
	q, _ := IID(1003, 10, 1)
	if !reflect.DeepEqual(p, q) {
		t.Fatal("not deterministic")
	}
	if _, err := IID(5, 10, 1); !errors.Is(err, ErrPartition) {
		t.Fatal("more parts than samples: want ErrPartition")
	}
}

func TestShards(t *testing.T) {
	labels := synthLabels(60000, 10)
	p, err := Shards(labels, 100, 2, 3)
	if err != nil {
		t.Fatal(err)
	}
	checkCover(t, p, 60000)
	for _, part := range p {
		if len(part) != 600 {
			t.Fatalf("part size %d, want 2 shards of 300", len(part))
		}
		classes := 0
		for _, c := range LabelCounts(labels, part, 10) {
			if c > 0 {
				classes++
			}
		}
		if classes > 2 {
			t.Fatalf("a part holds %d classes; sorted shards of 300 from classes of 6000 give at most 2", classes)
		}
	}
}

func TestDirichlet(t *testing.T) {
	labels := synthLabels(20000, 10)
	for _, alpha := range []float64{0.1, 0.5, 100} {
		p, err := Dirichlet(labels, 20, alpha, 10, 7)
		if err != nil {
			t.Fatalf("α=%v: %v", alpha, err)
		}
		checkCover(t, p, len(labels))
		q, _ := Dirichlet(labels, 20, alpha, 10, 7)
		if !reflect.DeepEqual(p, q) {
			t.Fatalf("α=%v: not deterministic", alpha)
		}
		// Skew: with α=0.1 a typical part is dominated by one class; with
		// α=100 every part is close to uniform.
		var top []float64
		for _, part := range p {
			if len(part) < 10 {
				t.Fatalf("α=%v: part of %d < min 10", alpha, len(part))
			}
			c := LabelCounts(labels, part, 10)
			sort.Ints(c)
			top = append(top, float64(c[9])/float64(len(part)))
		}
		sort.Float64s(top)
		med := top[len(top)/2]
		switch {
		case alpha == 0.1 && med < 0.5:
			t.Fatalf("α=0.1: median top-class share %.2f, want skewed > 0.5", med)
		case alpha == 100 && med > 0.2:
			t.Fatalf("α=100: median top-class share %.2f, want near 0.1", med)
		}
	}
	if _, err := Dirichlet(labels, 10, 0, 1, 1); !errors.Is(err, ErrPartition) {
		t.Fatal("α=0: want ErrPartition")
	}
	if _, err := Dirichlet(labels[:50], 10, 0.5, 10, 1); !errors.Is(err, ErrPartition) {
		t.Fatal("impossible min size: want ErrPartition")
	}
}

func TestIterator(t *testing.T) {
	s := &Set{X: make([]float32, 10*2), Y: make([]int32, 10), Dim: 2, Classes: 10}
	for i := 0; i < 10; i++ {
		s.X[2*i], s.X[2*i+1], s.Y[i] = float32(i), float32(-i), int32(i)
	}
	it := NewIterator(s, 4, 9)
	if it.BatchesPerEpoch() != 3 {
		t.Fatal("batches per epoch")
	}
	var orders [2][]int32
	for e := 0; e < 2; e++ {
		batches := 0
		for it.Next() {
			x, y := it.Batch()
			for k := range y {
				if x[2*k] != float32(y[k]) || x[2*k+1] != -float32(y[k]) {
					t.Fatal("features and labels out of step")
				}
			}
			orders[e] = append(orders[e], y...)
			batches++
		}
		if batches != 3 || len(orders[e]) != 10 {
			t.Fatalf("epoch %d: %d batches %d samples", e, batches, len(orders[e]))
		}
		sorted := append([]int32(nil), orders[e]...)
		sort.Slice(sorted, func(a, b int) bool { return sorted[a] < sorted[b] })
		for i, v := range sorted {
			if v != int32(i) {
				t.Fatal("epoch does not visit every sample once")
			}
		}
	}
	if reflect.DeepEqual(orders[0], orders[1]) {
		t.Fatal("epochs use the same order")
	}
	it2 := NewIterator(s, 4, 9)
	var again []int32
	for it2.Next() {
		_, y := it2.Batch()
		again = append(again, y...)
	}
	if !reflect.DeepEqual(again, orders[0]) {
		t.Fatal("same seed, different order")
	}
	it3 := NewIterator(s, 4, 9)
	it3.DropLast = true
	n := 0
	for it3.Next() {
		n++
	}
	if n != 2 {
		t.Fatalf("DropLast: %d batches", n)
	}
}
