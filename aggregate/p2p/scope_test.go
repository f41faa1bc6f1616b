package p2p_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/starling-ml/starling/aggregate"
	"github.com/starling-ml/starling/aggregate/p2p"
	"github.com/starling-ml/starling/peerid"
)

// TestScopeRefusesOutsiders: with a round's group scoped, a chunk of that
// round and attempt from a peer outside the group is drained unread and
// reported, a chunk of an earlier round too (without a report), and
// members' chunks pass.
func TestScopeRefusesOutsiders(t *testing.T) {
	nodes := newMocknet(t, 3, 0, 0)
	trs := make([]*p2p.Transport, 3)
	ids := make([]peerid.ID, 3)
	for i, n := range nodes {
		trs[i] = p2p.New(n)
		t.Cleanup(func() { trs[i].Close() })
		ids[i] = p2p.ID(n.ID())
	}
	g, err := aggregate.Form(7, ids[:2])
	if err != nil {
		t.Fatal(err)
	}
	trs[0].Scope(g)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tag := aggregate.Tag{Round: 7, Digest: g.Digest(), Step: aggregate.StepScatter, Chunk: 1}
	stale := tag
	stale.Round = 6
	data := []float32{1, 2, 3}
	// An outsider's chunk of the current round, one of an earlier round,
	// then a member's.
	if err := trs[2].Send(ctx, ids[0], tag, data); err != nil {
		t.Fatal(err)
	}
	if err := trs[1].Send(ctx, ids[0], stale, data); err != nil {
		t.Fatal(err)
	}
	if err := trs[1].Send(ctx, ids[0], tag, data); err != nil {
		t.Fatal(err)
	}
	got := make([]float32, 3)
	if err := trs[0].Recv(ctx, ids[1], tag, got); err != nil || got[2] != 3 {
		t.Fatalf("member's chunk: %v %v", got, err)
	}
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancelShort()
	if err := trs[0].Recv(short, ids[2], tag, got); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("outsider's chunk: %v, want a timeout", err)
	}
	short2, cancelShort2 := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancelShort2()
	if err := trs[0].Recv(short2, ids[1], stale, got); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("stale chunk: %v, want a timeout", err)
	}
	rej := trs[0].Rejected(7)
	if len(rej) != 1 || rej[0].Peer != ids[2] || !errors.Is(rej[0], aggregate.ErrNotMember) {
		t.Fatalf("rejected %v, want %s (ErrNotMember)", rej, ids[2])
	}
}
