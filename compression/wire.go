package compression

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"unsafe"
)

// Every encoding starts with the same header:
//
//	byte    id         the codec id (with IDEntropy set for entropy-wrapped bytes)
//	uvarint n          the vector length
//
// followed by codec-specific fields and the payload. Multi-byte numbers are
// little-endian; floats are IEEE 754 bit patterns.

// nativeLE reports whether the machine is little-endian, in which case float32
// slices are copied to and from the wire with one memmove.
var nativeLE = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// maxUvarintLen64 is the longest uvarint.
const maxUvarintLen64 = binary.MaxVarintLen64

// headerLen returns the length of the common header for a vector of n.
func headerLen(n int) int { return 1 + uvarintLen(uint64(n)) }

// uvarintLen returns the number of bytes of the uvarint encoding of v.
func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

// putUvarint writes v at b[0:] and returns the number of bytes written.
func putUvarint(b []byte, v uint64) int { return binary.PutUvarint(b, v) }

// resize returns b resized to n bytes, reusing its backing array when it is
// large enough. The contents are not preserved when it has to allocate.
func resize(b []byte, n int) []byte {
	if cap(b) >= n {
		return b[:n]
	}
	return make([]byte, n)
}

// resizeF returns b resized to n floats, reusing its backing array when it is
// large enough.
func resizeF(b []float32, n int) []float32 {
	if cap(b) >= n {
		return b[:n]
	}
	return make([]float32, n)
}

// putHeader writes id and n at the start of b (which must have room) and
// returns the number of bytes written.
func putHeader(b []byte, id ID, n int) int {
	b[0] = byte(id)
	return 1 + putUvarint(b[1:], uint64(n))
}

// reader walks encoded bytes; every read checks bounds and records the first
// error, so decoders can read a whole header and check err once.
type reader struct {
	b   []byte
	err error
}

func (r *reader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: "+format, append([]any{ErrCorrupt}, args...)...)
	}
}

func (r *reader) byte() byte {
	if r.err != nil {
		return 0
	}
	if len(r.b) < 1 {
		r.fail("truncated")
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, k := binary.Uvarint(r.b)
	if k <= 0 || (k > 1 && r.b[k-1] == 0) {
		// Overlong forms are refused so that every value has one
		// encoding and MaxEncodedLen holds.
		r.fail("bad uvarint")
		return 0
	}
	r.b = r.b[k:]
	return v
}

func (r *reader) u64() uint64 {
	if r.err != nil {
		return 0
	}
	if len(r.b) < 8 {
		r.fail("truncated")
		return 0
	}
	v := binary.LittleEndian.Uint64(r.b)
	r.b = r.b[8:]
	return v
}

// bytes returns the next k bytes.
func (r *reader) bytes(k uint64) []byte {
	if r.err != nil {
		return nil
	}
	if uint64(len(r.b)) < k {
		r.fail("truncated: need %d bytes, have %d", k, len(r.b))
		return nil
	}
	v := r.b[:k]
	r.b = r.b[k:]
	return v
}

// end checks that every byte was consumed.
func (r *reader) end() error {
	if r.err == nil && len(r.b) != 0 {
		r.fail("%d trailing bytes", len(r.b))
	}
	return r.err
}

// header reads and checks the common header against the expected id and the
// destination length n.
func readHeader(src []byte, id ID, n int) (reader, error) {
	r := reader{b: src}
	got := ID(r.byte())
	m := r.uvarint()
	if r.err != nil {
		return r, r.err
	}
	if got != id {
		return r, fmt.Errorf("%w: id %d, want %d", ErrCorrupt, got, id)
	}
	if m != uint64(n) {
		return r, fmt.Errorf("%w: encoded %d values, destination has %d", ErrLength, m, n)
	}
	return r, nil
}

// putFloats writes src as little-endian float32s at the start of b.
func putFloats(b []byte, src []float32) {
	if len(src) == 0 {
		return
	}
	if nativeLE {
		copy(b, unsafe.Slice((*byte)(unsafe.Pointer(&src[0])), 4*len(src)))
		return
	}
	b = b[:4*len(src)]
	for i, v := range src {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
}

// getFloats reads len(dst) little-endian float32s from b.
func getFloats(dst []float32, b []byte) {
	if len(dst) == 0 {
		return
	}
	if nativeLE {
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), 4*len(dst)), b)
		return
	}
	b = b[:4*len(dst)]
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
}

// addFloats adds len(acc) little-endian float32s from b to acc.
func addFloats(acc []float32, b []byte) {
	b = b[:4*len(acc)]
	for i := range acc {
		acc[i] += math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
}

// getFloat reads the i-th little-endian float32 of b.
func getFloat(b []byte, i int) float32 {
	return math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
}

// putFloat writes v as the i-th little-endian float32 of b.
func putFloat(b []byte, i int, v float32) {
	binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
}

func putU64(b []byte, v uint64) { binary.LittleEndian.PutUint64(b, v) }

func formatUint(v uint64) string { return strconv.FormatUint(v, 10) }

func appendUvarint(b []byte, v uint64) []byte { return binary.AppendUvarint(b, v) }
