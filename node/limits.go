package node

import (
	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/protocol"
	rcmgr "github.com/libp2p/go-libp2p/p2p/host/resource-manager"
	"github.com/libp2p/go-libp2p/p2p/muxer/yamux"
)

// Why the limits are what they are.
//
// A yamux stream starts with a receive window (256 KiB in yamux, 4 MiB here:
// see initialWindow) and doubles it (up to Config.StreamWindow) when the
// reader keeps up — but each growth asks the
// resource manager for the memory at priority 128, which succeeds only while
// the connection's (and the peer's, and the system's) reservations stay
// under about half of that scope's limit. libp2p's default connection limit
// is 32 MiB, so all streams of one connection together stop growing at
// 16 MiB: a striped tensor's windows stay small, with no error anywhere, and
// throughput on a link with any latency collapses. We therefore size the
// connection and peer memory for every stream a peer may be receiving at
// once (2*Stripes: a striped tensor plus a pipelined Link, both at full
// window) at twice that, for the priority-128 headroom:
//
//	perPeer = 2 * (2*Stripes) * StreamWindow   // 256 MiB with the defaults
//
// and give the whole node MemoryLimit (2 GiB by default: eight peers at full
// windows, since a reservation also stops at half the system limit). These
// are reservations, not allocations: yamux buffers hold data only while the
// application is slower than the link.
//
// Stream counts stay at libp2p's scaled defaults (hundreds per peer), far
// above the Stripes streams a tensor opens. Connection counts per peer stay
// at 8, libp2p's default; loopback is exempt from the per-IP connection
// limits.
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
