package gossip

import "errors"

// Errors returned by this package; match them with errors.Is.
var (
	// ErrBadConfig: a Config field is out of range.
	ErrBadConfig = errors.New("gossip: bad config")
	// ErrClosed: the control plane was closed.
	ErrClosed = errors.New("gossip: closed")
)
