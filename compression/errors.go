package compression

import "errors"

// Errors returned by this package. Callers match them with errors.Is; the
// returned errors wrap them with the detail of what was wrong.
var (
	// ErrBadSpec reports a codec spec that Parse cannot read: an unknown
	// name, an unknown key, or a value out of range.
	ErrBadSpec = errors.New("compression: bad codec spec")
	// ErrUnknownCodec reports a wire id this build cannot decode.
	ErrUnknownCodec = errors.New("compression: unknown codec id")
	// ErrCorrupt reports encoded bytes that are malformed: truncated,
	// trailing garbage, an out-of-range field or index.
	ErrCorrupt = errors.New("compression: corrupt input")
	// ErrLength reports encoded bytes whose vector length differs from the
	// length of the destination. The destination's length is the authority.
	ErrLength = errors.New("compression: vector length mismatch")
	// ErrTooLarge reports entropy-coded bytes that would decompress to more
	// than any valid encoding of the destination's length.
	ErrTooLarge = errors.New("compression: decoded size over bound")
	// ErrState reports codec state (a checkpoint) that does not fit the codec.
	ErrState = errors.New("compression: bad codec state")
)
