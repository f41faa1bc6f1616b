package attack

import (
	"context"
	"slices"
	"testing"

	"github.com/starling-ml/starling/compression"
	"github.com/starling-ml/starling/gossip/average"
	"github.com/starling-ml/starling/gossip/wire"
	"github.com/starling-ml/starling/peerid"
	"github.com/starling-ml/starling/train"
)

// sentNet is a train.Net whose all-reduce returns result and records
// what it was sent.
type sentNet struct {
	train.Net
	sent   [][]float32
	result []float32
}

func (n *sentNet) AllReduce(_ context.Context, _ uint64, group []peerid.ID, dst, src []float32, _ float64) ([]peerid.ID, error) {
	n.sent = append(n.sent, slices.Clone(src))
	copy(dst, n.result)
	return group, nil
}

// TestNetMeasuresFromRoundStart: a federated attacker scales its update
// from the model the round started from: init, then each round's result;
// its own vectors stay honest; flood announces count vectors per round.
func TestNetMeasuresFromRoundStart(t *testing.T) {
	inner := &sentNet{result: []float32{10, 10}}
	var anns []wire.Announcement
	ann := func(_ context.Context, a wire.Announcement) error { anns = append(anns, a); return nil }
	n := WrapNet(inner, NewTransformer(Attack{Kind: Scale, Factor: -10}, 1), true, []float32{1, 1}, ann)
	dst := make([]float32, 2)
	src := []float32{2, 0}
	n.AllReduce(context.Background(), 1, nil, dst, src, 1)
	n.AllReduce(context.Background(), 2, nil, dst, []float32{11, 9}, 1)
	if want := [][]float32{{-9, 11}, {0, 20}}; !slices.EqualFunc(inner.sent, want, slices.Equal) {
		t.Fatalf("sent %v, want %v", inner.sent, want)
	}
	if !slices.Equal(src, []float32{2, 0}) {
		t.Fatalf("the attacker's own vector changed: %v", src)
	}
	if len(anns) != 0 {
		t.Fatalf("scale announced %d vectors", len(anns))
	}
	// Gradients: from zero.
	g := WrapNet(inner, NewTransformer(Attack{Kind: Flood, Count: 3, Size: 5}, 1), false, nil, ann)
	g.AllReduce(context.Background(), 7, nil, dst, []float32{1, 2}, 1)
	if got := inner.sent[2]; !slices.Equal(got, []float32{1, 2}) {
		t.Fatalf("flood changed the gradient: %v", got)
	}
	if len(anns) != 3 || anns[0].Size != 5*8 || anns[0].Elems != 2 || anns[0].Kind != wire.KindGradient || anns[0].Key == anns[1].Key {
		t.Fatalf("flood announced %+v", anns)
	}
}

type pubNet struct {
	train.AsyncNet
	payload []byte
}

func (n *pubNet) Publish(_ context.Context, _ wire.Announcement, payload []byte) error {
	n.payload = slices.Clone(payload)
	return nil
}

// TestAsyncNetReencodes: the published payload is the attacked vector in
// the announcement's codec.
func TestAsyncNetReencodes(t *testing.T) {
	for _, c := range []compression.Codec{compression.FP32{}, compression.FP16{}} {
		inner := &pubNet{}
		n := WrapAsyncNet(inner, NewTransformer(Attack{Kind: SignFlip}, 1), nil)
		vec := []float32{1, -2, 0.5}
		if err := n.Publish(context.Background(), wire.Announcement{Codec: c.ID(), Elems: 3, Kind: wire.KindModel}, c.Encode(nil, vec)); err != nil {
			t.Fatal(err)
		}
		got := make([]float32, 3)
		if err := c.Decode(got, inner.payload); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, []float32{-1, 2, -0.5}) {
			t.Fatalf("%s: published %v", c.Name(), got)
		}
	}
}

// swapNet is a train.GossipNet whose exchanger records what it sends and
// whose bound handler the test calls as a remote peer would.
type swapNet struct {
	train.GossipNet
	h    average.Handler
	sent [][]float32
}

func (n *swapNet) Bind(h average.Handler, _ int) average.Exchanger { n.h = h; return n }

func (n *swapNet) Swap(_ context.Context, _ peerid.ID, mine, theirs []float32) error {
	n.sent = append(n.sent, slices.Clone(mine))
	return nil
}

func (n *swapNet) Push(_ context.Context, _ peerid.ID, s average.Share) error {
	n.sent = append(n.sent, slices.Clone(s.X))
	return nil
}

// localModel is a Handler whose model is x.
type localModel struct{ x []float32 }

func (l *localModel) HandleShare(average.Share) error { return nil }

func (l *localModel) HandleSwap(_ peerid.ID, theirs, mine []float32) error {
	copy(mine, l.x)
	for i := range l.x {
		l.x[i] = (l.x[i] + theirs[i]) / 2
	}
	return nil
}

// TestGossipNetLiesOutward: Swap, Push and the passive reply carry the
// attacked model; the attacker's own model averages honestly.
func TestGossipNetLiesOutward(t *testing.T) {
	inner := &swapNet{}
	n := WrapGossipNet(inner, NewTransformer(Attack{Kind: Scale, Factor: -10}, 1))
	own := &localModel{x: []float32{1, 2}}
	if _, ok := n.(train.GossipProgress); ok {
		t.Fatal("the wrapper claims step counts its network does not carry")
	}
	ex := n.Bind(own, 2)
	mine := []float32{1, 2}
	ex.Swap(context.Background(), "p", mine, make([]float32, 2))
	ex.Push(context.Background(), "p", average.Share{X: []float32{3, 4}, W: 1})
	if want := [][]float32{{-10, -20}, {-30, -40}}; !slices.EqualFunc(inner.sent, want, slices.Equal) {
		t.Fatalf("sent %v, want %v", inner.sent, want)
	}
	if !slices.Equal(mine, []float32{1, 2}) {
		t.Fatalf("Swap changed the caller's model: %v", mine)
	}
	reply := make([]float32, 2)
	if err := inner.h.HandleSwap("p", []float32{3, 4}, reply); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(reply, []float32{-10, -20}) || !slices.Equal(own.x, []float32{2, 3}) {
		t.Fatalf("passive reply %v (want -10, -20), own model %v (want 2, 3)", reply, own.x)
	}
}
