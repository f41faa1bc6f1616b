package node

import (
	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/protocol"
	rcmgr "github.com/libp2p/go-libp2p/p2p/host/resource-manager"
	"github.com/libp2p/go-libp2p/p2p/muxer/yamux"

	"github.com/starling-ml/starling/node/mux"
)

// perPeerMemory is the resource manager's memory for one peer: every
// stream it may be receiving at once (a striped tensor and a pipelined
// Link) at full window, twice over (docs/design.md, "Resource limits").
func perPeerMemory(c *Config) int64 {
	return 2 * int64(2*c.Stripes) * int64(c.StreamWindow)
}

// resourceLimits returns the resource manager limits for c (see above).
func resourceLimits(c *Config) rcmgr.ConcreteLimitConfig {
	scaling := rcmgr.DefaultLimits
	libp2p.SetDefaultServiceLimits(&scaling)
	base := scaling.Scale(c.MemoryLimit, 4096)
	peerMem := rcmgr.LimitVal64(perPeerMemory(c))
	tensorProto := rcmgr.ResourceLimits{
		Streams: 1024, StreamsInbound: 512, StreamsOutbound: 512,
		Memory: rcmgr.LimitVal64(c.MemoryLimit),
	}
	partial := rcmgr.PartialLimitConfig{
		System:      rcmgr.ResourceLimits{Memory: rcmgr.LimitVal64(c.MemoryLimit)},
		Transient:   rcmgr.ResourceLimits{Memory: peerMem},
		PeerDefault: rcmgr.ResourceLimits{Memory: peerMem},
		Conn:        rcmgr.ResourceLimits{Memory: peerMem},
		Protocol:    map[protocol.ID]rcmgr.ResourceLimits{ProtocolID: tensorProto},
	}
	return partial.Build(base)
}

// initialWindow is the receive window a stream starts with: enough to
// keep a stream at link rate on a 1 Gbit/s link with 30 ms of queueing
// (docs/design.md, "Resource limits").
const initialWindow = 4 << 20

// maxFrame is the largest yamux data frame we send (docs/design.md,
// "Resource limits").
const maxFrame = 256 << 10

// yamuxTransport returns libp2p's yamux transport with the receive window
// raised to c.StreamWindow and frames of up to maxFrame.
func yamuxTransport(c *Config) network.Multiplexer {
	t := *yamux.DefaultTransport
	t.MaxStreamWindowSize = uint32(c.StreamWindow)
	t.InitialStreamWindowSize = uint32(min(c.StreamWindow, initialWindow))
	t.MaxMessageSize = maxFrame
	return &t
}

// muxers returns the libp2p options of the stream muxers c offers, the
// preferred first.
func muxers(c *Config) []libp2p.Option {
	y := libp2p.Muxer(yamux.ID, yamuxTransport(c))
	if c.Muxer != MuxerStarling {
		return []libp2p.Option{y}
	}
	t := mux.DefaultTransport()
	t.Window = c.StreamWindow
	t.MaxFrame = maxFrame
	t.ControlTimeout = c.IOTimeout
	return []libp2p.Option{libp2p.Muxer(mux.ID, t), y}
}
