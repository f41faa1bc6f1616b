package p2p_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/starling-ml/starling/aggregate"
	"github.com/starling-ml/starling/aggregate/p2p"
	"github.com/starling-ml/starling/node"
)

// loopbackNodes starts n real nodes on loopback, the first two connected,
// and a context for the test (30 s).
func loopbackNodes(t *testing.T, n int) (context.Context, []*node.Node) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	nodes := make([]*node.Node, n)
	for i := range nodes {
		nd, err := node.New(ctx, node.TestConfig())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nd.Close() })
		nodes[i] = nd
	}
	if err := nodes[0].Connect(ctx, nodes[1].AddrInfo()); err != nil {
		t.Fatal(err)
	}
	return ctx, nodes
}

// TestRecvDisconnected: a Recv waiting on a peer fails with ErrDisconnected
// (naming the peer) as soon as the peer's connection closes, and so does
// one posted after it closed; a chunk that arrived before is still
// delivered. A peer that was never connected is waited for as usual.
func TestRecvDisconnected(t *testing.T) {
	ctx, nodes := loopbackNodes(t, 3)
	a, b := p2p.New(nodes[0]), p2p.New(nodes[1])
	defer a.Close()
	idB := p2p.ID(nodes[1].ID())
	tag := func(c uint32) aggregate.Tag {
		return aggregate.Tag{Round: 1, Digest: 9, Step: aggregate.StepRing, Chunk: c}
	}
	sent := []float32{1, 2, 3}
	if err := b.Send(ctx, p2p.ID(nodes[0].ID()), tag(1), sent); err != nil {
		t.Fatal(err)
	}
	got := make([]float32, 3)
	if err := a.Recv(ctx, idB, tag(1), got); err != nil || !slices.Equal(got, sent) {
		t.Fatalf("chunk 1: %v %v", got, err)
	}

	waiting := make(chan error, 1)
	start := time.Now()
	go func() { waiting <- a.Recv(ctx, idB, tag(2), got) }()
	time.Sleep(50 * time.Millisecond) // posted
	b.Close()
	nodes[1].Close()
	isGone := func(what string, err error) {
		t.Helper()
		var pe *aggregate.PeerError
		if !errors.Is(err, aggregate.ErrDisconnected) || !errors.Is(err, aggregate.ErrUnreachable) || !errors.As(err, &pe) || pe.Peer != idB {
			t.Fatalf("%s: %v, want ErrDisconnected from %s", what, err, idB)
		}
	}
	select {
	case err := <-waiting:
		isGone("waiting Recv", err)
		t.Logf("a waiting Recv failed %v after the peer closed", time.Since(start)-50*time.Millisecond)
	case <-time.After(10 * time.Second):
		t.Fatal("a waiting Recv did not notice the closed connection")
	}
	isGone("Recv after the close", a.Recv(ctx, idB, tag(3), got))

	// Never connected: only the caller's deadline ends the wait.
	short, stop := context.WithTimeout(ctx, 200*time.Millisecond)
	defer stop()
	if err := a.Recv(short, p2p.ID(nodes[2].ID()), tag(4), got); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Recv from a peer never connected: %v, want the deadline", err)
	}
}

// TestRecvSurvivesBlip: a connection that closes and opens again within
// DisconnectGrace (or closes while what the peer sent before is still
// being read) does not fail the waits on the peer.
func TestRecvSurvivesBlip(t *testing.T) {
	ctx, nodes := loopbackNodes(t, 2)
	a, b := p2p.New(nodes[0]), p2p.New(nodes[1])
	defer a.Close()
	defer b.Close()
	tag := aggregate.Tag{Round: 1, Digest: 9, Step: aggregate.StepRing, Chunk: 1}
	got := make(chan error, 1)
	go func() { got <- a.Recv(ctx, p2p.ID(nodes[1].ID()), tag, make([]float32, 3)) }()
	time.Sleep(50 * time.Millisecond) // posted
	if err := nodes[0].Host().Network().ClosePeer(nodes[1].ID()); err != nil {
		t.Fatal(err)
	}
	if err := nodes[0].Connect(ctx, nodes[1].AddrInfo()); err != nil {
		t.Fatal(err)
	}
	if err := b.Send(ctx, p2p.ID(nodes[0].ID()), tag, []float32{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("Recv across a reconnect: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Recv across a reconnect did not return")
	}
}

// TestProbe: a connected live peer answers a probe; once its node has
// closed, a probe of it fails at once as unreachable, not as a timeout.
func TestProbe(t *testing.T) {
	ctx, nodes := loopbackNodes(t, 2)
	a := p2p.New(nodes[0])
	defer a.Close()
	idB := p2p.ID(nodes[1].ID())
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := a.Probe(pctx, idB); err != nil {
		t.Fatalf("probe of a live peer: %v", err)
	}
	nodes[1].Close()
	start := time.Now()
	err := a.Probe(pctx, idB)
	if !errors.Is(err, aggregate.ErrUnreachable) {
		t.Fatalf("probe of a closed peer: %v, want ErrUnreachable", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("probe of a closed peer took %v", took)
	}
}
