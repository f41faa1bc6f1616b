package wire

import "errors"

// Errors returned by the decoders, wrapped with context; match them with
// errors.Is.
var (
	// ErrMalformed: bytes that do not decode as a control message.
	ErrMalformed = errors.New("wire: malformed message")
	// ErrVersion: a control message in another wire format version than
	// FormatVersion, from a peer running another Starling release.
	ErrVersion = errors.New("wire: sender runs another Starling wire version")
	// ErrTooLarge: a message (or one of its fields) exceeds its size cap.
	ErrTooLarge = errors.New("wire: message too large")
	// ErrNonFinite: a NaN or Inf where a finite number is required.
	ErrNonFinite = errors.New("wire: non-finite value")
)
