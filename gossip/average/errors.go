package average

import "errors"

// Errors returned by this package, wrapped with context; match them with
// errors.Is.
var (
	// ErrShape: vectors of different lengths where equal ones are required.
	ErrShape = errors.New("average: vector length mismatch")
	// ErrNonFinite: a NaN or Inf where a finite number is required.
	ErrNonFinite = errors.New("average: non-finite value")
	// ErrBadWeight: a push-sum weight that is not a finite number > 0.
	ErrBadWeight = errors.New("average: bad push-sum weight")
	// ErrUnknownPeer: an exchange with a peer the Exchanger cannot reach.
	ErrUnknownPeer = errors.New("average: unknown peer")
	// ErrNotDelivered: an exchange certainly did not reach the remote
	// handler (nothing was sent, or the remote refused it before applying
	// it). A push-sum sender re-absorbs a share that failed this way, so
	// no mass is lost; after any other error the share's fate is unknown.
	ErrNotDelivered = errors.New("average: not delivered")
)
