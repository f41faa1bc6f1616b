package compression

import (
	"bytes"
	"errors"
	"runtime"
	"testing"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
)

func TestEntropyRoundTripAndStore(t *testing.T) {
	x := gradLike(20000, 1)
	for _, mode := range []EntropyMode{EntropyS2, EntropyZstd} {
		for _, inner := range allCodecs() {
			e, err := NewEntropy(inner, mode)
			if err != nil {
				t.Fatal(err)
			}
			b := e.Encode(nil, x)
			if b[0] != byte(inner.ID()|IDEntropy) {
				t.Fatalf("%s: id byte %#x", e.Name(), b[0])
			}
			if len(b) > MaxEncodedLen(e.ID(), len(x)) {
				t.Fatalf("%s: %d bytes > MaxEncodedLen %d", e.Name(), len(b), MaxEncodedLen(e.ID(), len(x)))
			}
			y := make([]float32, len(x))
			mustDecode(t, e, y, b)
			// The entropy stage is lossless over the inner codec.
			plainInner, _ := New(inner.ID(), "")
			z := make([]float32, len(x))
			mustDecode(t, plainInner, z, inner.Encode(nil, x))
			if _, stateful := inner.(Stateful); !stateful && !bitsEqual(y, z) {
				t.Fatalf("%s: differs from the inner codec", e.Name())
			}
		}
	}
	// Random float32 bits do not compress: stored, one byte of overhead.
	e, _ := NewEntropy(FP32{}, EntropyZstd)
	r := randomBits(5000, nil2rand())
	b := e.Encode(nil, r)
	if EntropyMode(b[1]) != EntropyStored || len(b) != 2+len(FP32{}.Encode(nil, r)) {
		t.Fatalf("incompressible input: mode %v, %d bytes", EntropyMode(b[1]), len(b))
	}
	// Zeros compress.
	for _, mode := range []EntropyMode{EntropyS2, EntropyZstd} {
		e, _ := NewEntropy(FP32{}, mode)
		b := e.Encode(nil, make([]float32, 5000))
		if EntropyMode(b[1]) != mode || len(b) > 1000 {
			t.Fatalf("%v on zeros: mode %v, %d bytes", mode, EntropyMode(b[1]), len(b))
		}
	}
	if _, err := NewEntropy(FP16{}, EntropyStored); !errors.Is(err, ErrBadSpec) {
		t.Fatalf("stored mode: %v", err)
	}
	if _, err := NewEntropy(e, EntropyS2); !errors.Is(err, ErrBadSpec) {
		t.Fatalf("double wrap: %v", err)
	}
}

// heapGrowth runs f and returns how many bytes it allocated.
func heapGrowth(f func()) uint64 {
	var a, b runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&a)
	f()
	runtime.ReadMemStats(&b)
	return b.TotalAlloc - a.TotalAlloc
}

// A small message that would decompress to far more than any encoding of
// the destination's length is refused before anything large is allocated.
func TestEntropyDecompressionBomb(t *testing.T) {
	huge := make([]byte, 64<<20) // 64 MiB of zeros
	frame := func(mode EntropyMode, payload []byte) []byte {
		return append([]byte{byte(IDFP16 | IDEntropy), byte(mode)}, payload...)
	}
	enc, _ := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest))
	zFrame := enc.EncodeAll(huge, nil)
	var stream bytes.Buffer // a streamed frame carries no content size
	w, _ := zstd.NewWriter(&stream)
	w.Write(huge)
	w.Close()
	bombs := map[string][]byte{
		"zstd":            frame(EntropyZstd, zFrame),
		"zstd-no-size":    frame(EntropyZstd, stream.Bytes()),
		"zstd-two-frames": frame(EntropyZstd, append(enc.EncodeAll(make([]byte, 100), nil), zFrame...)),
		"s2":              frame(EntropyS2, s2.Encode(nil, huge)),
	}
	d, _ := New(IDFP16|IDEntropy, "")
	// A destination of 1000 values bounds any valid payload to ~2 KB.
	dst := make([]float32, 1000)
	// Warm the decoder so its own set-up is not counted.
	d.Decode(dst, frame(EntropyZstd, enc.EncodeAll(FP16{}.Encode(nil, dst), nil)))
	for name, b := range bombs {
		if len(b) > 1<<20 {
			t.Fatalf("%s: bomb of %d bytes is not small", name, len(b))
		}
		var err error
		grew := heapGrowth(func() { err = d.Decode(dst, b) })
		if !errors.Is(err, ErrTooLarge) {
			t.Errorf("%s: %v", name, err)
		}
		if grew > 4<<20 {
			t.Errorf("%s: decoding allocated %d bytes", name, grew)
		}
		t.Logf("%s (%d bytes): %v; allocated %d bytes", name, len(b), err, grew)
	}
	var dec Decoder
	if err := dec.Decode(dst, bombs["s2"]); !errors.Is(err, ErrTooLarge) {
		t.Errorf("Decoder, s2 bomb: %v", err)
	}
}
