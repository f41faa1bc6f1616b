package data

import (
	"errors"
	"testing"
)

func TestWindowsShift(t *testing.T) {
	tokens := make([]int32, 23)
	for i := range tokens {
		tokens[i] = int32(i * 3 % 50)
	}
	for _, c := range []struct {
		vocab, seq, stride, n int
	}{
		{50, 4, 0, 5},      // starts 0, 4, …, 16: the window at 20 lacks its last target
		{50, 4, 1, 19},     // every start up to 18
		{50, 22, 0, 1},     // exactly one window
		{1 << 20, 5, 3, 6}, // 32-bit storage
		{65536, 5, 3, 6},   // the largest 16-bit vocabulary
		{65537, 6, 0, 3},   // the smallest 32-bit one
	} {
		w, err := NewWindows(tokens, c.vocab, c.seq, c.stride)
		if err != nil {
			t.Fatal(err)
		}
		if w.Len() != c.n || w.Targets() != c.seq || w.NumClasses() != c.vocab || InputSize(w) != c.seq || w.Tokens() != 23 {
			t.Fatalf("%+v: len %d targets %d classes %d", c, w.Len(), w.Targets(), w.NumClasses())
		}
		idx := []int{w.Len() - 1, 0}
		x, y := make([]float32, 2*c.seq), make([]int32, 2*c.seq)
		w.Batch(idx, x, y)
		for k, i := range idx {
			s := w.Start(i)
			for j := range c.seq {
				if x[k*c.seq+j] != float32(tokens[s+j]) || y[k*c.seq+j] != tokens[s+j+1] {
					t.Fatalf("%+v: window %d position %d: x %v y %v, want %v %v", c, i, j, x[k*c.seq+j], y[k*c.seq+j], tokens[s+j], tokens[s+j+1])
				}
			}
		}
	}
}

func TestWindowsBad(t *testing.T) {
	tokens := []int32{1, 2, 3, 4}
	for _, c := range []struct {
		name               string
		tokens             []int32
		vocab, seq, stride int
		want               error
	}{
		{"too short", tokens, 5, 4, 0, ErrTooShort},
		{"no tokens", nil, 5, 1, 0, ErrTooShort},
		{"token out of range", tokens, 4, 2, 0, ErrLabelRange},
		{"negative token", []int32{0, -1}, 4, 1, 0, ErrLabelRange},
		{"zero length", tokens, 5, 0, 0, ErrConfig},
		{"negative stride", tokens, 5, 2, -1, ErrConfig},
		{"no vocabulary", tokens, 0, 2, 0, ErrConfig},
	} {
		_, err := NewWindows(c.tokens, c.vocab, c.seq, c.stride)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: err = %v, want %v", c.name, err, c.want)
		}
	}
}

// TestTextWindows: a corpus split, its vocabulary and its windows make a
// Dataset the Iterator walks, whose targets decode to the text shifted by
// one.
func TestTextWindows(t *testing.T) {
	c := corpusOf("func main() {}\n", "package λ\n", "var x = 1\n", "// ✓ done\n")
	tr, va, err := c.Split(0.25, 1)
	if err != nil || len(va.Docs) != 1 {
		t.Fatal(err)
	}
	v, err := NewVocab(tr, RuneLevel)
	if err != nil {
		t.Fatal(err)
	}
	w, err := TextWindows(tr, v, 8, 0)
	if err != nil {
		t.Fatal(err)
	}
	var stream []int32
	for _, d := range tr.Docs {
		stream = v.Encode(stream, d.Text)
	}
	if w.Tokens() != len(stream) || w.Len() != (len(stream)-9)/8+1 {
		t.Fatalf("%d tokens, %d windows", w.Tokens(), w.Len())
	}
	it := NewIterator(w, 2, 7)
	seen := 0
	for it.Next() {
		x, y := it.Batch()
		for k := 0; k < len(x)/8; k++ {
			in, out := make([]int32, 8), y[k*8:(k+1)*8]
			for j := range in {
				in[j] = int32(x[k*8+j])
			}
			if string([]rune(string(v.Decode(nil, in)))[1:]) != string([]rune(string(v.Decode(nil, out)))[:7]) {
				t.Fatalf("targets %q are not inputs %q shifted by one", v.Decode(nil, out), v.Decode(nil, in))
			}
		}
		seen += len(x) / 8
	}
	if seen != w.Len() {
		t.Fatalf("an epoch visits %d of %d windows", seen, w.Len())
	}
	if _, err := Partition(w, 2, "iid", 1); err != nil {
		t.Fatalf("iid over windows: %v", err)
	}
	if _, err := Partition(w, 2, "shards", 1); !errors.Is(err, ErrUnlabeled) {
		t.Fatalf("shards over windows: err = %v, want ErrUnlabeled", err)
	}
	if _, err := TextWindows(va, v, 64, 0); !errors.Is(err, ErrTooShort) {
		t.Fatalf("a split shorter than a window: err = %v", err)
	}
}
