package gossip

import (
	"context"
	"slices"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/event"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
)

// repairInterval is how often the control plane looks for peers that
// GossipSub has given up on while still connected to them.
const repairInterval = 2 * time.Second

// repairLoop works around a gap in go-libp2p-pubsub (v0.19): when the
// router's first outbound stream to a newly identified peer fails to open
// (a duplicate connection closing under it, a stream refused during the
// peer's start-up), the router forgets the peer and tries again only on the
// next identify or protocol-update event, which a connection that stays up
// never produces. That peer then never learns our subscriptions — it does
// not count us as a topic peer and our heartbeats never reach it. Every
// repairInterval the loop lists connected peers that speak a pubsub
// protocol but carry no outbound pubsub stream from us; one still in that
// state a tick later is handed back to the router as a protocol update,
// which makes it open the stream again (a no-op for a peer it already
// has). Identify, whose event starts the router's first stream, can lose
// the same race, so a peer is also known to speak pubsub by the pubsub
// streams it opened to us.
func (c *ControlPlane) repairLoop(ctx context.Context) {
	defer c.wg.Done()
	em, err := c.h.EventBus().Emitter(new(event.EvtPeerProtocolsUpdated))
	if err != nil {
		c.log.Warn("gossip: no stream repair", "err", err)
		return
	}
	defer em.Close()
	t := time.NewTicker(repairInterval)
	defer t.Stop()
	var before map[peer.ID]bool // without an outbound stream at the last tick
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := make(map[peer.ID]bool)
		for p, protos := range c.stranded() {
			now[p] = true
			if !before[p] {
				continue
			}
			c.log.Debug("gossip: no outbound pubsub stream; asking the router to open one", "peer", p)
			if err := em.Emit(event.EvtPeerProtocolsUpdated{Peer: p, Added: protos}); err == nil {
				c.stats.repairs.Add(1)
			}
		}
		before = now
	}
}

// stranded returns the connected peers that speak a pubsub protocol and
// carry no outbound pubsub stream from us, with the protocols they speak:
// those identify recorded or, when identify never completed (it too can
// lose a stream race), those of the pubsub streams they opened to us.
func (c *ControlPlane) stranded() map[peer.ID][]protocol.ID {
	out := make(map[peer.ID][]protocol.ID)
	nw := c.h.Network()
	for _, p := range nw.Peers() {
		if nw.Connectedness(p) != network.Connected {
			continue
		}
		conns := nw.ConnsToPeer(p)
		outbound, inbound := pubsubStreams(conns)
		if outbound {
			continue
		}
		protos, err := c.h.Peerstore().SupportsProtocols(p, pubsub.GossipSubDefaultProtocols...)
		if err != nil || len(protos) == 0 {
			protos = inbound
		}
		if len(protos) > 0 {
			out[p] = protos
		}
	}
	return out
}

// pubsubStreams reports whether conns carry a pubsub stream that we
// opened, and the protocols of those the peer opened.
func pubsubStreams(conns []network.Conn) (outbound bool, inbound []protocol.ID) {
	for _, cn := range conns {
		for _, s := range cn.GetStreams() {
			p := s.Protocol()
			if !slices.Contains(pubsub.GossipSubDefaultProtocols, p) {
				continue
			}
			if s.Stat().Direction == network.DirOutbound {
				return true, nil
			}
			if !slices.Contains(inbound, p) {
				inbound = append(inbound, p)
			}
		}
	}
	return false, inbound
}
