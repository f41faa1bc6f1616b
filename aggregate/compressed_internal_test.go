package aggregate

import (
	"bytes"
	"errors"
	"slices"
	"testing"

	"github.com/starling-ml/starling/compression"
)

func TestPackWords(t *testing.T) {
	for n := range 13 {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(0xf0 + i)
		}
		w := packWords(nil, b)
		if len(w) != (n+3)/4 {
			t.Fatalf("%d bytes in %d words", n, len(w))
		}
		if got := unpackWords(nil, w, n); !bytes.Equal(got, b) {
			t.Fatalf("%d bytes: %x, want %x", n, got, b)
		}
	}
}

// FuzzCompressedWire feeds arbitrary words to the compressed lanes' header
// decoder and arbitrary bytes to Compression.LoadState: errors, never
// panics, and what decodes re-encodes to the same words.
func FuzzCompressedWire(f *testing.F) {
	hw := make([]float32, encHeaderLen)
	header{cfg: 1, d: 2, weight: 3, nbytes: 4}.encode(hw)
	f.Add(wordsToBytes(hw))
	c, _ := newCompression(compression.MustSpec("powersgd:2,ef"))
	c.residual = []float32{1, 2, 3}
	f.Add(c.AppendState(nil))
	c, _ = newCompression(compression.MustSpec("topk:0.1,ef"))
	c.residual = []float32{1, 2, 3}
	f.Add(c.AppendState(nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		words := bytesToWords(b)
		if h, err := decodeHeader(words); err == nil {
			again := make([]float32, len(words))
			h.encode(again)
			if !slices.Equal(math32(again), math32(words)) {
				t.Fatalf("header %+v does not re-encode", h)
			}
		}
		if got := unpackWords(nil, packWords(nil, b), len(b)); !bytes.Equal(got, b) {
			t.Fatal("pack/unpack")
		}
		for _, spec := range []string{"topk:0.1,ef", "powersgd:2,ef", "fp16"} {
			c, _ := newCompression(compression.MustSpec(spec))
			err := c.LoadState(b)
			if err != nil {
				if !errors.Is(err, compression.ErrState) {
					t.Fatalf("%s: LoadState error %v does not wrap ErrState", spec, err)
				}
				continue
			}
			if again := c.AppendState(nil); !bytes.Equal(again, b) {
				t.Fatalf("%s: state does not re-encode", spec)
			}
		}
	})
}
