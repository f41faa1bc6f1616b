package mux

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/libp2p/go-libp2p/core/network"
)

// ID is the multistream protocol ID of this muxer.
const ID = "/starling/mux/1.0.0"

// headerLen is the length of a frame header (see doc.go).
const headerLen = 12

// Frame types (see doc.go).
const (
	typeData   uint8 = 0
	typeWindow uint8 = 1
	typeReset  uint8 = 2
	typeGoAway uint8 = 3
)

// Frame flags.
const (
	flagSYN uint8 = 1 << 0
	flagFIN uint8 = 1 << 1
	flagACK uint8 = 1 << 2 // the stream was accepted: the opener may open another
)

// initialWindow is the send credit every new stream starts with, by
// protocol: a receiver may grant more at once.
const initialWindow = 256 << 10

// maxFrameLen bounds a data frame's payload; a longer frame is a protocol
// violation.
const maxFrameLen = 16 << 20

// Errors a connection or stream returns.
var (
	// ErrProtocol: the peer broke the wire protocol (unknown frame type,
	// payload beyond its credit or maxFrameLen, a stream id reused); the
	// connection is closed.
	ErrProtocol = errors.New("mux: protocol violation")
	// ErrConnClosed: the connection is closed (locally, by the peer's
	// GoAway or by an I/O error). Stream errors wrap it together with
	// network.ErrReset.
	ErrConnClosed = errors.New("mux: connection closed")
	// ErrWriteClosed: Write after CloseWrite or Close.
	ErrWriteClosed = errors.New("mux: write on a stream closed for writing")
	// ErrReadClosed: Read after CloseRead or Close.
	ErrReadClosed = errors.New("mux: read on a stream closed for reading")
)

// header is a decoded frame header.
type header struct {
	typ, flags uint8
	id         uint32
	length     uint32
}

// put encodes h into b (headerLen bytes).
func (h header) put(b []byte) {
	_ = b[headerLen-1]
	b[0], b[1], b[2], b[3] = h.typ, h.flags, 0, 0
	binary.BigEndian.PutUint32(b[4:], h.id)
	binary.BigEndian.PutUint32(b[8:], h.length)
}

// parseHeader decodes and checks a frame header.
func parseHeader(b []byte) (header, error) {
	h := header{typ: b[0], flags: b[1], id: binary.BigEndian.Uint32(b[4:]), length: binary.BigEndian.Uint32(b[8:])}
	switch {
	case h.typ > typeGoAway:
		return h, fmt.Errorf("%w: frame type %d", ErrProtocol, h.typ)
	case h.typ == typeData && h.length > maxFrameLen:
		return h, fmt.Errorf("%w: data frame of %d bytes over %d", ErrProtocol, h.length, maxFrameLen)
	case h.id == 0 && h.typ != typeGoAway:
		return h, fmt.Errorf("%w: stream id 0", ErrProtocol)
	}
	return h, nil
}

// connError is what streams return once the connection is gone.
type connError struct{ cause error }

func (e *connError) Error() string {
	return fmt.Sprintf("mux: stream ended with its connection: %v", e.cause)
}

func (e *connError) Unwrap() []error { return []error{network.ErrReset, ErrConnClosed, e.cause} }
