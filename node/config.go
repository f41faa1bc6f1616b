package node

import (
	"fmt"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
)

// Config configures a Node. Start from DefaultConfig and change what you
// need; New calls Validate.
type Config struct {
	// KeyFile is the path of the Ed25519 identity key. It is created (mode
	// 0600) if missing and refused if its group or others have any access.
	// Empty means a fresh random identity each run (tests, benchmarks).
	KeyFile string

	// ListenAddrs are the multiaddrs to listen on. Nil means the defaults:
	// TCP and QUIC on all IPv4 and IPv6 interfaces, port 4001 — or TCP only
	// when a swarm key is set, since libp2p's private networks cannot run
	// over QUIC. Tests use /ip4/127.0.0.1/tcp/0.
	ListenAddrs []string

	// SwarmName names the swarm: it namespaces the mDNS service, the DHT
	// protocol prefix (/starling/<name>/kad/1.0.0) and the DHT rendezvous
	// key, so that two swarms on one LAN do not see each other.
	SwarmName string

	// PSKFile is the path of a swarm.key (IPFS v1 format, written by
	// `peer keygen --psk`). Every member must hold the same key; a peer
	// without it cannot complete a connection. Empty means none.
	PSKFile string
	// PSK is the 32-byte pre-shared key itself; it overrides PSKFile.
	PSK []byte

	// Insecure turns transport security off: connections use libp2p's
	// plaintext handshake (/plaintext/2.0.0) instead of TLS 1.3 or Noise,
	// so traffic is neither encrypted nor authenticated and a peer's ID is
	// claimed, not proven. It is for a trusted cluster network, where it
	// saves the cipher's CPU (as Gloo, MPI and NCCL do, which have no
	// security at all); every member must set it, and a node with it
	// cannot talk to one without. With it the node runs TCP only (QUIC
	// always encrypts), and an Allowlist is refused (ErrInvalidConfig):
	// it could not be enforced. A swarm key still works with it.
	Insecure bool

	// Muxer is the stream muxer offered first: MuxerStarling (node/mux,
	// the default: frames written from the caller's buffer and read
	// straight into a waiting Read's, for less CPU per byte) or MuxerYamux
	// (libp2p's yamux, alone). With MuxerStarling, yamux stays offered
	// second, so such a node still talks to one without it.
	Muxer string

	// Allowlist, if not empty, is the set of peers this node will connect to
	// or accept (enforced by a connection gater after the handshake proves
	// the remote key). Empty means everyone (who passes the PSK, if set).
	Allowlist []peer.ID

	// MDNS enables LAN discovery by multicast DNS (on by default: a LAN needs
	// no configuration).
	MDNS bool
	// DHT enables the Kademlia DHT on the private prefix and the rendezvous
	// on SwarmName. Every node with DHT on is a DHT server (a private swarm
	// has no public DHT to lean on).
	DHT bool
	// Bootstrap are multiaddrs (with /p2p/ID) of peers to join the DHT
	// through; a node started with none is a bootstrap node itself.
	Bootstrap []string
	// RendezvousInterval is how often the DHT rendezvous re-advertises and
	// looks for swarm members (seconds to minutes: each round is a few DHT
	// queries).
	RendezvousInterval time.Duration

	// NATPortMap asks the LAN router (UPnP/NAT-PMP) for a port mapping.
	NATPortMap bool
	// HolePunching enables DCUtR hole punching (and the relay client it
	// needs) so that peers behind NATs can upgrade relayed control
	// connections to direct ones; tensors wait for the direct connection.
	HolePunching bool
	// NATService answers other peers' AutoNAT dial-back requests.
	NATService bool
	// RelayService lets this node relay other peers' control traffic
	// (circuit v2: 2 min, 128 KiB per circuit by default). Tensor streams
	// are never opened over, nor accepted from, a relayed connection. A relay
	// must be reachable by its clients, so this also forces AutoNAT's
	// verdict to "public".
	RelayService bool
	// Relays are static relays (multiaddrs with /p2p/ID, --relay): a node
	// given some takes itself for unreachable (behind a NAT; AutoNAT is
	// not waited for), books a circuit v2 slot on them at once and
	// advertises the relayed addresses beside its direct ones, so that
	// peers that cannot dial it reach it there and hole punching can
	// upgrade the connection.
	Relays []string
	// AutoRelay makes such a node look for relays among the peers it is
	// connected to that offer the relay service (RelayService).
	AutoRelay bool

	// ConnLow and ConnHigh are the connection manager's watermarks: above
	// ConnHigh it trims down to ConnLow, oldest unprotected peers first.
	// Peers under Protect (and peers with a tensor in flight) are never
	// trimmed.
	ConnLow, ConnHigh int
	// ConnGrace is how long a new connection is exempt from trimming.
	ConnGrace time.Duration

	// MaxTensorBytes bounds a tensor's payload and its decoded size. A frame
	// announcing more is refused before anything is allocated. 512 MiB
	// covers the 1–500 MB tensors we move.
	MaxTensorBytes int64
	// Stripes is the largest number of streams one tensor is split over.
	// One yamux stream is limited by its window and by one reader
	// goroutine; a few stripes keep the link busy.
	Stripes int
	// MinStripeBytes is the smallest stripe: tensors below 2*MinStripeBytes
	// go as one frame, so small chunks pay no striping overhead.
	MinStripeBytes int
	// StreamWindow is the largest yamux receive window per stream, in
	// bytes. The resource manager is sized from it (see limits.go), since
	// a window only grows when the resource manager grants its memory.
	StreamWindow int
	// MemoryLimit is the resource manager's memory for the whole node in
	// bytes (all peers, all streams).
	MemoryLimit int64
	// MaxParkedBytes bounds the memory held for tensors that arrive before
	// the Recv that will claim them, all senders together. Past it, senders
	// wait (back-pressure) until a Recv is posted or IOTimeout passes.
	MaxParkedBytes int64
	// MaxParkedPerPeer bounds the same memory for one sender (64 MiB), so
	// that one peer cannot take the whole of MaxParkedBytes: its tensors
	// past the bound wait for their Recv like those past MaxParkedBytes.
	MaxParkedPerPeer int64
	// MaxStrangerParked bounds the same memory for all the peers
	// SetMayPark does not admit, together (4 MiB): enough for a peer about
	// to be admitted to park a vote or a small chunk, too little for
	// strangers minting peer IDs to matter.
	MaxStrangerParked int64
	// ParkedTTL is how long an unclaimed tensor is kept before it is
	// dropped.
	ParkedTTL time.Duration
	// IOTimeout is the longest a single read or write may make no progress
	// before the stream is reset (the per-operation deadline; a large
	// tensor is many operations).
	IOTimeout time.Duration
	// RecvTimeout is the deadline Recv applies when its ctx has none.
	RecvTimeout time.Duration
	// IdleTimeout closes pooled streams unused for this long.
	IdleTimeout time.Duration

	// MetricsAddr, if set, serves Prometheus metrics at http://ADDR/metrics
	// (libp2p's collectors and ours).
	MetricsAddr string
}

// Stream muxers a Config may offer first (Config.Muxer).
const (
	MuxerYamux    = "yamux"
	MuxerStarling = "starling"
)

// DefaultConfig returns the configuration for a LAN or few-site swarm moving
// 1–500 MB tensors.
func DefaultConfig() Config {
	return Config{
		SwarmName:          "starling",
		MDNS:               true,
		DHT:                true,
		RendezvousInterval: time.Minute,
		NATPortMap:         true,
		HolePunching:       true,
		AutoRelay:          true,
		NATService:         true,
		ConnLow:            64,
		ConnHigh:           128,
		ConnGrace:          30 * time.Second,
		MaxTensorBytes:     512 << 20,
		Stripes:            4,
		MinStripeBytes:     4 << 20,
		StreamWindow:       16 << 20,
		Muxer:              MuxerStarling,
		MemoryLimit:        2 << 30,
		MaxParkedBytes:     1 << 30,
		MaxParkedPerPeer:   64 << 20,
		MaxStrangerParked:  4 << 20,
		ParkedTTL:          2 * time.Minute,
		IOTimeout:          30 * time.Second,
		RecvTimeout:        5 * time.Minute,
		IdleTimeout:        2 * time.Minute,
	}
}

// TestConfig returns DefaultConfig restricted to loopback with every
// multicast or router-facing feature off (mDNS, UPnP), for tests and
// benchmarks that must not touch the LAN.
func TestConfig() Config {
	c := DefaultConfig()
	c.ListenAddrs = []string{"/ip4/127.0.0.1/tcp/0"}
	c.MDNS = false
	c.DHT = false
	c.NATPortMap = false
	c.HolePunching = false
	c.NATService = false
	c.AutoRelay = false
	return c
}

// Validate reports the first problem with c, wrapped in ErrInvalidConfig
// (or ErrQUICWithPSK). It does not modify c.
func (c *Config) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, a...)...)
	}
	if _, err := relayInfos(c.Relays); err != nil {
		return bad("%v", err)
	}
	if c.SwarmName == "" || strings.ContainsAny(c.SwarmName, "/\n ") {
		return bad("SwarmName %q must be non-empty without '/', spaces or newlines", c.SwarmName)
	}
	if c.PSK != nil && len(c.PSK) != 32 {
		return bad("PSK is %d bytes, want 32", len(c.PSK))
	}
	psk := c.PSK != nil || c.PSKFile != ""
	for _, s := range c.ListenAddrs {
		a, err := ma.NewMultiaddr(s)
		if err != nil {
			return bad("listen address %q: %v", s, err)
		}
		if psk && isQUIC(a) {
			return fmt.Errorf("%w: listen address %s", ErrQUICWithPSK, s)
		}
		if c.Insecure && isQUIC(a) {
			return bad("listen address %s: QUIC cannot run Insecure (it always encrypts); use TCP", s)
		}
	}
	for _, s := range c.Bootstrap {
		if _, err := peer.AddrInfoFromString(s); err != nil {
			return bad("bootstrap address %q (want /…/p2p/ID): %v", s, err)
		}
	}
	if c.Insecure && len(c.Allowlist) > 0 {
		return bad("an Allowlist cannot be enforced with Insecure: peer IDs are not authenticated")
	}
	for _, p := range c.Allowlist {
		if err := p.Validate(); err != nil {
			return bad("allowlist entry %q: %v", p, err)
		}
	}
	switch {
	case c.DHT && c.RendezvousInterval <= 0:
		return bad("RendezvousInterval must be > 0")
	case c.ConnLow < 1 || c.ConnHigh < c.ConnLow:
		return bad("need 1 <= ConnLow (%d) <= ConnHigh (%d)", c.ConnLow, c.ConnHigh)
	case c.ConnGrace < 0:
		return bad("ConnGrace must be >= 0")
	case c.MaxTensorBytes < 1:
		return bad("MaxTensorBytes must be > 0")
	case c.Stripes < 1 || c.Stripes > maxStripes:
		return bad("Stripes %d not in 1..%d", c.Stripes, maxStripes)
	case c.MinStripeBytes < 1:
		return bad("MinStripeBytes must be > 0")
	case c.Muxer != MuxerYamux && c.Muxer != MuxerStarling:
		return bad("Muxer %q: want %q or %q", c.Muxer, MuxerYamux, MuxerStarling)
	case c.StreamWindow < 256<<10:
		return bad("StreamWindow %d below yamux's 256 KiB minimum", c.StreamWindow)
	case c.MemoryLimit < int64(4*c.Stripes*c.StreamWindow):
		return bad("MemoryLimit %d below 4*Stripes*StreamWindow = %d", c.MemoryLimit, 4*c.Stripes*c.StreamWindow)
	case c.MaxParkedBytes < 0 || c.MaxParkedPerPeer < 0 || c.MaxStrangerParked < 0:
		return bad("MaxParkedBytes, MaxParkedPerPeer and MaxStrangerParked must be >= 0")
	case c.ParkedTTL <= 0 || c.IOTimeout <= 0 || c.RecvTimeout <= 0 || c.IdleTimeout <= 0:
		return bad("ParkedTTL, IOTimeout, RecvTimeout and IdleTimeout must be > 0")
	}
	return nil
}

// listenAddrs returns the configured or default listen addresses.
func (c *Config) listenAddrs() []string {
	if c.ListenAddrs != nil {
		return c.ListenAddrs
	}
	addrs := []string{"/ip4/0.0.0.0/tcp/4001", "/ip6/::/tcp/4001"}
	if c.PSK == nil && c.PSKFile == "" && !c.Insecure {
		addrs = append(addrs, "/ip4/0.0.0.0/udp/4001/quic-v1", "/ip6/::/udp/4001/quic-v1")
	}
	return addrs
}

func isQUIC(a ma.Multiaddr) bool {
	_, err := a.ValueForProtocol(ma.P_QUIC_V1)
	if err == nil {
		return true
	}
	_, err = a.ValueForProtocol(ma.P_QUIC)
	return err == nil
}

// relayInfos parses static relay addresses (with /p2p/ID).
func relayInfos(addrs []string) ([]peer.AddrInfo, error) {
	var out []peer.AddrInfo
	for _, a := range addrs {
		ai, err := peer.AddrInfoFromString(a)
		if err != nil {
			return nil, fmt.Errorf("relay %q: want a multiaddr ending in /p2p/ID: %v", a, err)
		}
		out = append(out, *ai)
	}
	return out, nil
}
