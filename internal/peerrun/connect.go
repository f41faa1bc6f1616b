package peerrun

import (
	"context"
	"errors"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	lswarm "github.com/libp2p/go-libp2p/p2p/net/swarm"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/starling-ml/starling/node"
	"github.com/starling-ml/starling/swarm"
)

// connect dials a peer given as a multiaddr with /p2p/ID, retrying for a
// while: a peer started at the same moment may not listen yet. A peer with
// other transport security (node.ErrSecurityMismatch) is not retried.
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
	// A failed dial puts the address in libp2p's dial backoff, and the
	// retries then fail with "dial backoff" alone: report the failure that
	// caused it instead.
	var cause error
	for {
		err = p.Node.Connect(ctx, *ai)
		if err == nil || errors.Is(err, node.ErrSecurityMismatch) {
			return err
		}
		if !errors.Is(err, lswarm.ErrDialBackoff) {
			cause = err
		}
		if cause == nil {
			cause = err
		}
		if ctx.Err() != nil {
			return cause
		}
		select {
		case <-ctx.Done():
			return cause
		case <-time.After(200 * time.Millisecond):
		}
	}
}
