package compression

import (
	"errors"
	"fmt"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
)

// EntropyMode selects the entropy stage's compressor.
type EntropyMode uint8

// Entropy modes; the values are on the wire (the byte after the id).
const (
	// EntropyStored marks a message the stage left uncompressed because
	// compressing it did not pay. It is never a configured mode.
	EntropyStored EntropyMode = 0
	// EntropyS2 is klauspost/compress/s2: LZ77 only, several GB/s; it wins
	// only on long repeats (runs of zeros).
	EntropyS2 EntropyMode = 1
	// EntropyZstd is klauspost/compress/zstd at SpeedFastest: LZ77 plus
	// Huffman/FSE, so it also squeezes skewed byte distributions (the index
	// gaps of top-k, the exponent bytes of fp16).
	EntropyZstd EntropyMode = 2
)

// String returns "s2", "zstd" or "stored".
func (m EntropyMode) String() string {
	switch m {
	case EntropyS2:
		return "s2"
	case EntropyZstd:
		return "zstd"
	case EntropyStored:
		return "stored"
	}
	return fmt.Sprintf("EntropyMode(%d)", uint8(m))
}

// minSaving is the fraction of the inner bytes the entropy stage must save
// for a message to be sent compressed; otherwise it is stored (one byte of
// overhead), so the stage never costs more than a byte on the wire.
const minSaving = 1.0 / 32

// Entropy wraps a codec's bytes in zstd or S2. Per message it keeps the
// compressed form only when it saves at least 1/32 of the bytes and
// otherwise stores them; Parse turns the stage on by default only for the
// codecs where it measurably pays (see the package documentation).
//
// Decoding bounds the decompressed size by MaxEncodedLen of the inner id for
// the destination's length before decompressing anything, so a small message
// cannot expand into a large allocation.
//
// Wire: byte inner id | IDEntropy, byte mode (EntropyStored, EntropyS2,
// EntropyZstd), then the inner encoding, compressed unless stored. Entropy
// holds scratch and coder state: it is not safe for concurrent use.
type Entropy struct {
	inner Codec
	mode  EntropyMode
	buf   []byte
	enc   *zstd.Encoder
	dec   *zstd.Decoder
}

var _ Codec = (*Entropy)(nil)

// NewEntropy wraps inner with the entropy stage in mode (EntropyS2 or
// EntropyZstd).
func NewEntropy(inner Codec, mode EntropyMode) (*Entropy, error) {
	if mode != EntropyS2 && mode != EntropyZstd {
		return nil, fmt.Errorf("%w: entropy mode %v", ErrBadSpec, mode)
	}
	if _, ok := inner.(*Entropy); ok {
		return nil, fmt.Errorf("%w: entropy stage applied twice", ErrBadSpec)
	}
	return &Entropy{inner: inner, mode: mode}, nil
}

// Inner returns the wrapped codec.
func (e *Entropy) Inner() Codec { return e.inner }

var _ Stateful = (*Entropy)(nil)

// AppendState implements Stateful: the inner codec's state, if any.
func (e *Entropy) AppendState(dst []byte) []byte { return AppendState(dst, e.inner) }

// LoadState implements Stateful.
func (e *Entropy) LoadState(b []byte) error { return LoadState(e.inner, b) }

// Mode returns the configured mode.
func (e *Entropy) Mode() EntropyMode { return e.mode }

// ID implements Codec: the inner id with IDEntropy set.
func (e *Entropy) ID() ID { return e.inner.ID() | IDEntropy }

// Name implements Codec.
func (e *Entropy) Name() string { return addParam(specOf(e.inner), "entropy="+e.mode.String()) }

// Encode implements Codec.
func (e *Entropy) Encode(dst []byte, src []float32) []byte {
	e.buf = e.inner.Encode(e.buf, src)
	return e.wrapID(dst, e.buf, e.inner.ID())
}

// wrapID writes the entropy framing of the encoding p of the codec id.
func (e *Entropy) wrapID(dst, p []byte, id ID) []byte {
	limit := len(p) - int(float64(len(p))*minSaving)
	out := e.compress(append(dst[:0], 0, 0), p)
	if len(out)-2 >= limit || len(out)-2 >= len(p) {
		out = resize(out, 2+len(p))
		copy(out[2:], p)
		out[1] = byte(EntropyStored)
	} else {
		out[1] = byte(e.mode)
	}
	out[0] = byte(id | IDEntropy)
	return out
}

// compress appends the compressed form of p to dst.
func (e *Entropy) compress(dst, p []byte) []byte {
	switch e.mode {
	case EntropyS2:
		n := len(dst)
		dst = resize(dst, n+s2.MaxEncodedLen(len(p)))
		c := s2.Encode(dst[n:], p)
		return dst[:n+len(c)]
	case EntropyZstd:
		if e.enc == nil {
			enc, err := zstd.NewWriter(nil,
				zstd.WithEncoderLevel(zstd.SpeedFastest),
				zstd.WithEncoderConcurrency(1),
				zstd.WithEncoderCRC(false),
				zstd.WithZeroFrames(true),
				// The fast levels skip Huffman-coding literals that look
				// incompressible; codec output is nearly all literals
				// whose gain is in the Huffman stage, so always try it.
				zstd.WithAllLitEntropyCompression(true))
			if err != nil {
				panic(err) // constant options: cannot fail
			}
			e.enc = enc
		}
		return e.enc.EncodeAll(p, dst)
	}
	return append(dst, p...)
}

// Decode implements Codec.
func (e *Entropy) Decode(dst []float32, src []byte) error {
	p, err := e.unwrap(src, e.inner.ID(), len(dst))
	if err != nil {
		return err
	}
	return e.inner.Decode(dst, p)
}

// unwrap returns the inner encoding held in the entropy-framed src, whose
// inner codec is id and vector length n. The result may alias src or e.buf.
func (e *Entropy) unwrap(src []byte, id ID, n int) ([]byte, error) {
	if len(src) < 2 {
		return nil, fmt.Errorf("%w: entropy frame of %d bytes", ErrCorrupt, len(src))
	}
	if ID(src[0]) != id|IDEntropy {
		return nil, fmt.Errorf("%w: id %#x, want %#x", ErrCorrupt, src[0], id|IDEntropy)
	}
	bound := MaxEncodedLen(id, n)
	p := src[2:]
	switch EntropyMode(src[1]) {
	case EntropyStored:
		return p, nil
	case EntropyS2:
		l, err := s2.DecodedLen(p)
		if err != nil {
			return nil, fmt.Errorf("%w: s2: %v", ErrCorrupt, err)
		}
		if l > bound {
			return nil, fmt.Errorf("%w: s2 block of %d bytes, at most %d for %d values", ErrTooLarge, l, bound, n)
		}
		e.buf = resize(e.buf, l)
		out, err := s2.Decode(e.buf, p)
		if err != nil {
			return nil, fmt.Errorf("%w: s2: %v", ErrCorrupt, err)
		}
		return out, nil
	case EntropyZstd:
		var h zstd.Header
		if err := h.Decode(p); err != nil {
			return nil, fmt.Errorf("%w: zstd: %v", ErrCorrupt, err)
		}
		// With a content size in the header, check it before allocating;
		// without one, the bound itself caps the output.
		limit := bound
		if h.HasFCS {
			if h.FrameContentSize > uint64(bound) {
				return nil, fmt.Errorf("%w: zstd frame of %d bytes, at most %d for %d values", ErrTooLarge, h.FrameContentSize, bound, n)
			}
			limit = int(h.FrameContentSize)
		}
		if e.dec == nil {
			dec, err := zstd.NewReader(nil,
				zstd.WithDecoderConcurrency(1),
				zstd.WithDecodeAllCapLimit(true),
				zstd.WithDecoderMaxMemory(1<<40))
			if err != nil {
				panic(err) // constant options: cannot fail
			}
			e.dec = dec
		}
		// The capacity caps DecodeAll's output (WithDecodeAllCapLimit): a
		// frame that lies about its size, or more frames after it, fail.
		buf := resize(e.buf, limit)[:0:limit]
		out, err := e.dec.DecodeAll(p, buf)
		if cap(out) >= cap(e.buf) {
			e.buf = out[:0]
		}
		if errors.Is(err, zstd.ErrDecoderSizeExceeded) {
			return nil, fmt.Errorf("%w: zstd output over %d bytes for %d values", ErrTooLarge, limit, n)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: zstd: %v", ErrCorrupt, err)
		}
		if h.HasFCS && len(out) != limit {
			return nil, fmt.Errorf("%w: zstd frame decoded to %d bytes, header says %d", ErrCorrupt, len(out), limit)
		}
		return out, nil
	}
	return nil, fmt.Errorf("%w: entropy mode %d", ErrCorrupt, src[1])
}
