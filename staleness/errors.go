package staleness

import "errors"

// Errors returned by this package. Callers match them with errors.Is; the
// returned errors wrap them with context.
var (
	// ErrBadSpec: a policy spec string does not parse.
	ErrBadSpec = errors.New("staleness: bad policy spec")
	// ErrBadConfig: a Config field is out of range.
	ErrBadConfig = errors.New("staleness: bad config")
	// ErrFutureVersion: a contribution claims a base version newer than the
	// receiver's local version.
	ErrFutureVersion = errors.New("staleness: base version is in the future")
	// ErrShape: a vector's length differs from the model's.
	ErrShape = errors.New("staleness: vector length mismatch")
	// ErrNonFinite: a contribution holds a NaN or an Inf.
	ErrNonFinite = errors.New("staleness: non-finite value")
)
