package aggregate

import (
	"errors"
	"fmt"

	"github.com/starling-ml/starling/aggregate/rule"
	"github.com/starling-ml/starling/peerid"
)

// Errors returned by this package. They are wrapped with context; match them
// with errors.Is. Errors about one peer are *PeerError values whose Err wraps
// one of these sentinels, so errors.As gives the peer and errors.Is the cause.
var (
	// ErrBadInput, ErrTooFewInputs and ErrZeroWeight are package rule's:
	// the driver returns them for the same faults.
	ErrBadInput     = rule.ErrBadInput
	ErrTooFewInputs = rule.ErrTooFewInputs
	ErrZeroWeight   = rule.ErrZeroWeight
	// ErrInvalidConfig wraps every Config.Validate failure.
	ErrInvalidConfig = errors.New("aggregate: invalid config")

	// ErrEmptyGroup means a group was formed from no members.
	ErrEmptyGroup = errors.New("aggregate: empty group")
	// ErrNotMember means a peer is not in the group: this peer when it
	// calls AllReduce with a group that does not name it, or a peer outside
	// the group whose chunks were refused.
	ErrNotMember = errors.New("aggregate: peer is not a member of the group")
	// ErrGroupMismatch means peers derived different groups for a round
	// (their member-list digests differ).
	ErrGroupMismatch = errors.New("aggregate: peers disagree on the group")
	// ErrConfigMismatch means a peer runs the round with another rule,
	// algorithm or chunk size.
	ErrConfigMismatch = errors.New("aggregate: peers disagree on the round's settings")
	// ErrBadLength means a peer contributed a vector (or a chunk) of the
	// wrong length.
	ErrBadLength = errors.New("aggregate: contribution of the wrong length")
	// ErrBadValue means a peer sent NaN or ±Inf, or a malformed control
	// message.
	ErrBadValue = errors.New("aggregate: non-finite or malformed value")
	// ErrStall means a peer sent nothing that was expected of it within the
	// stall timeout (it died, froze, or is far too slow).
	ErrStall = errors.New("aggregate: peer stalled")
	// ErrUnreachable means sending to a peer failed.
	ErrUnreachable = errors.New("aggregate: peer unreachable")
	// ErrDisconnected (which wraps ErrUnreachable) means the transport
	// saw every connection to a peer close while waiting on it: the peer
	// died or the network between us failed.
	ErrDisconnected = fmt.Errorf("%w: its connection closed", ErrUnreachable)

	// ErrOverflow means the sum or mean of finite contributions overflows
	// float32. Every member fails the round with it; nobody re-runs.
	ErrOverflow = errors.New("aggregate: aggregate overflows float32")
	// ErrTooFewPeers means failures left fewer peers than Config.Quorum
	// allows.
	ErrTooFewPeers = errors.New("aggregate: too few peers left in the round")
	// ErrRoundFailed means the round did not complete in Config.MaxAttempts
	// attempts; it wraps the last attempt's cause.
	ErrRoundFailed = errors.New("aggregate: round failed")
	// ErrExcluded means the other members excluded this peer from the
	// round; it comes with a *PeerError naming this peer and the reason.
	ErrExcluded = errors.New("aggregate: this peer was excluded from the round")
	// ErrUnsupported means the algorithm cannot run the rule (the tree runs
	// linear rules only: sum and mean).
	ErrUnsupported = errors.New("aggregate: rule not supported by the algorithm")

	// ErrClosed is returned by a Transport or Mailbox after Close.
	ErrClosed = errors.New("aggregate: transport closed")
	// ErrStale means a chunk arrived for a round or attempt that is over.
	ErrStale = errors.New("aggregate: chunk for a finished round")
	// ErrDuplicateRecv means a Recv for the same (peer, tag) is already
	// waiting.
	ErrDuplicateRecv = errors.New("aggregate: a Recv for this peer and tag is already waiting")
	// ErrMailboxFull means a Mailbox holds its limit of undelivered chunks.
	ErrMailboxFull = errors.New("aggregate: mailbox full")
)

// PeerError is an error caused by (or about) one peer.
type PeerError struct {
	Peer peerid.ID
	Err  error // wraps one of the package's sentinels
}

func (e *PeerError) Error() string { return fmt.Sprintf("peer %s: %v", e.Peer, e.Err) }

// Unwrap returns e.Err.
func (e *PeerError) Unwrap() error { return e.Err }

// MismatchError is what Recv returns when a chunk with the requested
// (round, attempt, step, chunk) arrived from the peer but its group digest
// differs from the caller's: the two peers derived different groups.
type MismatchError struct {
	Peer      peerid.ID
	Got, Want uint64 // the peer's digest and ours
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("peer %s: group digest %016x, ours %016x: %v", e.Peer, e.Got, e.Want, ErrGroupMismatch)
}

// Unwrap returns ErrGroupMismatch.
func (e *MismatchError) Unwrap() error { return ErrGroupMismatch }
