package train

import (
	"context"

	"github.com/starling-ml/starling/gossip/average"
	"github.com/starling-ml/starling/gossip/wire"
	"github.com/starling-ml/starling/peerid"
)

// AsyncNet is what the announce-and-pull strategies (FedAsync, FedBuff)
// need from the network: announcements over the control plane, vectors
// over streams. swarm.StreamNet implements it over a gossip.ControlPlane
// and a gossip.NodeTransport; traintest.MemBus fakes it in memory.
// Implementations are safe for concurrent use and honour ctx on every call.
type AsyncNet interface {
	// Self returns this peer's ID.
	Self() peerid.ID
	// Publish makes payload fetchable under a.Key, fills in a.Size and
	// a.Digest, and announces a. payload is not retained.
	Publish(ctx context.Context, a wire.Announcement, payload []byte) error
	// Next returns the next announcement from another peer; the control
	// plane has already dropped malformed, foreign-model and replayed
	// messages.
	Next(ctx context.Context) (*wire.Announcement, error)
	// Fetch pulls the announced vector into dst[:0] and checks it against
	// a.Size and a.Digest.
	Fetch(ctx context.Context, a *wire.Announcement, dst []byte) ([]byte, error)
	// SetStatus sets the version and throughput that heartbeats carry.
	SetStatus(version uint64, samplesPerSec float32)
}

// AsyncLinks is implemented by AsyncNets that know which peers this one
// has a connection with (swarm.StreamNet). FedAsync pulls from those
// freely and from at most AsyncConfig.FarSources others; over an AsyncNet
// without it, every peer counts as connected.
type AsyncLinks interface {
	// Connected reports whether this peer has a connection with p now.
	Connected(p peerid.ID) bool
}

// GossipNet is what the gossip-averaging strategies (AD-PSGD, SGP) need:
// an Exchanger that delivers incoming exchanges to a handler, and a view
// of which peers are alive. swarm.StreamNet implements it over node/
// streams, traintest.MemGossipNet over an average.MemNetwork.
type GossipNet interface {
	// Self returns this peer's ID.
	Self() peerid.ID
	// Alive reports whether p is believed alive (heard from recently).
	Alive(p peerid.ID) bool
	// Bind installs h as the handler of incoming exchanges of dim-value
	// vectors and returns the Exchanger to start exchanges with.
	Bind(h average.Handler, dim int) average.Exchanger
}

// GossipProgress is implemented by GossipNets that carry the peers' step
// counts. With it, an AD-PSGD passive peer that has done its MaxSteps
// stays in the exchange while an active peer is still on its way there:
// the actives' last exchanges would otherwise fail, leaving them to train
// their last steps alone.
type GossipProgress interface {
	// SetSteps publishes this peer's local step count (with the next
	// periodic announcement).
	SetSteps(steps int)
	// Steps returns the last step count heard from p (false if none).
	Steps(p peerid.ID) (int, bool)
}
