package node

import (
	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/protocol"
	rcmgr "github.com/libp2p/go-libp2p/p2p/host/resource-manager"
	"github.com/libp2p/go-libp2p/p2p/muxer/yamux"
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

// initialWindow is the receive window a stream starts with. yamux's own
// 256 KiB grows only when a window is consumed within 4 RTTs of the
// session's ping, measured at start on an idle link; under load, with
// data flowing both ways, the window updates wait behind data in both
// directions' queues, the window never grows, and a stream runs at 256 KiB
// per loaded RTT (13 MB/s at 20 ms). 4 MiB keeps a stream at link rate on
// a 1 Gbit/s link with 30 ms of queueing.
const initialWindow = 4 << 20

// maxFrame is the largest yamux data frame we send. yamux's 64 KiB costs
// a copy, a queue hand-off and a write (plus a 12-byte read on plaintext,
// which has no buffering below yamux) per 64 KiB: 256 KiB frames raised a
// 4-rank plaintext all-reduce on loopback by 7 % and an 8-host netbed one
// by 6 % (both CPU-bound). Larger frames gain little more and hurt what
// waits in the session's 64-frame send queue behind them: votes and, on a
// connection loaded both ways, window updates (16 MiB queued is 134 ms at
// 1 Gbit/s, a stream's full 16 MiB window at link rate). Pings bypass the
// queue.
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
