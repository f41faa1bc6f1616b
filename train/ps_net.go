package train

import (
	"context"
	"fmt"

	"github.com/starling-ml/starling/peerid"
)

// PSNet is what the parameter-server mode (RunPS) needs from the network:
// a request/response call to one peer, with a deadline, and a handler for
// the requests that reach this peer. swarm.PSTransport implements it over
// a libp2p stream protocol; traintest.PSFabric in memory.
// Implementations are safe for concurrent use.
type PSNet interface {
	// Self returns this peer's ID.
	Self() peerid.ID
	// Serve installs h as the handler of incoming requests (nil removes
	// it). Until a handler is installed, requests get a reply of status
	// PSNotReady. h is called on several goroutines at once.
	Serve(h PSHandler)
	// Call sends r to peer to and returns its reply, or an error when no
	// reply came before ctx's deadline (a dead, unreachable or stalled
	// peer). r.Payload is not retained; the reply is the caller's.
	Call(ctx context.Context, to peerid.ID, r *PSRequest) (*PSReply, error)
}

// PSHandler answers one request from peer from. It must honour ctx (the
// reply's deadline) and must not retain r.Payload after it returns.
type PSHandler func(ctx context.Context, from peerid.ID, r *PSRequest) *PSReply

// PSOp is a request's operation.
type PSOp uint8

// Operations. The values are wire values.
const (
	// PSPull asks for a shard's parameters and version.
	PSPull PSOp = 1
	// PSPush sends a gradient of a shard (Payload, in codec Codec, of
	// Elems values, computed at version Base); the reply carries the
	// parameters after it, as a pull's does.
	PSPush PSOp = 2
	// PSReplicate sends a shard's state (Version, Seqs, the parameters
	// in Payload as raw float32) from its server to its backup.
	PSReplicate PSOp = 3
	// PSDone says the worker has finished training.
	PSDone PSOp = 4
	// PSGate asks whether the worker, at clock Seq (its last push), may
	// start its next step under the SSP bound: PSWait while it may not
	// (Slowest names the clock it waits for), PSOK with the parameters,
	// as a pull's reply, once it may.
	PSGate PSOp = 5
)

// PSStatus is a reply's status.
type PSStatus uint8

// Reply statuses. The values are wire values.
const (
	PSOK         PSStatus = 0  // done; Payload holds the shard's parameters (pull, push)
	PSDup        PSStatus = 1  // a push already applied (a retry after failover): not applied again
	PSStale      PSStatus = 2  // a push staler than the SSP bound allows: dropped; Payload holds fresh parameters
	PSNotReady   PSStatus = 3  // the peer does not serve yet (starting)
	PSMoved      PSStatus = 4  // the shard moved to its backup: fail over
	PSNotServer  PSStatus = 5  // the peer serves no such shard
	PSBadModel   PSStatus = 6  // another model or parameter count than the server's
	PSBadLayout  PSStatus = 7  // the worker elected other servers than the server did
	PSBadShape   PSStatus = 8  // a gradient of the wrong length for the shard
	PSBadRequest PSStatus = 9  // anything else malformed (undecodable gradient, unknown op, …)
	PSWait       PSStatus = 10 // a gate: the worker is beyond the SSP bound; ask again after a pause
	numPSStatus  PSStatus = 11
)

var psStatusNames = [numPSStatus]string{"ok", "dup", "stale", "not-ready", "moved", "not-server", "bad-model", "bad-layout", "bad-shape", "bad-request", "wait"}

func (s PSStatus) String() string {
	if s < numPSStatus {
		return psStatusNames[s]
	}
	return fmt.Sprintf("status(%d)", uint8(s))
}

// PSSeq is the last push a shard applied from one worker session.
type PSSeq struct {
	Worker  peerid.ID `json:"w"`
	Session uint64    `json:"s"`
	Seq     uint64    `json:"q"`
}

// PSRequest is one request to a server. Everything but Payload is small.
type PSRequest struct {
	Op PSOp `json:"op"`
	// Model and Dim are the worker's model id (its architecture digest)
	// and parameter count; a server of another model refuses
	// (PSBadModel).
	Model string `json:"model"`
	Dim   int    `json:"dim"`
	// Layout is the digest of the servers the worker elected.
	Layout uint64 `json:"layout"`
	Shard  int    `json:"shard"`
	// Session identifies one run of a worker; Seq numbers its pushes to
	// the shard from 1, so that a push retried after a failover is
	// applied once. Seq is also the worker's clock for the SSP gate (its
	// completed steps): a push's, or a gate request's last push.
	Session uint64 `json:"session,omitempty"`
	Seq     uint64 `json:"seq,omitempty"`
	// Base is the shard version the gradient was computed at; Codec its
	// encoding (a compression.ID), Elems its length.
	Base  uint64 `json:"base,omitempty"`
	Codec uint8  `json:"codec,omitempty"`
	Elems int    `json:"elems,omitempty"`
	// Version and Seqs are a replica's (PSReplicate).
	Version uint64  `json:"version,omitempty"`
	Seqs    []PSSeq `json:"seqs,omitempty"`
	Payload []byte  `json:"-"`
}

// PSReply is a server's answer.
type PSReply struct {
	Status PSStatus `json:"status"`
	// Version is the shard's version after the request; Payload its
	// parameters then, as raw little-endian float32 (pull, push, dup,
	// stale).
	Version uint64 `json:"version"`
	// Tau and Weight are the staleness of an applied push and its weight.
	Tau    uint64  `json:"tau,omitempty"`
	Weight float64 `json:"weight,omitempty"`
	// Wait (a push's reply) says that the worker, at the pushed clock,
	// is more than the SSP bound ahead of the slowest live worker: it
	// must not start its next step before a PSGate request is answered
	// PSOK. Slowest is that worker's clock (Wait, PSWait).
	Wait    bool   `json:"wait,omitempty"`
	Slowest uint64 `json:"slowest,omitempty"`
	// Detail explains a refusal, for the worker's error.
	Detail  string `json:"detail,omitempty"`
	Payload []byte `json:"-"`
}
