package train

import (
	"context"
	"fmt"

	"github.com/starling-ml/starling/peerid"

	"github.com/starling-ml/starling/gossip"
	"github.com/starling-ml/starling/gossip/average"
	"github.com/starling-ml/starling/gossip/wire"
)

// AsyncNet is what the announce-and-pull strategies (FedAsync, FedBuff)
// need from the network: announcements over the control plane, vectors
// over streams. P2PNet implements it over a gossip.ControlPlane and a
// gossip.NodeTransport; tests and simulations may wrap or fake it.
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

// GossipNet is what the gossip-averaging strategies (AD-PSGD, SGP) need:
// an Exchanger that delivers incoming exchanges to a handler, and a view
// of which peers are alive.
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

// P2PNet is AsyncNet and GossipNet over a libp2p host: GossipSub for
// control, node/ tensor streams for vectors. The caller owns and closes
// both parts.
type P2PNet struct {
	CP *gossip.ControlPlane
	T  *gossip.NodeTransport
}

var (
	_ AsyncNet       = (*P2PNet)(nil)
	_ GossipNet      = (*P2PNet)(nil)
	_ GossipProgress = (*P2PNet)(nil)
)

// Self implements AsyncNet and GossipNet.
func (n *P2PNet) Self() peerid.ID { return n.T.Self() }

// Publish implements AsyncNet.
func (n *P2PNet) Publish(ctx context.Context, a wire.Announcement, payload []byte) error {
	if err := n.T.Serve(a.Key, payload); err != nil {
		return fmt.Errorf("train: serve %q: %w", a.Key, err)
	}
	a.Size = uint64(len(payload))
	a.Digest = wire.Digest(payload)
	return n.CP.Announce(ctx, a)
}

// Next implements AsyncNet.
func (n *P2PNet) Next(ctx context.Context) (*wire.Announcement, error) { return n.CP.Next(ctx) }

// Fetch implements AsyncNet.
func (n *P2PNet) Fetch(ctx context.Context, a *wire.Announcement, dst []byte) ([]byte, error) {
	return n.T.Fetch(ctx, a, dst)
}

// SetStatus implements AsyncNet.
func (n *P2PNet) SetStatus(version uint64, samplesPerSec float32) {
	n.CP.SetStatus(version, samplesPerSec)
}

// Alive implements GossipNet: p sent a heartbeat within the control
// plane's PeerTTL.
func (n *P2PNet) Alive(p peerid.ID) bool {
	_, ok := n.CP.Peer(p)
	return ok
}

// SetSteps implements GossipProgress: the heartbeats' model version
// carries the step count (gossip has no global version).
func (n *P2PNet) SetSteps(steps int) { n.CP.SetStatus(uint64(steps), 0) }

// Steps implements GossipProgress.
func (n *P2PNet) Steps(p peerid.ID) (int, bool) {
	pi, ok := n.CP.Peer(p)
	return int(min(pi.Version, 1<<62)), ok
}

// Bind implements GossipNet.
func (n *P2PNet) Bind(h average.Handler, dim int) average.Exchanger {
	n.T.Bind(h, dim)
	return n.T
}
