// Package nodetest holds test doubles for code that opens libp2p streams.
package nodetest

import (
	"context"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
)

// StuckDialHost is a host whose NewStream ignores its context and waits
// until Release is closed, as mocknet's does under load: its DialPeer
// takes no context, and with hundreds of simulated peers dialling each
// other the dials queue for minutes on mocknet's locks and event bus.
type StuckDialHost struct {
	host.Host
	Release chan struct{}
}

// NewStream waits for Release, then opens the stream with no deadline.
func (h StuckDialHost) NewStream(_ context.Context, p peer.ID, pids ...protocol.ID) (network.Stream, error) {
	<-h.Release
	return h.Host.NewStream(context.Background(), p, pids...)
}
