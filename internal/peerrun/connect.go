package peerrun

import (
	"context"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/starling-ml/starling/swarm"
)

// connect dials a peer given as a multiaddr with /p2p/ID, retrying for a
// while: a peer started at the same moment may not listen yet.
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
	for {
		err = p.Node.Connect(ctx, *ai)
		if err == nil || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(200 * time.Millisecond):
		}
	}
}
