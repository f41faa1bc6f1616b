package node

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"

	"github.com/starling-ml/starling/compression"
	"github.com/starling-ml/starling/internal/crc32c"
)

// Tag identifies a tensor between a sender and a receiver: Recv(peer, tag)
// gets the tensor that peer sent with that tag. Its meaning belongs to the
// protocol above (e.g. round<<32 | chunk); node/ only matches it.
type Tag uint64

// DType is the element type of a tensor (after decoding its codec).
type DType uint8

// Element types. The values are wire values and never change meaning.
const (
	Float32  DType = 1
	Float16  DType = 2
	BFloat16 DType = 3
	Int8     DType = 4
	Uint8    DType = 5
	Int32    DType = 6
	Int64    DType = 7
	Float64  DType = 8
)

// Size returns the size of one element in bytes, or 0 for an unknown dtype.
func (d DType) Size() int {
	switch d {
	case Int8, Uint8:
		return 1
	case Float16, BFloat16:
		return 2
	case Float32, Int32:
		return 4
	case Int64, Float64:
		return 8
	}
	return 0
}

// Valid reports whether d names a known dtype.
func (d DType) Valid() bool { return d.Size() != 0 }

func (d DType) String() string {
	switch d {
	case Float32:
		return "float32"
	case Float16:
		return "float16"
	case BFloat16:
		return "bfloat16"
	case Int8:
		return "int8"
	case Uint8:
		return "uint8"
	case Int32:
		return "int32"
	case Int64:
		return "int64"
	case Float64:
		return "float64"
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// MaxDims is the largest tensor rank a frame can carry.
const MaxDims = 8

// Wire format of one frame (all integers little-endian):
//
//	off  size  field
//	0    4     magic "STNF"
//	4    1     wire version (1)
//	5    1     codec id (compression.ID)
//	6    1     dtype
//	7    1     ndim (0..8)
//	8    2     stripe index
//	10   2     stripe count (>= 1)
//	12   4     flags: bit 0 = the payload has no checksum (its trailer is 0),
//	           sent only on a connection whose transport authenticates
//	           every byte (TLS, Noise, QUIC); other bits reserved, 0
//	16   8     tag
//	24   8     model version
//	32   8     step
//	40   8     total payload length of the tensor (all stripes)
//	48   8*n   shape
//	..   4     CRC-32C of the header bytes above
//	..   L     this stripe's payload bytes
//	..   4     CRC-32C of this stripe's payload (trailer)
//
// A tensor of total length T sent as S stripes puts bytes
// [stripeOffset(T,S,i), +stripeLen(T,S,i)) in stripe i; the receiver derives
// both from the header, so stripes cannot overlap or leave holes. The payload
// checksum trails the payload so that a sender checksums and writes in one
// pass over cache-hot bytes; the receiver verifies it before handing the
// tensor to anyone.
const (
	frameMagic     = "STNF"
	frameVersion   = 1
	fixedHeaderLen = 48
	maxHeaderLen   = fixedHeaderLen + 8*MaxDims + 4
	trailerLen     = 4
	// flagNoChecksum marks a frame whose payload trailer is 0, unchecked.
	flagNoChecksum = 1
	// maxStripes bounds the stripe count a receiver accepts.
	maxStripes = 64
)

// header is the decoded fixed part of a frame.
type header struct {
	flags   uint32
	codec   compression.ID
	dtype   DType
	ndim    uint8
	stripe  uint16
	stripes uint16
	tag     Tag
	version uint64
	step    uint64
	length  uint64 // total payload bytes of the tensor
	shape   [MaxDims]uint64
}

// stripeLen returns the length of stripe i when total bytes are split into n
// stripes: the first total%n stripes are one byte longer.
func stripeLen(total uint64, n, i uint16) uint64 {
	l := total / uint64(n)
	if uint64(i) < total%uint64(n) {
		l++
	}
	return l
}

// stripeOffset returns the offset of stripe i (see stripeLen).
func stripeOffset(total uint64, n, i uint16) uint64 {
	base, rem := total/uint64(n), total%uint64(n)
	return uint64(i)*base + min(uint64(i), rem)
}

// sameTensor reports whether two stripe headers describe the same tensor.
func (h *header) sameTensor(o *header) bool {
	return h.codec == o.codec && h.dtype == o.dtype && h.ndim == o.ndim &&
		h.stripes == o.stripes && h.tag == o.tag && h.version == o.version &&
		h.step == o.step && h.length == o.length && h.shape == o.shape
}

// appendHeader appends the wire header of h to dst.
func appendHeader(dst []byte, h *header) []byte {
	start := len(dst)
	dst = append(dst, frameMagic...)
	dst = append(dst, frameVersion, byte(h.codec), byte(h.dtype), h.ndim)
	dst = binary.LittleEndian.AppendUint16(dst, h.stripe)
	dst = binary.LittleEndian.AppendUint16(dst, h.stripes)
	dst = binary.LittleEndian.AppendUint32(dst, h.flags)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(h.tag))
	dst = binary.LittleEndian.AppendUint64(dst, h.version)
	dst = binary.LittleEndian.AppendUint64(dst, h.step)
	dst = binary.LittleEndian.AppendUint64(dst, h.length)
	for i := 0; i < int(h.ndim); i++ {
		dst = binary.LittleEndian.AppendUint64(dst, h.shape[i])
	}
	return binary.LittleEndian.AppendUint32(dst, crc32c.Checksum(dst[start:]))
}

// errUnchecked refuses a frame without a payload checksum on a connection
// that does not authenticate its bytes.
var errUnchecked = fmt.Errorf("%w: payload without a checksum on an unauthenticated connection", ErrBadHeader)

// errNoFrame wraps a read error (deadline, reset) that came before the
// first byte of a frame: an idle stream ending, not a bad frame.
var errNoFrame = errors.New("node: no frame")

// readHeader reads one frame header from r into h, using buf as scratch, and
// validates it against maxBytes. It never allocates. io.EOF before the first
// byte is returned as io.EOF (a clean end of the stream).
func readHeader(r io.Reader, buf *[maxHeaderLen]byte, maxBytes uint64, h *header) error {
	if n, err := io.ReadFull(r, buf[:fixedHeaderLen]); err != nil {
		switch {
		case err == io.EOF:
			return io.EOF
		case n == 0:
			return fmt.Errorf("%w: %w", errNoFrame, err)
		}
		return truncated(err)
	}
	b := buf[:fixedHeaderLen]
	if string(b[0:4]) != frameMagic {
		return ErrBadMagic
	}
	if b[4] != frameVersion {
		return fmt.Errorf("%w: %d", ErrBadVersion, b[4])
	}
	ndim := b[7]
	if ndim > MaxDims {
		return fmt.Errorf("%w: rank %d > %d", ErrBadHeader, ndim, MaxDims)
	}
	n := fixedHeaderLen + 8*int(ndim)
	if _, err := io.ReadFull(r, buf[fixedHeaderLen:n+4]); err != nil {
		return truncated(err)
	}
	if got, want := crc32c.Checksum(buf[:n]), binary.LittleEndian.Uint32(buf[n:]); got != want {
		return fmt.Errorf("%w: header checksum", ErrBadHeader)
	}
	*h = header{
		flags:   binary.LittleEndian.Uint32(b[12:]),
		codec:   compression.ID(b[5]),
		dtype:   DType(b[6]),
		ndim:    ndim,
		stripe:  binary.LittleEndian.Uint16(b[8:]),
		stripes: binary.LittleEndian.Uint16(b[10:]),
		tag:     Tag(binary.LittleEndian.Uint64(b[16:])),
		version: binary.LittleEndian.Uint64(b[24:]),
		step:    binary.LittleEndian.Uint64(b[32:]),
		length:  binary.LittleEndian.Uint64(b[40:]),
	}
	for i := range int(ndim) {
		h.shape[i] = binary.LittleEndian.Uint64(buf[fixedHeaderLen+8*i:])
	}
	if h.flags&^flagNoChecksum != 0 {
		return fmt.Errorf("%w: reserved bits set", ErrBadHeader)
	}
	return h.validate(maxBytes)
}

// validate checks a header's fields against each other and against the
// receiver's size limit.
func (h *header) validate(maxBytes uint64) error {
	if !compression.Known(h.codec) {
		return fmt.Errorf("%w: %#x", ErrUnknownCodec, uint8(h.codec))
	}
	if !h.dtype.Valid() {
		return fmt.Errorf("%w: %d", ErrUnknownDType, uint8(h.dtype))
	}
	if h.length > maxBytes {
		return fmt.Errorf("%w: payload %d bytes > %d", ErrFrameTooLarge, h.length, maxBytes)
	}
	if h.stripes == 0 || h.stripes > maxStripes || h.stripe >= h.stripes ||
		(h.stripes > 1 && h.length < uint64(h.stripes)) {
		return fmt.Errorf("%w: stripe %d of %d for %d bytes", ErrBadHeader, h.stripe, h.stripes, h.length)
	}
	elems, err := numElems(h.shape[:h.ndim])
	if err != nil {
		return err
	}
	hi, logical := bits.Mul64(elems, uint64(h.dtype.Size()))
	if hi != 0 {
		return fmt.Errorf("%w: shape overflows", ErrShapeMismatch)
	}
	if logical > maxBytes {
		return fmt.Errorf("%w: decoded tensor %d bytes > %d", ErrFrameTooLarge, logical, maxBytes)
	}
	// Raw tensors (codec fp32 without the entropy stage carries raw
	// little-endian elements) have exactly one valid length.
	if h.codec == compression.IDFP32 && h.length != logical {
		return fmt.Errorf("%w: shape %v of %v needs %d bytes, frame has %d",
			ErrShapeMismatch, h.shape[:h.ndim], h.dtype, logical, h.length)
	}
	return nil
}

// numElems multiplies dims, reporting overflow as ErrShapeMismatch. A rank-0
// tensor is a scalar (one element).
func numElems(dims []uint64) (uint64, error) {
	n := uint64(1)
	for _, d := range dims {
		hi, lo := bits.Mul64(n, d)
		if hi != 0 || lo > math.MaxInt64 {
			return 0, fmt.Errorf("%w: shape overflows", ErrShapeMismatch)
		}
		n = lo
	}
	return n, nil
}

// readStripe reads one stripe payload into dst and its trailer, and verifies
// the checksum. chunk bounds each Read (so a caller can refresh deadlines
// between chunks through before); progress is called after each chunk.
func readStripe(r io.Reader, dst []byte, chunk int, before func() error, progress func(int)) error {
	var crc uint32
	for off := 0; off < len(dst); {
		if before != nil {
			if err := before(); err != nil {
				return err
			}
		}
		end := min(off+chunk, len(dst))
		n, err := io.ReadFull(r, dst[off:end])
		crc = crc32c.Update(crc, dst[off:off+n])
		off += n
		if progress != nil && n > 0 {
			progress(n)
		}
		if err != nil {
			return truncated(err)
		}
	}
	var tr [trailerLen]byte
	if _, err := io.ReadFull(r, tr[:]); err != nil {
		return truncated(err)
	}
	if binary.LittleEndian.Uint32(tr[:]) != crc {
		return ErrChecksum
	}
	return nil
}

// truncated maps an end of stream inside a frame to ErrTruncated; other read
// errors (reset, deadline) pass through for the caller to classify.
func truncated(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: %v", ErrTruncated, err)
	}
	return err
}

// decodeFrame decodes one complete single-stripe frame held in b, as a
// receiver would, into a buffer obtained from alloc (called with the
// validated payload length only), as on a connection that does not
// authenticate its bytes. It is the pure decoder behind the stream handler,
// used by the fuzz test.
func decodeFrame(r io.Reader, maxBytes uint64, alloc func(n int) []byte) (header, []byte, error) {
	var buf [maxHeaderLen]byte
	var h header
	if err := readHeader(r, &buf, maxBytes, &h); err != nil {
		return h, nil, err
	}
	if h.flags&flagNoChecksum != 0 {
		return h, nil, errUnchecked // r is no authenticated connection
	}
	n := stripeLen(h.length, h.stripes, h.stripe)
	dst := alloc(int(n))
	if uint64(len(dst)) < n {
		return h, nil, ErrShortBuffer
	}
	dst = dst[:n]
	if err := readStripe(r, dst, 1<<20, nil, nil); err != nil {
		return h, nil, err
	}
	return h, dst, nil
}

// appendFrame appends a whole single-stripe frame (header, payload, trailer)
// to dst; used by tests and the fuzz corpus.
func appendFrame(dst []byte, h *header, payload []byte) []byte {
	dst = appendHeader(dst, h)
	dst = append(dst, payload...)
	return binary.LittleEndian.AppendUint32(dst, crc32c.Checksum(payload))
}
