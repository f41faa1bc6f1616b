package node

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"time"

	dht "github.com/libp2p/go-libp2p-kad-dht"
	"github.com/libp2p/go-libp2p/core/discovery"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/p2p/discovery/mdns"
	drouting "github.com/libp2p/go-libp2p/p2p/discovery/routing"
)

// connectTimeout bounds one dial to a discovered peer.
const connectTimeout = 15 * time.Second

// mdnsService returns the mDNS service name for a swarm. DNS-SD service
// labels are at most 15 characters, so the swarm name is hashed.
func mdnsService(swarm string) string {
	sum := sha256.Sum256([]byte(swarm))
	return "_stl-" + hex.EncodeToString(sum[:])[:10] + "._udp"
}

// dhtPrefix is the private DHT protocol prefix of a swarm: its DHT never
// mixes with the public IPFS one (/ipfs/kad/1.0.0) or another swarm's.
func dhtPrefix(swarm string) protocol.ID { return protocol.ID("/starling/" + swarm) }

// rendezvousKey is what swarm members advertise and look up in the DHT.
func rendezvousKey(swarm string) string { return "starling/rendezvous/" + swarm }

// startDiscovery starts mDNS and the DHT as configured. bg lives until
// Close; ctx bounds the initial bootstrap dials.
func (n *Node) startDiscovery(ctx, bg context.Context) error {
	if n.cfg.MDNS {
		n.mdns = mdns.NewMdnsService(n.host, mdnsService(n.cfg.SwarmName), notifee{n, bg})
		if err := n.mdns.Start(); err != nil {
			return err
		}
	}
	if !n.cfg.DHT {
		return nil
	}
	var boot []peer.AddrInfo
	for _, s := range n.cfg.Bootstrap {
		ai, err := peer.AddrInfoFromString(s) // validated by Config.Validate
		if err != nil {
			return err
		}
		boot = append(boot, *ai)
	}
	d, err := dht.New(n.host,
		dht.Mode(dht.ModeServer),
		dht.ProtocolPrefix(dhtPrefix(n.cfg.SwarmName)),
		dht.BootstrapPeers(boot...),
	)
	if err != nil {
		return err
	}
	n.dht = d
	for _, ai := range boot {
		cctx, cancel := context.WithTimeout(ctx, connectTimeout)
		if err := n.Connect(cctx, ai); err != nil {
			n.log.Warn("bootstrap peer unreachable", "peer", ai.ID, "err", err)
		}
		cancel()
	}
	n.goTracked(func() { n.rendezvous(bg) })
	return nil
}

// rendezvous advertises this node under the swarm's rendezvous key and
// connects to the other members it finds, every RendezvousInterval.
func (n *Node) rendezvous(ctx context.Context) {
	rd := drouting.NewRoutingDiscovery(n.dht)
	key := rendezvousKey(n.cfg.SwarmName)
	wait := time.NewTimer(0)
	defer wait.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-wait.C:
		}
		if err := n.dht.Bootstrap(ctx); err != nil {
			n.log.Debug("dht bootstrap", "err", err)
		}
		rctx, cancel := context.WithTimeout(ctx, max(n.cfg.RendezvousInterval, 10*time.Second))
		if _, err := rd.Advertise(rctx, key, discovery.TTL(3*n.cfg.RendezvousInterval)); err != nil {
			n.log.Debug("rendezvous advertise", "err", err)
		}
		if ch, err := rd.FindPeers(rctx, key); err == nil {
			for ai := range ch {
				n.found(rctx, ai)
			}
		}
		cancel()
		wait.Reset(n.cfg.RendezvousInterval)
	}
}

// found connects to a discovered peer unless it is us or already
// connected, then tells the WithPeerFound callback.
func (n *Node) found(ctx context.Context, ai peer.AddrInfo) {
	if ai.ID == n.host.ID() || len(ai.Addrs) == 0 {
		return
	}
	if n.host.Network().Connectedness(ai.ID) != network.Connected {
		cctx, cancel := context.WithTimeout(ctx, connectTimeout)
		err := n.Connect(cctx, ai)
		cancel()
		if err != nil {
			n.log.Debug("connect to discovered peer", "peer", ai.ID, "err", err)
			return
		}
	}
	if n.onPeer != nil {
		n.onPeer(ai)
	}
}

// notifee receives mDNS results (each on its own goroutine).
type notifee struct {
	n  *Node
	bg context.Context
}

func (f notifee) HandlePeerFound(ai peer.AddrInfo) {
	f.n.goTracked(func() { f.n.found(f.bg, ai) })
}
