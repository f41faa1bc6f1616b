package attack

import (
	"context"
	"slices"
	"testing"

	"github.com/starling-ml/starling/compression"
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
