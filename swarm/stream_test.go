package swarm

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/starling-ml/starling/compression"
	"github.com/starling-ml/starling/gossip/average"
	"github.com/starling-ml/starling/gossip/wire"
)

// streamNets gives each of ps a StreamNet on its control plane and a new
// stream transport, closed at the test's end.
func streamNets(t *testing.T, ps []*Peer) []*StreamNet {
	t.Helper()
	nets := make([]*StreamNet, len(ps))
	for i, p := range ps {
		tr, err := NewStreamTransport(p.Node, p.cfg.Gossip.Model, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() })
		nets[i] = &StreamNet{CP: p.Control, T: tr}
	}
	return nets
}

// TestStreamNet runs the three faces of a StreamNet between two mocknet
// peers: an announced vector is pulled and checked (train.AsyncNet), the
// heartbeats say who is alive and how far it is (train.GossipProgress),
// and an AD-PSGD exchange averages two models (train.GossipNet).
func TestStreamNet(t *testing.T) {
	ps := newSwarm(t, 2)
	nets := streamNets(t, ps)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, p := range ps {
		if err := p.WaitPeers(ctx, 2); err != nil {
			t.Fatal(err)
		}
	}
	a, b := nets[0], nets[1]

	payload := []byte("twelve bytes")
	ann := wire.Announcement{Version: 3, Base: 2, Kind: wire.KindModel, Codec: compression.IDFP32, Elems: 3, Key: "model/3"}
	var got *wire.Announcement
	for got == nil { // the first announcements may go out before the topic's mesh
		if err := a.Publish(ctx, ann, payload); err != nil {
			t.Fatal(err)
		}
		nctx, ncancel := context.WithTimeout(ctx, 500*time.Millisecond)
		got, _ = b.Next(nctx)
		ncancel()
		if ctx.Err() != nil {
			t.Fatal("announcement never arrived")
		}
	}
	if got.Peer != a.Self() || got.Source() != a.Self() || got.Size != uint64(len(payload)) || got.Digest != wire.Digest(payload) {
		t.Fatalf("announcement %+v", got)
	}
	pulled, err := b.Fetch(ctx, got, nil)
	if err != nil || string(pulled) != string(payload) {
		t.Fatalf("fetched %q, %v", pulled, err)
	}

	if !b.Alive(a.Self()) {
		t.Fatal("a is not alive to b")
	}
	a.SetSteps(42)
	if err := a.CP.Beat(ctx); err != nil {
		t.Fatal(err)
	}
	for s, ok := b.Steps(a.Self()); !ok || s != 42; s, ok = b.Steps(a.Self()) {
		if ctx.Err() != nil {
			t.Fatalf("b sees a at step %d (%v), want 42", s, ok)
		}
		time.Sleep(10 * time.Millisecond)
	}

	act := average.NewPairwisePeer([]float32{1, 2, 3}, average.Active)
	pas := average.NewPairwisePeer([]float32{3, 2, 1}, average.Passive)
	ex := a.Bind(act, 3)
	b.Bind(pas, 3)
	if err := act.Exchange(ctx, ex, b.Self()); err != nil {
		t.Fatal(err)
	}
	if x, y := act.Model(nil), pas.Model(nil); !slices.Equal(x, []float32{2, 2, 2}) || !slices.Equal(y, x) {
		t.Fatalf("after the exchange: %v and %v, want the mean", x, y)
	}
}
