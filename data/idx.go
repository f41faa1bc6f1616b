package data

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Errors returned by the IDX reader.
var (
	// ErrBadIDX reports a file that is not a well-formed IDX file.
	ErrBadIDX = errors.New("data: malformed IDX file")
	// ErrTruncated reports an IDX file shorter than its header says.
	ErrTruncated = errors.New("data: truncated IDX file")
)

// MaxIDXBytes bounds the payload an IDX header may claim, so a corrupt or
// hostile header cannot make the reader allocate without limit.
const MaxIDXBytes = 1 << 30

// IDX is a decoded IDX file of unsigned bytes (type code 0x08).
type IDX struct {
	Dims []int  // dimensions, outermost first
	Data []byte // row-major payload, product(Dims) bytes
}

// ReadIDX reads an IDX file of unsigned bytes from r. Gzip input is detected
// by its magic and decompressed transparently.
func ReadIDX(r io.Reader) (*IDX, error) {
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
	if magic[2] != 0x08 {
		return nil, fmt.Errorf("%w: element type 0x%02x, only unsigned byte (0x08) is supported", ErrBadIDX, magic[2])
	}
	nd := int(magic[3])
	if nd == 0 || nd > 4 {
		return nil, fmt.Errorf("%w: %d dimensions", ErrBadIDX, nd)
	}
	dims := make([]int, nd)
	total := 1
	for i := range dims {
		var d uint32
		if err := binary.Read(br, binary.BigEndian, &d); err != nil {
			return nil, fmt.Errorf("%w: reading dimension %d: %v", ErrTruncated, i, err)
		}
		dims[i] = int(d)
		if d == 0 {
			total = 0
		} else if total > MaxIDXBytes/int(d) {
			return nil, fmt.Errorf("%w: dimensions %v exceed %d bytes", ErrBadIDX, dims[:i+1], MaxIDXBytes)
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
		return nil, fmt.Errorf("%w: header %v promises %d bytes, file has %d", ErrTruncated, dims, total, n)
	}
	return &IDX{Dims: dims, Data: buf.Bytes()}, nil
}
