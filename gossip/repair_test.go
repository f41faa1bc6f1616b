package gossip

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
)

// refusingHost fails every pubsub stream it is asked to open while refuse
// is set, as a stream open that loses a race with a closing duplicate
// connection does.
type refusingHost struct {
	host.Host
	refuse  atomic.Bool
	refused atomic.Int32 // streams refused so far
}

func (h *refusingHost) NewStream(ctx context.Context, p peer.ID, pids ...protocol.ID) (network.Stream, error) {
	if h.refuse.Load() && slices.ContainsFunc(pids, func(id protocol.ID) bool { return slices.Contains(pubsub.GossipSubDefaultProtocols, id) }) {
		h.refused.Add(1)
		return nil, errors.New("refused by the test")
	}
	return h.Host.NewStream(ctx, p, pids...)
}

// TestRepairStrandedPeer: GossipSub gives up on a peer whose first
// outbound stream fails while the connection stays up, so that peer never
// learns our subscriptions. The repair loop hands the peer back to the
// router once the stream can be opened; without it b never counts a as a
// topic peer.
func TestRepairStrandedPeer(t *testing.T) {
	for _, identified := range []bool{true, false} {
		t.Run(fmt.Sprintf("identified=%v", identified), func(t *testing.T) { testRepairStrandedPeer(t, identified) })
	}
}

// testRepairStrandedPeer: with identified false, a's peerstore has also
// lost b's protocols (identify failed), so only b's inbound stream says
// that b speaks pubsub.
func testRepairStrandedPeer(t *testing.T, identified bool) {
	_, hosts := mesh(t, 2)
	a := &refusingHost{Host: hosts[0]}
	a.refuse.Store(true)
	cps := startPlanes(t, []host.Host{a, hosts[1]}, manualConfig(), newFakeClock())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := hosts[1].Connect(ctx, peer.AddrInfo{ID: hosts[0].ID(), Addrs: hosts[0].Addrs()}); err != nil {
		t.Fatal(err)
	}
	// Identify's news of b's protocols is what makes a's router open its
	// stream. Had the router tried only after the refusal ends (a slow
	// identify, under -race on a busy machine), it would have opened the
	// stream by itself and the repair loop would have had nothing to do.
	eventually(t, 5*time.Second, "a's router to try b and be refused", func() bool { return a.refused.Load() > 0 })
	// a's stream to b failed: a's router forgot b, and b never got a's
	// subscriptions, so neither counts the other as a topic peer.
	time.Sleep(repairInterval / 2)
	for i, cp := range cps {
		if n := len(cp.hbTopic.ListPeers()); n != 0 {
			t.Fatalf("plane %d sees %d topic peers while a's streams are refused", i, n)
		}
	}
	if !identified {
		if err := hosts[0].Peerstore().SetProtocols(hosts[1].ID()); err != nil {
			t.Fatal(err)
		}
	}
	a.refuse.Store(false)
	eventually(t, 4*repairInterval, "a and b to see each other after the repair", func() bool {
		for _, cp := range cps {
			if len(cp.hbTopic.ListPeers()) != 1 || len(cp.annTopic.ListPeers()) != 1 {
				return false
			}
		}
		return true
	})
	if st := cps[0].Stats(); st.Repairs == 0 {
		t.Fatalf("a's stats %v: no repair counted", st)
	}
	if st := cps[1].Stats(); st.Repairs != 0 {
		t.Fatalf("b's stats %v: repaired a healthy peer", st)
	}
}
