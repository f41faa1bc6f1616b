package gossip

import "errors"

// Errors returned by this package; match them with errors.Is.
var (
	// ErrNonFinite: a NaN or Inf where a finite number is required.
	ErrNonFinite = errors.New("gossip: non-finite value")
	// ErrBadConfig: a Config field is out of range.
	ErrBadConfig = errors.New("gossip: bad config")
	// ErrClosed: the control plane was closed.
	ErrClosed = errors.New("gossip: closed")
	// ErrShape: vectors of different lengths where equal ones are required.
	ErrShape = errors.New("gossip: vector length mismatch")
	// ErrBadWeight: a push-sum weight that is not a finite number > 0.
	ErrBadWeight = errors.New("gossip: bad push-sum weight")
	// ErrUnknownPeer: an exchange with a peer the transport cannot reach.
	ErrUnknownPeer = errors.New("gossip: unknown peer")
)
