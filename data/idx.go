package data

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
)

// Errors returned by the IDX reader and the dataset loaders.
var (
	// ErrBadIDX reports a file that is not a well-formed IDX file, or an
	// IDX pair that does not make a dataset.
	ErrBadIDX = errors.New("data: malformed IDX file")
	// ErrTruncated reports an IDX file shorter than its header says.
	ErrTruncated = errors.New("data: truncated IDX file")
	// ErrUnsupportedType reports an element type the reader or the loader
	// cannot use; it also matches ErrBadIDX.
	ErrUnsupportedType = fmt.Errorf("%w: unsupported element type", ErrBadIDX)
	// ErrLabelRange reports a label or token outside [0, classes).
	ErrLabelRange = errors.New("data: label out of range")
)

// MaxIDXBytes bounds the payload an IDX header may claim, so a corrupt or
// hostile header cannot make the reader allocate without limit.
const MaxIDXBytes = 1 << 30

// IDXType is an IDX element type: the third byte of the magic number.
type IDXType byte

// The element types the IDX format defines. Multi-byte elements are
// big-endian.
const (
	IDXUint8   IDXType = 0x08
	IDXInt8    IDXType = 0x09
	IDXInt16   IDXType = 0x0B
	IDXInt32   IDXType = 0x0C
	IDXFloat32 IDXType = 0x0D
	IDXFloat64 IDXType = 0x0E
)

// Size returns the bytes per element, or 0 for a code IDX does not define.
func (t IDXType) Size() int {
	switch t {
	case IDXUint8, IDXInt8:
		return 1
	case IDXInt16:
		return 2
	case IDXInt32, IDXFloat32:
		return 4
	case IDXFloat64:
		return 8
	}
	return 0
}

func (t IDXType) String() string {
	switch t {
	case IDXUint8:
		return "uint8"
	case IDXInt8:
		return "int8"
	case IDXInt16:
		return "int16"
	case IDXInt32:
		return "int32"
	case IDXFloat32:
		return "float32"
	case IDXFloat64:
		return "float64"
	}
	return fmt.Sprintf("IDXType(0x%02x)", byte(t))
}

// IDX is a decoded IDX file.
type IDX struct {
	Dims []int  // dimensions, outermost first
	Data []byte // row-major payload as stored: product(Dims)·Type.Size() bytes
	// Type is the element type; the zero value means IDXUint8, so an IDX
	// built by hand from bytes needs none.
	Type IDXType
}

func (x *IDX) elemType() IDXType {
	if x.Type == 0 {
		return IDXUint8
	}
	return x.Type
}

// Len returns the number of elements.
func (x *IDX) Len() int { return len(x.Data) / x.elemType().Size() }

// Float32s appends every element, converted to float32, to dst and returns
// the extended slice. Integers above 2²⁴ in magnitude and float64 values
// round to the nearest float32.
func (x *IDX) Float32s(dst []float32) []float32 { return appendIDX(dst, x) }

// ints returns every element of an integer-typed file, or an error
// wrapping ErrUnsupportedType for a float-typed one.
func (x *IDX) ints() ([]int64, error) {
	if t := x.elemType(); t == IDXFloat32 || t == IDXFloat64 {
		return nil, fmt.Errorf("%w: labels are %v, want an integer type", ErrUnsupportedType, t)
	}
	// Every integer type IDX defines is exact in float64.
	vals := appendIDX(make([]float64, 0, x.Len()), x)
	out := make([]int64, len(vals))
	for i, v := range vals {
		out[i] = int64(v)
	}
	return out, nil
}

// appendIDX appends x's elements, converted to T, to dst.
func appendIDX[T float32 | float64](dst []T, x *IDX) []T {
	b := x.Data
	switch x.elemType() {
	case IDXUint8:
		for _, v := range b {
			dst = append(dst, T(v))
		}
	case IDXInt8:
		for _, v := range b {
			dst = append(dst, T(int8(v)))
		}
	case IDXInt16:
		for i := 0; i+2 <= len(b); i += 2 {
			dst = append(dst, T(int16(binary.BigEndian.Uint16(b[i:]))))
		}
	case IDXInt32:
		for i := 0; i+4 <= len(b); i += 4 {
			dst = append(dst, T(int32(binary.BigEndian.Uint32(b[i:]))))
		}
	case IDXFloat32:
		for i := 0; i+4 <= len(b); i += 4 {
			dst = append(dst, T(math.Float32frombits(binary.BigEndian.Uint32(b[i:]))))
		}
	case IDXFloat64:
		for i := 0; i+8 <= len(b); i += 8 {
			dst = append(dst, T(math.Float64frombits(binary.BigEndian.Uint64(b[i:]))))
		}
	}
	return dst
}

// ReadIDX reads an IDX file of unsigned bytes from r; any other element
// type is an error wrapping ErrUnsupportedType. Gzip input is detected by
// its magic and decompressed transparently.
func ReadIDX(r io.Reader) (*IDX, error) {
	return readIDX(r, false)
}

// ReadIDXAny reads an IDX file of any element type the format defines
// from r, raw or gzip. Data holds the payload as stored (big-endian);
// Float32s converts it.
func ReadIDXAny(r io.Reader) (*IDX, error) {
	return readIDX(r, true)
}

func readIDX(r io.Reader, anyType bool) (*IDX, error) {
	br := bufio.NewReader(r)
	if head, err := br.Peek(2); err == nil && head[0] == 0x1f && head[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("%w: gzip: %v", ErrBadIDX, err)
		}
		defer zr.Close()
		br = bufio.NewReader(zr)
	}
	var magic [4]byte
	if _, err := io.ReadFull(br, magic[:]); err != nil {
		return nil, fmt.Errorf("%w: reading magic: %v", ErrTruncated, err)
	}
	if magic[0] != 0 || magic[1] != 0 {
		return nil, fmt.Errorf("%w: magic %x does not start with two zero bytes", ErrBadIDX, magic)
	}
	typ := IDXType(magic[2])
	switch {
	case typ.Size() == 0:
		return nil, fmt.Errorf("%w: code 0x%02x is no IDX type", ErrUnsupportedType, magic[2])
	case !anyType && typ != IDXUint8:
		return nil, fmt.Errorf("%w: %v (0x%02x), only unsigned byte (0x08) is supported here", ErrUnsupportedType, typ, magic[2])
	}
	nd := int(magic[3])
	if nd == 0 {
		return nil, fmt.Errorf("%w: 0 dimensions", ErrBadIDX)
	}
	dims := make([]int, nd)
	total := typ.Size()
	for i := range dims {
		var d uint32
		if err := binary.Read(br, binary.BigEndian, &d); err != nil {
			return nil, fmt.Errorf("%w: reading dimension %d: %v", ErrTruncated, i, err)
		}
		dims[i] = int(d)
		if d == 0 {
			total = 0
		} else if total > MaxIDXBytes/int(d) {
			return nil, fmt.Errorf("%w: dimensions %v of %v exceed %d bytes", ErrBadIDX, dims[:i+1], typ, MaxIDXBytes)
		} else {
			total *= int(d)
		}
	}
	// Read in bounded steps so a header that lies about the size costs at
	// most what the input really holds.
	var buf bytes.Buffer
	n, err := io.CopyN(&buf, br, int64(total))
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		return nil, fmt.Errorf("%w: %v", ErrBadIDX, err)
	}
	if n < int64(total) {
		return nil, fmt.Errorf("%w: header %v of %v promises %d bytes, file has %d", ErrTruncated, dims, typ, total, n)
	}
	return &IDX{Dims: dims, Data: buf.Bytes(), Type: typ}, nil
}
