package node

import (
	"github.com/libp2p/go-libp2p/core/connmgr"
	"github.com/libp2p/go-libp2p/core/control"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
)

// allowlist is a connection gater admitting only listed peers. Outbound, it
// refuses to dial anyone else; inbound, it refuses the connection right
// after the security handshake has proven the remote peer's key, before the
// muxer starts, so a stranger never opens a stream, and logs the refusal
// (rate limited, see refusals). The set is fixed at construction and
// read-only afterwards: safe for concurrent use.
type allowlist struct {
	self  peer.ID
	peers map[peer.ID]struct{}
	ref   *refusals
}

var _ connmgr.ConnectionGater = (*allowlist)(nil)

func newAllowlist(self peer.ID, ids []peer.ID, ref *refusals) *allowlist {
	g := &allowlist{self: self, peers: make(map[peer.ID]struct{}, len(ids)), ref: ref}
	for _, id := range ids {
		g.peers[id] = struct{}{}
	}
	return g
}

func (g *allowlist) allowed(p peer.ID) bool {
	_, ok := g.peers[p]
	return ok || p == g.self
}

func (g *allowlist) InterceptPeerDial(p peer.ID) bool                 { return g.allowed(p) }
func (g *allowlist) InterceptAddrDial(p peer.ID, _ ma.Multiaddr) bool { return g.allowed(p) }
func (g *allowlist) InterceptAccept(network.ConnMultiaddrs) bool      { return true }
func (g *allowlist) InterceptSecured(dir network.Direction, p peer.ID, c network.ConnMultiaddrs) bool {
	ok := g.allowed(p)
	if !ok && dir == network.DirInbound && g.ref != nil {
		g.ref.warn("refused a connection", p, "not on the allowlist (--allow)", "addr", c.RemoteMultiaddr().String())
	}
	return ok
}
func (g *allowlist) InterceptUpgraded(c network.Conn) (bool, control.DisconnectReason) {
	return g.allowed(c.RemotePeer()), 0
}
