package aggtest

import (
	"context"
	"testing"

	"github.com/starling-ml/starling/aggregate"
	"github.com/starling-ml/starling/peerid"
)

// summing is a transport that sums on arrival and keeps checksums: it
// records what Faulty hands it.
type summing struct {
	aggregate.Transport
	axpys, sent, forwarded int
}

func (s *summing) Send(context.Context, peerid.ID, aggregate.Tag, []float32) error {
	s.sent++
	return nil
}

func (s *summing) RecvAxpy(context.Context, peerid.ID, aggregate.Tag, []float32, float32, []float32) (aggregate.Received, error) {
	s.axpys++
	return aggregate.Received{Summed: true, In: true, Out: true, Sums: aggregate.Checksums{7}}, nil
}

func (s *summing) SendReceived(context.Context, peerid.ID, aggregate.Tag, []float32, aggregate.Checksums) error {
	s.forwarded++
	return nil
}

// TestFaultyPassesAxpy: Faulty hands RecvAxpy and SendReceived to a
// transport that has them, but sends what its hook saw (and may have
// changed) without the old checksums; over one that has not, RecvAxpy is
// a plain receive.
func TestFaultyPassesAxpy(t *testing.T) {
	ctx := t.Context()
	s := &summing{}
	f := NewFaulty(s, "a", nil, nil)
	if r, err := f.RecvAxpy(ctx, "b", aggregate.Tag{}, make([]float32, 4), 2, make([]float32, 4)); err != nil || !r.Summed || len(r.Sums) != 1 || s.axpys != 1 {
		t.Fatalf("RecvAxpy: %+v, %v; %d calls", r, err, s.axpys)
	}
	if err := f.SendReceived(ctx, "b", aggregate.Tag{}, make([]float32, 4), aggregate.Checksums{7}); err != nil || s.forwarded != 1 {
		t.Fatalf("SendReceived: %v; %d forwarded", err, s.forwarded)
	}
	hooked := NewFaulty(s, "a", func(_, _ peerid.ID, _ aggregate.Tag, x []float32) Action { x[0] = 1; return Deliver }, nil)
	if err := hooked.SendReceived(ctx, "b", aggregate.Tag{}, make([]float32, 4), aggregate.Checksums{7}); err != nil || s.forwarded != 1 || s.sent != 1 {
		t.Fatalf("hooked SendReceived: %v; %d forwarded, %d sent", err, s.forwarded, s.sent)
	}

	n := NewNetwork(Config{})
	plain := NewFaulty(n.Join("a"), "a", nil, nil)
	ctx2, cancel := context.WithCancel(ctx)
	cancel()
	if r, err := plain.RecvAxpy(ctx2, "b", aggregate.Tag{}, make([]float32, 4), 2, make([]float32, 4)); r.Summed || err == nil {
		t.Fatalf("RecvAxpy over a plain transport: %+v, %v", r, err)
	}
}
