package compression

import (
	"math"
	"slices"
	"testing"
)

// sparseLike returns gradLike values of which only every stride-th is
// kept (the others zero), with negative zeros between them.
func sparseLike(n, stride int, seed uint64) []float32 {
	x := gradLike(n, seed)
	for i := range x {
		switch {
		case i%stride == 0:
		case i%3 == 0:
			x[i] = float32(math.Copysign(0, -1))
		default:
			x[i] = 0
		}
	}
	return x
}

func TestSparseSendsEveryNonzeroExactly(t *testing.T) {
	x := sparseLike(10000, 64, 3)
	nnz := 0
	for _, v := range x {
		if v != 0 {
			nnz++
		}
	}
	b := Sparse{}.Encode(nil, x)
	y := make([]float32, len(x))
	mustDecode(t, Sparse{}, y, b)
	for i := range x {
		if x[i] != y[i] {
			t.Fatalf("value %d: sent %g, got %g", i, x[i], y[i])
		}
	}
	// Exactly the size of top-k keeping the nonzeros, and its layout.
	tk := &TopK{Frac: float64(nnz) / float64(len(x))}
	tb := tk.Encode(nil, x)
	if len(b) != len(tb) || !slices.Equal(b[1:], tb[1:]) {
		t.Fatalf("%d bytes, top-k of the same %d values %d", len(b), nnz, len(tb))
	}
	z := make([]float32, len(x))
	mustDecode(t, tk, z, b) // a TopK decodes it
	if !slices.Equal(y, z) {
		t.Fatal("TopK decodes it otherwise")
	}
	// Two encodings merge exactly, as top-k's.
	w := sparseLike(10000, 50, 4)
	m, err := MergeSparse(nil, b, Sparse{}.Encode(nil, w), len(x))
	if err != nil {
		t.Fatal(err)
	}
	var dec Decoder
	if err := dec.Decode(z, m); err != nil {
		t.Fatal(err)
	}
	for i := range x {
		if z[i] != x[i]+w[i] {
			t.Fatalf("merged value %d: %g, want %g", i, z[i], x[i]+w[i])
		}
	}
	// All zeros: a header and k = 0.
	if b := (Sparse{}).Encode(nil, make([]float32, 100)); len(b) > 4 {
		t.Fatalf("100 zeros take %d bytes", len(b))
	}
}

// BenchmarkSparse encodes and decodes a vector with one nonzero in 128
// (DeMo's density at its defaults).
//
//	go test -run '^$' -bench Sparse -benchtime 20x ./compression/
func BenchmarkSparse(b *testing.B) {
	x := sparseLike(1<<20, 128, 5)
	buf := Sparse{}.Encode(nil, x)
	b.Run("encode", func(b *testing.B) {
		b.SetBytes(int64(4 * len(x)))
		for b.Loop() {
			buf = Sparse{}.Encode(buf, x)
		}
		b.ReportMetric(float64(4*len(x))/float64(len(buf)), "ratio")
	})
	b.Run("decode", func(b *testing.B) {
		y := make([]float32, len(x))
		b.SetBytes(int64(4 * len(x)))
		for b.Loop() {
			if err := (Sparse{}).Decode(y, buf); err != nil {
				b.Fatal(err)
			}
		}
	})
}
