package node

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"math"
	"testing"

	"github.com/starling-ml/starling/compression"
)

func rawHeader(tag Tag, shape ...uint64) header {
	h := header{codec: compression.IDFP32, dtype: Float32, ndim: uint8(len(shape)), stripes: 1, tag: tag, version: 7, step: 42}
	n := uint64(1)
	for i, d := range shape {
		h.shape[i] = d
		n *= d
	}
	h.length = 4 * n
	return h
}

func TestFrameRoundTrip(t *testing.T) {
	h := rawHeader(99, 3, 5)
	payload := make([]byte, h.length)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	frame := appendFrame(nil, &h, payload)
	got, p, err := decodeFrame(bytes.NewReader(frame), 1<<20, func(n int) []byte { return make([]byte, n) })
	if err != nil {
		t.Fatal(err)
	}
	if !got.sameTensor(&h) || got.stripe != h.stripe {
		t.Fatalf("header: got %+v want %+v", got, h)
	}
	if !bytes.Equal(p, payload) {
		t.Fatal("payload differs")
	}
}

func TestStripeSplit(t *testing.T) {
	for _, total := range []uint64{1, 7, 64, 1000, 1<<20 + 3} {
		for _, n := range []uint16{1, 2, 3, 4, 7, 8} {
			if n > 1 && total < uint64(n) {
				continue
			}
			var next uint64
			for i := range n {
				if off := stripeOffset(total, n, i); off != next {
					t.Fatalf("total %d n %d stripe %d: offset %d want %d", total, n, i, off, next)
				}
				next += stripeLen(total, n, i)
			}
			if next != total {
				t.Fatalf("total %d n %d: stripes cover %d", total, n, next)
			}
		}
	}
}

// TestFrameBadInput covers every refusal the receiver makes: each gives its
// typed error, and the decoder never asks for a buffer larger than the
// limit.
func TestFrameBadInput(t *testing.T) {
	const limit = 1 << 16
	good := rawHeader(1, 16)
	payload := make([]byte, good.length)

	patchHeader := func(mut func(h *header)) []byte {
		h := good
		mut(&h)
		return appendFrame(nil, &h, payload)
	}
	rehash := func(b []byte, ndim int) []byte { // fix the header crc after a raw patch
		n := fixedHeaderLen + 8*ndim
		binary.LittleEndian.PutUint32(b[n:], stdCRC(b[:n]))
		return b
	}
	cases := []struct {
		name  string
		frame []byte
		want  error
	}{
		{"oversized length", patchHeader(func(h *header) { h.codec = compression.IDFP32 | compression.IDEntropy; h.length = 1 << 40 }), ErrFrameTooLarge},
		{"oversized decoded shape", patchHeader(func(h *header) { h.codec = compression.IDTopK; h.shape[0] = 1 << 30 }), ErrFrameTooLarge},
		{"shape overflow", patchHeader(func(h *header) { h.ndim = 3; h.shape = [MaxDims]uint64{1 << 40, 1 << 40, 1 << 40} }), ErrShapeMismatch},
		{"shape/length disagree", patchHeader(func(h *header) { h.shape[0] = 17 }), ErrShapeMismatch},
		{"unknown codec", patchHeader(func(h *header) { h.codec = 0x42 }), ErrUnknownCodec},
		{"unknown dtype", patchHeader(func(h *header) { h.dtype = 0 }), ErrUnknownDType},
		{"unknown dtype high", patchHeader(func(h *header) { h.dtype = 200 }), ErrUnknownDType},
		{"stripe out of range", patchHeader(func(h *header) { h.stripe, h.stripes = 2, 2 }), ErrBadHeader},
		{"zero stripes", patchHeader(func(h *header) { h.stripes = 0 }), ErrBadHeader},
		{"bad magic", func() []byte { b := appendFrame(nil, &good, payload); b[0] = 'X'; return b }(), ErrBadMagic},
		{"bad version", func() []byte { b := appendFrame(nil, &good, payload); b[4] = 9; return b }(), ErrBadVersion},
		{"header crc", func() []byte { b := appendFrame(nil, &good, payload); b[20] ^= 1; return b }(), ErrBadHeader},
		{"reserved bits", func() []byte { b := appendFrame(nil, &good, payload); b[12] = 2; return rehash(b, 1) }(), ErrBadHeader},
		{"unchecked on an unauthenticated stream", patchHeader(func(h *header) { h.flags = flagNoChecksum }), errUnchecked},
		{"rank too high", func() []byte { b := appendFrame(nil, &good, payload); b[7] = 9; return b }(), ErrBadHeader},
		{"checksum mismatch", func() []byte { b := appendFrame(nil, &good, payload); b[fixedHeaderLen+12] ^= 0xff; return b }(), ErrChecksum},
		{"truncated payload", appendFrame(nil, &good, payload)[:fixedHeaderLen+8+4+10], ErrTruncated},
		{"truncated trailer", func() []byte { b := appendFrame(nil, &good, payload); return b[:len(b)-2] }(), ErrTruncated},
		{"truncated header", appendFrame(nil, &good, payload)[:20], ErrTruncated},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := decodeFrame(bytes.NewReader(c.frame), limit, func(n int) []byte {
				if n > limit {
					t.Fatalf("asked to allocate %d > limit", n)
				}
				return make([]byte, n)
			})
			if !errors.Is(err, c.want) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
			if Reason(err) == "other" {
				t.Fatalf("no metrics reason for %v", err)
			}
		})
	}
}

func TestFrameCleanEOF(t *testing.T) {
	var buf [maxHeaderLen]byte
	var h header
	if err := readHeader(bytes.NewReader(nil), &buf, 1<<20, &h); err != io.EOF {
		t.Fatalf("empty stream: got %v want io.EOF", err)
	}
}

func stdCRC(b []byte) uint32 { return crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)) }

// FuzzDecodeFrame feeds arbitrary bytes to the receiver's frame decoder: it
// must return an error or a frame that re-encodes to the same bytes, never
// panic, and never ask for more than the limit.
func FuzzDecodeFrame(f *testing.F) {
	const limit = 1 << 16
	h := rawHeader(5, 2, 3)
	f.Add(appendFrame(nil, &h, make([]byte, h.length)))
	h2 := header{codec: compression.IDTopK | compression.IDEntropy, dtype: Float16, ndim: 1, stripe: 1, stripes: 3, tag: math.MaxUint64, length: 10}
	h2.shape[0] = 100
	f.Add(appendFrame(nil, &h2, make([]byte, stripeLen(10, 3, 1))))
	f.Add([]byte(frameMagic))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, p, err := decodeFrame(bytes.NewReader(b), limit, func(n int) []byte {
			if n > limit {
				t.Fatalf("asked to allocate %d > limit %d", n, limit)
			}
			return make([]byte, n)
		})
		if err != nil {
			if err == io.EOF && len(b) == 0 {
				return
			}
			if Reason(err) == "other" {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		again := appendFrame(nil, &h, p)
		if !bytes.Equal(again, b[:len(again)]) {
			t.Fatalf("decoded frame does not re-encode to its input")
		}
	})
}
