package node

import (
	"testing"

	"github.com/libp2p/go-libp2p/p2p/muxer/yamux"
)

// TestYamuxWindows: streams start with a window that carries a 1 Gbit/s
// link through tens of milliseconds of queueing. With yamux's 256 KiB
// start, a bidirectional 64 MB all-reduce between two netbed hosts at
// 500 Mbit/s ran at 0.76 of the link (the window never grows under load,
// see initialWindow); with 4 MiB at 0.93.
func TestYamuxWindows(t *testing.T) {
	for _, sw := range []int{16 << 20, 1 << 20} {
		c := DefaultConfig()
		c.StreamWindow = sw
		tr := yamuxTransport(&c).(*yamux.Transport)
		if got, want := int(tr.InitialStreamWindowSize), min(sw, 4<<20); got != want {
			t.Errorf("StreamWindow %d: initial window %d, want %d", sw, got, want)
		}
		if int(tr.MaxStreamWindowSize) != sw {
			t.Errorf("max window %d, want %d", tr.MaxStreamWindowSize, sw)
		}
		// yamux refuses a config whose initial window exceeds the max.
		if tr.InitialStreamWindowSize > tr.MaxStreamWindowSize {
			t.Errorf("initial window above the max")
		}
		// A frame is cut to the sender's window: one larger than the
		// smallest window would never be sent whole.
		if tr.MaxMessageSize != maxFrame || tr.MaxMessageSize > tr.InitialStreamWindowSize {
			t.Errorf("frames of %d bytes, want %d within the %d-byte initial window", tr.MaxMessageSize, maxFrame, tr.InitialStreamWindowSize)
		}
	}
	// Every stream reserves its initial window: the per-peer budget must
	// hold the streams one peer runs at once (2*Stripes) at that size.
	c := DefaultConfig()
	if need := int64(2*c.Stripes) * initialWindow; perPeerMemory(&c) < need {
		t.Errorf("per-peer memory %d below %d", perPeerMemory(&c), need)
	}
}
