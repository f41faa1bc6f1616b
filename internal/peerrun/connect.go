package peerrun

import (
	"context"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/starling-ml/starling/swarm"
)

// connect dials a peer given as a multiaddr with /p2p/ID, retrying for up
// to 30 s (node.Node.ConnectRetry).
func connect(ctx context.Context, p *swarm.Peer, addr string) error {
	m, err := ma.NewMultiaddr(addr)
	if err != nil {
		return err
	}
	ai, err := peer.AddrInfoFromP2pAddr(m)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return p.Node.ConnectRetry(ctx, *ai)
}
