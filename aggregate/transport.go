package aggregate

import (
	"context"
	"fmt"

	"github.com/starling-ml/starling/peerid"
)

// Tag labels one chunk between a sender and a receiver. A receiver asks for
// the chunk with a given (Round, Attempt, Step, Chunk) from a given peer;
// Digest is then compared, not matched: a chunk whose digest differs from the
// receiver's means the two peers formed different groups, and Recv reports a
// *MismatchError instead of handing over the data as if all were well.
//
// The fields fit node/'s frame header: Digest in its tag, Round in its model
// version, and Attempt<<48 | Step<<32 | Chunk in its step.
type Tag struct {
	Round   uint64
	Digest  uint64
	Attempt uint16
	Step    Step
	Chunk   uint32
}

func (t Tag) String() string {
	return fmt.Sprintf("r%d/a%d/%v/%d@%016x", t.Round, t.Attempt, t.Step, t.Chunk, t.Digest)
}

// Step is the protocol step a chunk belongs to. The values are wire values.
type Step uint16

// Steps of the all-reduce protocol. In a compressed pass (see pass) every
// data lane opens with a header, gathers too, and the pass number sits in
// the top bits of the chunk index.
const (
	// StepScatter carries a contribution's shard to the shard's owner
	// (butterfly): chunk 0 is a header, chunk c+1 is data chunk c. The
	// ring sends chunk 0 alone, its header, to every member.
	StepScatter Step = 1
	// StepGather carries an owner's reduced shard to every peer
	// (butterfly): chunk c is data chunk c.
	StepGather Step = 2
	// StepStats carries an owner's statistics for pass c of a non-local
	// rule (Krum, centered clipping) to every other owner.
	StepStats Step = 3
	// StepUp carries a subtree's partial sum to its parent (tree): chunk
	// 0 is a header, chunk c+1 is data chunk c.
	StepUp Step = 4
	// StepDown carries the final result from parent to child (tree):
	// chunk 0 is a header, chunk c+1 is data chunk c.
	StepDown Step = 5
	// StepVote carries a peer's verdict on the attempt to every other
	// member.
	StepVote Step = 6
	// StepRing carries the ring's chunks to the right neighbour: chunk i
	// is the sender's i-th chunk (see ringPlan). Headers go to every
	// member as StepScatter chunk 0.
	StepRing Step = 7
)

func (s Step) String() string {
	switch s {
	case StepScatter:
		return "scatter"
	case StepGather:
		return "gather"
	case StepStats:
		return "stats"
	case StepUp:
		return "up"
	case StepDown:
		return "down"
	case StepVote:
		return "vote"
	case StepRing:
		return "ring"
	}
	return fmt.Sprintf("step(%d)", uint16(s))
}

// Transport moves tagged float32 chunks between peers. It is the seam
// between the all-reduce driver and the network: node/ implements it over
// libp2p streams, aggtest over an in-memory network.
//
// Implementations are safe for concurrent use: the driver sends to and
// receives from many peers at once, and may send several chunks to one peer
// concurrently (matching is by tag, so order between tags does not matter).
type Transport interface {
	// Send delivers data to peer to under tag. It returns once data has
	// been handed off; the caller may then reuse data. It honours ctx and
	// fails (wrapping ErrClosed once this transport is closed) rather than
	// block past its deadline.
	Send(ctx context.Context, to peerid.ID, tag Tag, data []float32) error
	// Recv waits for the chunk that peer from sent under tag and copies it
	// into dst, which must have exactly the chunk's length (else a
	// *PeerError wrapping ErrBadLength). A digest that differs from
	// tag.Digest gives a *MismatchError. Recv returns ctx's error when ctx
	// ends first, and ErrClosed after Close. A transport that learns that
	// from's connection closed (from died) fails the Recv with a *PeerError
	// wrapping ErrDisconnected rather than wait out ctx. At most one Recv
	// may wait for a given (from, tag).
	Recv(ctx context.Context, from peerid.ID, tag Tag, dst []float32) error
}

// FiniteReceiver is implemented by transports that can tell, in a pass
// they make anyway, that a chunk holds no NaN or ±Inf (node/'s checks it
// with a plaintext frame's checksum); the driver then skips its own check.
type FiniteReceiver interface {
	// RecvFinite is Transport.Recv; finite reports that every value
	// copied into dst was checked finite. False says nothing.
	RecvFinite(ctx context.Context, from peerid.ID, tag Tag, dst []float32) (finite bool, err error)
}

// AxpyReceiver is implemented by transports that can add the receiver's
// own contribution to a partial sum as it arrives (node.RecvAxpy), saving
// a copy and a pass over dst, and that can send a chunk on with the
// checksums they made of it as it arrived, saving another. The ring sums
// on arrival where its backend's AxpyFinite is device.AxpyTo's kernel
// (device.AxpyToRuns).
type AxpyReceiver interface {
	// RecvAxpy is RecvFinite that, with x not nil, may also set dst =
	// alpha·x + the received chunk, value by value with device.AxpyTo.
	RecvAxpy(ctx context.Context, from peerid.ID, tag Tag, dst []float32, alpha float32, x []float32) (Received, error)
	// SendReceived is Send of data, which holds what a RecvAxpy that
	// returned sums delivered, unchanged since.
	SendReceived(ctx context.Context, to peerid.ID, tag Tag, data []float32, sums Checksums) error
}

// Received is what RecvAxpy reports of a chunk.
type Received struct {
	// Summed says dst = alpha·x + the chunk; then In reports that every
	// received value was finite and Out that every sum is. Otherwise dst
	// holds the chunk and In is RecvFinite's finite.
	Summed, In, Out bool
	// Sums are the transport's checksums of dst as delivered, for
	// SendReceived; nil when it has none.
	Sums Checksums
}

// Checksums are a transport's own checksums of a chunk, opaque to the
// driver.
type Checksums []uint32

// Prober is implemented by transports that can ask whether a peer still
// answers at all, apart from the data it owes (node/'s p2p transport sends
// a libp2p ping). A wait that depends on other members too (the ring's
// later chunks, the tree's sums) cannot tell a silent member from one
// starved by someone else; a probe can, since a live member answers it
// whatever it waits for. See attempt.watch.
type Prober interface {
	// Probe returns nil once p has answered, ctx's error if it has not
	// when ctx ends, or another error when the probe could not be made
	// (which tells nothing about p). A transport that has no connection
	// to p may fail at once with an error wrapping ErrUnreachable, which
	// the driver takes as "try again later", not as silence.
	Probe(ctx context.Context, p peerid.ID) error
}

// Scoper is implemented by transports that can refuse chunks from peers
// outside a round's group. *Mailbox implements it, so a transport that
// embeds one does too. The driver calls Scope at the start of every attempt
// and collects Rejected when the round ends.
type Scoper interface {
	// Scope declares g the current group: chunks tagged with its round and
	// attempt from non-members are refused (and recorded), and chunks of
	// earlier rounds and attempts are dropped.
	Scope(g Group)
	// Rejected returns, and forgets, the peers whose chunks for round were
	// refused, one entry per peer.
	Rejected(round uint64) []*PeerError
}

// attemptSeer is implemented by transports that report the latest attempt
// of a round that a member of the scoped group sent chunks for, when later
// than the scope's (Mailbox does).
type attemptSeer interface {
	LatestAttempt(round uint64) (uint16, bool)
}
