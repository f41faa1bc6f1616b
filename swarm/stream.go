package swarm

import (
	"context"
	"fmt"
	"time"

	"github.com/libp2p/go-libp2p/core/network"

	"github.com/starling-ml/starling/gossip"
	"github.com/starling-ml/starling/gossip/average"
	"github.com/starling-ml/starling/gossip/wire"
	"github.com/starling-ml/starling/node"
	"github.com/starling-ml/starling/peerid"
	"github.com/starling-ml/starling/train"
)

// StreamNet is the network of the strategies that move models over node/
// streams: train.AsyncNet (FedAsync, FedBuff) and train.GossipNet with
// train.GossipProgress (AD-PSGD, SGP), over a peer's GossipSub control
// plane (announcements, liveness, step counts) and a gossip.NodeTransport
// (vectors). The caller owns and closes both parts. Safe for concurrent
// use.
type StreamNet struct {
	CP *gossip.ControlPlane
	T  *gossip.NodeTransport
}

var (
	_ train.AsyncNet       = (*StreamNet)(nil)
	_ train.GossipNet      = (*StreamNet)(nil)
	_ train.GossipProgress = (*StreamNet)(nil)
	_ train.AsyncLinks     = (*StreamNet)(nil)
)

// NewStreamTransport starts the stream side of those strategies on n, for
// model (the control plane's model id): announced vectors of at most
// maxFetchBytes are pulled, and gossip exchanges made, over n's tensor
// streams. A reply gets 10 s to go out and the last 16 published vectors
// stay fetchable. Close the transport before n.
func NewStreamTransport(n *node.Node, model string, maxFetchBytes int64) (*gossip.NodeTransport, error) {
	nc := gossip.DefaultNodeConfig()
	nc.Model = model
	nc.ReplyTimeout = 10 * time.Second
	nc.MaxServed = 16
	nc.MaxFetchBytes = maxFetchBytes
	return gossip.NewNodeTransport(n, nc)
}

// Self implements train.AsyncNet and train.GossipNet.
func (n *StreamNet) Self() peerid.ID { return n.T.Self() }

// Publish implements train.AsyncNet.
func (n *StreamNet) Publish(ctx context.Context, a wire.Announcement, payload []byte) error {
	if err := n.T.Serve(a.Key, payload); err != nil {
		return fmt.Errorf("swarm: serve %q: %w", a.Key, err)
	}
	a.Size = uint64(len(payload))
	a.Digest = wire.Digest(payload)
	return n.CP.Announce(ctx, a)
}

// Next implements train.AsyncNet.
func (n *StreamNet) Next(ctx context.Context) (*wire.Announcement, error) { return n.CP.Next(ctx) }

// Fetch implements train.AsyncNet.
func (n *StreamNet) Fetch(ctx context.Context, a *wire.Announcement, dst []byte) ([]byte, error) {
	return n.T.Fetch(ctx, a, dst)
}

// Connected implements train.AsyncLinks.
func (n *StreamNet) Connected(p peerid.ID) bool { return n.T.Connected(p) }

// SetStatus implements train.AsyncNet.
func (n *StreamNet) SetStatus(version uint64, samplesPerSec float32) {
	n.CP.SetStatus(wire.Status{Version: version, SamplesPerSec: samplesPerSec})
}

// Alive implements train.GossipNet: p sent a heartbeat within the control
// plane's PeerTTL.
func (n *StreamNet) Alive(p peerid.ID) bool {
	_, ok := n.CP.Peer(p)
	return ok
}

// SetSteps implements train.GossipProgress: the heartbeats' model version
// carries the step count (gossip has no global version).
func (n *StreamNet) SetSteps(steps int) { n.CP.SetStatus(wire.Status{Version: uint64(steps)}) }

// Steps implements train.GossipProgress.
func (n *StreamNet) Steps(p peerid.ID) (int, bool) {
	pi, ok := n.CP.Peer(p)
	return int(min(pi.Version, 1<<62)), ok
}

// Bind implements train.GossipNet.
func (n *StreamNet) Bind(h average.Handler, dim int) average.Exchanger {
	n.T.Bind(h, dim)
	return n.T
}

// resetOnDone resets st if ctx ends before the returned stop is called,
// so that a read or write blocked on it returns. Call stop (defer it)
// when the exchange is over.
func resetOnDone(ctx context.Context, st network.Stream) (stop func()) {
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			st.Reset()
		case <-done:
		}
	}()
	return func() { close(done) }
}
