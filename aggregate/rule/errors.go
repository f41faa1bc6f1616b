package rule

import "errors"

// Errors returned by this package, wrapped with context; match them with
// errors.Is.
var (
	// ErrBadSpec means a rule spec (a --aggregate flag value) does not parse.
	ErrBadSpec = errors.New("rule: bad rule spec")
	// ErrBadInput means a reducer was called with inconsistent shapes,
	// negative or non-finite weights, or a non-finite value.
	ErrBadInput = errors.New("rule: bad reducer input")
	// ErrTooFewInputs means a rule cannot run on this many contributions,
	// e.g. Krum with f=2 needs at least 2f+3 = 7.
	ErrTooFewInputs = errors.New("rule: too few contributions for the rule")
	// ErrZeroWeight means a weighted mean was asked of contributions whose
	// weights sum to zero.
	ErrZeroWeight = errors.New("rule: weights sum to zero")
)
