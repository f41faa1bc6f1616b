package compression

import (
	"fmt"
	"math"
)

// Stateful is implemented by codecs whose output depends on earlier calls:
// ErrorFeedback (its residual), PowerSGD (its warm-start Q and layout) and
// RandK (its step). Save the state with a checkpoint and load it into a codec
// built from the same spec to resume bit-exactly.
type Stateful interface {
	// AppendState appends the codec's state to dst and returns the result.
	AppendState(dst []byte) []byte
	// LoadState replaces the codec's state with one AppendState wrote. It
	// returns an error wrapping ErrState, and leaves the codec unchanged, if
	// b does not fit this codec.
	LoadState(b []byte) error
}

// AppendState appends c's state to dst: nothing for a stateless codec.
func AppendState(dst []byte, c Codec) []byte {
	if s, ok := c.(Stateful); ok {
		return s.AppendState(dst)
	}
	return dst
}

// LoadState loads a state AppendState wrote for a codec of the same spec.
func LoadState(c Codec, b []byte) error {
	if s, ok := c.(Stateful); ok {
		return s.LoadState(b)
	}
	if len(b) != 0 {
		return fmt.Errorf("%w: %s has no state, got %d bytes", ErrState, c.Name(), len(b))
	}
	return nil
}

// State format versions.
const (
	stateEF       = 0xef
	statePowerSGD = 0x70
	stateRandK    = 0x72
)

// ErrorFeedback wraps a lossy codec so that what one Encode does not send is
// sent later (Seide et al., 2014; Karimireddy et al., 2019): it keeps the
// residual e and encodes v = x + e, then sets e = v − decode(encode(v)).
// Summed over steps, the decoded vectors telescope to Σx − e_T: the running
// sum of what was sent tracks the running sum of inputs to within the last
// residual, which stays bounded for a contractive codec (top-k, sign, int8).
//
// The receiver needs nothing: ErrorFeedback's bytes are the inner codec's, its
// ID is the inner ID and Decode is the inner Decode. One ErrorFeedback serves
// one stream of vectors of one length; a vector of another length resets the
// residual. It is not safe for concurrent use.
//
// Cost: one pass to add the residual; for TopK and RandK the residual is
// updated while encoding, for other codecs by decoding into a scratch vector
// (one more pass and 4·n bytes of memory).
type ErrorFeedback struct {
	inner    Codec
	residual []float32
	scratch  []float32
}

var (
	_ Codec    = (*ErrorFeedback)(nil)
	_ Stateful = (*ErrorFeedback)(nil)
)

// NewErrorFeedback wraps inner, with a zero residual.
func NewErrorFeedback(inner Codec) *ErrorFeedback { return &ErrorFeedback{inner: inner} }

// Inner returns the wrapped codec.
func (e *ErrorFeedback) Inner() Codec { return e.inner }

// ID implements Codec: the inner codec's id.
func (e *ErrorFeedback) ID() ID { return e.inner.ID() }

// Name implements Codec: the inner name with the "ef" flag.
func (e *ErrorFeedback) Name() string { return nameOf(e) }

func (e *ErrorFeedback) spec() string { return addParam(specOf(e.inner), "ef") }

// Residual returns the current residual (nil before the first Encode). The
// slice is owned by the ErrorFeedback and changes on the next Encode.
func (e *ErrorFeedback) Residual() []float32 { return e.residual }

// Reset zeroes the residual.
func (e *ErrorFeedback) Reset() { clear(e.residual) }

// Encode implements Codec.
func (e *ErrorFeedback) Encode(dst []byte, src []float32) []byte {
	if len(e.residual) != len(src) {
		e.residual = make([]float32, len(src))
	}
	v := e.residual[:len(src)]
	for i, x := range src {
		v[i] += x
	}
	switch c := e.inner.(type) {
	case *TopK:
		out, _ := c.encode(dst, v, v)
		return out
	case *RandK:
		return c.encode(dst, v, v)
	}
	out := e.inner.Encode(dst, v)
	e.scratch = resizeF(e.scratch, len(v))
	if err := e.inner.Decode(e.scratch, out); err != nil {
		// Our own codec failed to decode its own output: a bug, not input.
		panic(fmt.Sprintf("compression: %s cannot decode its own output: %v", e.inner.Name(), err))
	}
	for i, d := range e.scratch {
		v[i] -= d
	}
	return out
}

// Decode implements Codec: the inner Decode.
func (e *ErrorFeedback) Decode(dst []float32, src []byte) error { return e.inner.Decode(dst, src) }

// AppendState implements Stateful: the residual, then the inner codec's state
// when it has one.
func (e *ErrorFeedback) AppendState(dst []byte) []byte {
	dst = append(dst, stateEF)
	dst = appendUvarint(dst, uint64(len(e.residual)))
	off := len(dst)
	dst = append(dst, make([]byte, 4*len(e.residual))...)
	putFloats(dst[off:], e.residual)
	if s, ok := e.inner.(Stateful); ok {
		dst = s.AppendState(dst)
	}
	return dst
}

// LoadState implements Stateful.
func (e *ErrorFeedback) LoadState(b []byte) error {
	r := reader{b: b}
	if r.byte() != stateEF && r.err == nil {
		return fmt.Errorf("%w: not an error-feedback state", ErrState)
	}
	n := r.uvarint()
	if r.err == nil && n > math.MaxInt32 {
		r.fail("residual of %d values", n)
	}
	p := r.bytes(4 * n)
	if r.err != nil {
		return fmt.Errorf("%w: %v", ErrState, r.err)
	}
	if s, ok := e.inner.(Stateful); ok {
		if err := s.LoadState(r.b); err != nil {
			return err
		}
	} else if len(r.b) != 0 {
		return fmt.Errorf("%w: %d trailing bytes", ErrState, len(r.b))
	}
	e.residual = make([]float32, n)
	getFloats(e.residual, p)
	return nil
}
