package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"

	"github.com/starling-ml/starling/node/nodetest"
)

// newMocknet attaches n nodes to a fully connected mocknet whose links have
// the given latency and bandwidth (bytes/s).
func newMocknet(t *testing.T, n int, latency time.Duration, bw float64, mut func(*Config)) []*Node {
	t.Helper()
	_, nodes := newMocknetNet(t, n, latency, bw, mut)
	return nodes
}

// newMocknetNet is newMocknet that also returns the network, for tests
// that shape single links.
func newMocknetNet(t *testing.T, n int, latency time.Duration, bw float64, mut func(*Config)) (mocknet.Mocknet, []*Node) {
	t.Helper()
	mn := mocknet.New()
	t.Cleanup(func() { mn.Close() })
	mn.SetLinkDefaults(mocknet.LinkOptions{Latency: latency, Bandwidth: bw})
	nodes := make([]*Node, n)
	for i := range nodes {
		h, err := mn.GenPeer()
		if err != nil {
			t.Fatal(err)
		}
		cfg := TestConfig()
		if mut != nil {
			mut(&cfg)
		}
		nodes[i], err = Attach(h, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nodes[i].Close() })
	}
	if err := mn.LinkAll(); err != nil {
		t.Fatal(err)
	}
	if err := mn.ConnectAllButSelf(); err != nil {
		t.Fatal(err)
	}
	return mn, nodes
}

func roundTag(round, chunk int) Tag { return Tag(round)<<32 | Tag(chunk) }

// TestMocknetRing runs the traffic pattern of a ring all-reduce: every
// peer streams chunks to its successor over a Link while receiving its
// predecessor's, for several rounds, on links with latency.
func TestMocknetRing(t *testing.T) {
	const peers, rounds, chunks, chunkFloats = 8, 3, 4, 64 << 10
	nodes := newMocknet(t, peers, 2*time.Millisecond, 200<<20, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	payload := func(from, round, chunk int) Tensor {
		return rawTensor(roundTag(round, chunk), chunkFloats, uint64(from*1000+round*10+chunk))
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2*peers)
	for i, n := range nodes {
		next, prev := nodes[(i+1)%peers], (i+peers-1)%peers
		wg.Add(2)
		go func() {
			defer wg.Done()
			l, err := n.Link(ctx, next.ID(), 2)
			if err != nil {
				errs <- err
				return
			}
			defer l.Close()
			for r := range rounds {
				for c := range chunks {
					if err := l.Send(ctx, payload(i, r, c)); err != nil {
						errs <- err
						return
					}
				}
			}
		}()
		go func() {
			defer wg.Done()
			buf := make([]byte, 4*chunkFloats)
			for r := range rounds {
				for c := range chunks {
					got, err := n.Recv(ctx, nodes[prev].ID(), roundTag(r, c), buf)
					if err != nil {
						errs <- err
						return
					}
					if want := payload(prev, r, c); !bytes.Equal(got.Payload, want.Payload) {
						errs <- fmt.Errorf("peer %d round %d chunk %d: payload differs", i, r, c)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestMocknetFanIn: every peer sends the same tag to peer 0, which receives
// them with from = "" (any peer) and must see each sender exactly once.
func TestMocknetFanIn(t *testing.T) {
	const peers = 10
	nodes := newMocknet(t, peers, time.Millisecond, 0, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i, n := range nodes[1:] {
		go n.Send(ctx, nodes[0].ID(), rawTensor(42, 1000, uint64(i)))
	}
	seen := map[peer.ID]bool{}
	for range peers - 1 {
		got, err := nodes[0].Recv(ctx, "", 42, nil)
		if err != nil {
			t.Fatal(err)
		}
		if seen[got.From] {
			t.Fatalf("%s delivered twice", got.From)
		}
		seen[got.From] = true
	}
}

// TestMocknetBackPressure: with room to park only one tensor, a second
// unclaimed one waits in the sender's stream until its Recv comes, then
// arrives intact.
func TestMocknetBackPressure(t *testing.T) {
	nodes := newMocknet(t, 2, 0, 0, func(c *Config) { c.MaxParkedBytes = 1 << 20 })
	a, b := nodes[0], nodes[1]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	t1, t2 := rawTensor(1, 200<<10, 1), rawTensor(2, 200<<10, 2) // 800 KiB each
	if err := a.Send(ctx, b.ID(), t1); err != nil {
		t.Fatal(err)
	}
	sent := make(chan error, 1)
	go func() { sent <- a.Send(ctx, b.ID(), t2) }()
	// t2 cannot park while t1 holds the budget.
	got, err := b.Recv(ctx, a.ID(), 2, nil)
	if err != nil || !bytes.Equal(got.Payload, t2.Payload) {
		t.Fatalf("t2: %v", err)
	}
	got, err = b.Recv(ctx, a.ID(), 1, nil)
	if err != nil || !bytes.Equal(got.Payload, t1.Payload) {
		t.Fatalf("t1: %v", err)
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
}

func TestMocknetRecvErrors(t *testing.T) {
	nodes := newMocknet(t, 2, 0, 0, func(c *Config) { c.MaxTensorBytes = 1 << 20 })
	a, b := nodes[0], nodes[1]

	// Nothing sent: the deadline ends Recv, and nothing stays posted.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := b.Recv(ctx, a.ID(), 1, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want DeadlineExceeded", err)
	}
	b.ts.mu.Lock()
	if len(b.ts.posted) != 0 {
		t.Fatal("expired Recv left posted")
	}
	b.ts.mu.Unlock()

	// Two Recvs for one key.
	ctx2, cancel2 := context.WithCancel(context.Background())
	go b.Recv(ctx2, a.ID(), 2, nil)
	waitPosted(t, b, mkey{a.ID(), 2})
	if _, err := b.Recv(context.Background(), a.ID(), 2, nil); !errors.Is(err, ErrDuplicateRecv) {
		t.Fatalf("got %v, want ErrDuplicateRecv", err)
	}
	cancel2()

	// A tensor larger than the sender's own limit is refused before any I/O.
	big := Tensor{Tag: 3, Codec: 0, DType: Uint8, Shape: []int{int(a.cfg.MaxTensorBytes) + 1}}
	big.Payload = make([]byte, a.cfg.MaxTensorBytes+1)
	if err := a.Send(context.Background(), b.ID(), big); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("got %v, want ErrFrameTooLarge", err)
	}
	if err := a.Send(context.Background(), b.ID(), Tensor{Tag: 4, DType: Float32, Shape: []int{3}, Payload: make([]byte, 8)}); !errors.Is(err, ErrShapeMismatch) {
		t.Fatalf("got %v, want ErrShapeMismatch", err)
	}
}

// TestAnyPeerRecvTakesFirstComplete: a Recv from any peer returns the
// first tensor to arrive whole, not the first to start arriving. A slow
// sender (a 2 MB tensor over a 1 MB/s link) must not hold up a fast one
// behind it (gossip serves every peer's requests through such a Recv).
func TestAnyPeerRecvTakesFirstComplete(t *testing.T) {
	mn, nodes := newMocknetNet(t, 3, 0, 0, nil)
	recv, slow, fast := nodes[0], nodes[1], nodes[2]
	for _, l := range mn.LinksBetweenPeers(recv.ID(), slow.ID()) {
		l.SetOptions(mocknet.LinkOptions{Bandwidth: 1 << 20})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	go slow.Send(ctx, recv.ID(), rawTensor(42, 512<<10, 1)) // 2 MiB
	time.Sleep(100 * time.Millisecond)                      // its first bytes are in
	go fast.Send(ctx, recv.ID(), rawTensor(42, 1000, 2))
	start := time.Now()
	got, err := recv.Recv(ctx, "", 42, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.From != fast.ID() || time.Since(start) > time.Second {
		t.Fatalf("first Recv: the tensor of %s after %v, want the fast sender's at once", got.From, time.Since(start))
	}
	if got, err = recv.Recv(ctx, "", 42, nil); err != nil || got.From != slow.ID() {
		t.Fatalf("second Recv: %v from %s, want the slow sender's tensor", err, got.From)
	}
}

// parkState returns the bytes parked in all and from p.
func parkState(n *Node, p peer.ID) (all, from int64) {
	n.ts.mu.Lock()
	defer n.ts.mu.Unlock()
	return n.ts.parked, n.ts.byPeer[p]
}

// waitRejected waits until n counted want refusals under reason.
func waitRejected(t *testing.T, n *Node, reason string, want float64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for counterValue(n.m.rejected.WithLabelValues(reason)) < want {
		if time.Now().After(deadline) {
			t.Fatalf("rejected{%s} = %v, want %v", reason, counterValue(n.m.rejected.WithLabelValues(reason)), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestParkPerPeerCap: one member cannot park more than MaxParkedPerPeer
// even while MaxParkedBytes has room, and another member still can.
func TestParkPerPeerCap(t *testing.T) {
	const n = 150 << 10 // 600 KiB tensors; 1 MiB per peer, 4 MiB in all
	nodes := newMocknet(t, 3, 0, 0, func(c *Config) {
		c.MaxParkedPerPeer, c.MaxParkedBytes, c.IOTimeout = 1<<20, 4<<20, time.Second
	})
	a, b, c := nodes[0], nodes[1], nodes[2]
	ctx := ctxT(t, 30*time.Second)
	t1, t2, t3 := rawTensor(1, n, 1), rawTensor(2, n, 2), rawTensor(3, n, 3)
	if err := a.Send(ctx, b.ID(), t1); err != nil {
		t.Fatal(err)
	}
	if err := c.Send(ctx, b.ID(), t3); err != nil {
		t.Fatal(err)
	}
	// t2 finds a's share taken by t1: it waits IOTimeout for a Recv and is
	// refused; t1 and t3 stay parked.
	a.Send(ctx, b.ID(), t2)
	waitRejected(t, b, "timeout", 1)
	if all, fromA := parkState(b, a.ID()); all != 2*4*n || fromA != 4*n {
		t.Fatalf("parked %d in all, %d from a; want %d and %d", all, fromA, 2*4*n, 4*n)
	}
	for _, w := range []struct {
		from *Node
		t    Tensor
	}{{a, t1}, {c, t3}} {
		got, err := b.Recv(ctx, w.from.ID(), w.t.Tag, nil)
		if err != nil || !bytes.Equal(got.Payload, w.t.Payload) {
			t.Fatalf("tag %d: %v", w.t.Tag, err)
		}
	}
	if all, _ := parkState(b, a.ID()); all != 0 || len(b.ts.byPeer) != 0 {
		t.Fatalf("parked %d after all claimed (by peer %v)", all, b.ts.byPeer)
	}
}

// TestStrangerParksLittle: the peers SetMayPark refuses share
// MaxStrangerParked: a stranger's small tensor parks, a large one waits
// for its Recv with nothing allocated and is dropped after IOTimeout,
// while a member parks as much; a Recv waiting for the stranger by name
// takes its large tensor.
func TestStrangerParksLittle(t *testing.T) {
	nodes := newMocknet(t, 3, 0, 0, func(c *Config) { c.MaxStrangerParked, c.IOTimeout = 64<<10, time.Second })
	member, b, stranger := nodes[0], nodes[1], nodes[2]
	b.SetMayPark(func(p peer.ID) bool { return p == member.ID() })
	ctx := ctxT(t, 30*time.Second)
	big := rawTensor(7, 1<<20, 7) // 4 MiB announced
	stranger.Send(ctx, b.ID(), big)
	waitRejected(t, b, "timeout", 1)
	if all, from := parkState(b, stranger.ID()); all != 0 || from != 0 {
		t.Fatalf("a stranger parked %d bytes (%d in all) past MaxStrangerParked", from, all)
	}
	b.ts.mu.Lock()
	asm, ready := len(b.ts.asm), len(b.ts.ready)
	b.ts.mu.Unlock()
	if asm != 0 || ready != 0 {
		t.Fatalf("a stranger's tensor left %d assemblies, %d ready", asm, ready)
	}
	// A small one parks, within MaxStrangerParked, and so does a member's
	// large one.
	small := rawTensor(8, 1000, 8)
	if err := stranger.Send(ctx, b.ID(), small); err != nil {
		t.Fatal(err)
	}
	if err := member.Send(ctx, b.ID(), big); err != nil {
		t.Fatal(err)
	}
	for _, w := range []struct {
		from *Node
		t    Tensor
	}{{stranger, small}, {member, big}} {
		if got, err := b.Recv(ctx, w.from.ID(), w.t.Tag, nil); err != nil || !bytes.Equal(got.Payload, w.t.Payload) {
			t.Fatalf("tag %d: %v", w.t.Tag, err)
		}
	}
	// A Recv waiting for the stranger by name takes its large tensor.
	got := make(chan error, 1)
	go func() {
		tn, err := b.Recv(ctx, stranger.ID(), 9, make([]byte, len(big.Payload)))
		if err == nil && !bytes.Equal(tn.Payload, big.Payload) {
			err = errors.New("payload differs")
		}
		got <- err
	}()
	waitPosted(t, b, mkey{stranger.ID(), 9})
	big.Tag = 9
	if err := stranger.Send(ctx, b.ID(), big); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if all, _ := parkState(b, stranger.ID()); all != 0 || b.ts.strangers != 0 {
		t.Fatalf("parked %d (strangers %d) after all claimed", all, b.ts.strangers)
	}
}

// TestSendGivesUpOnStuckDial checks that Send returns when its context
// ends even if the host's dial does not: a FedAsync peer's pullers sat in
// such dials long after the run's deadline (docs/results/README.md, "256
// libp2p peers in one process").
func TestSendGivesUpOnStuckDial(t *testing.T) {
	mn := mocknet.New()
	t.Cleanup(func() { mn.Close() })
	var hs [2]host.Host
	for i := range hs {
		h, err := mn.GenPeer()
		if err != nil {
			t.Fatal(err)
		}
		hs[i] = h
	}
	if err := mn.LinkAll(); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	a, err := Attach(nodetest.StuckDialHost{Host: hs[0], Release: release}, TestConfig())
	if err != nil {
		t.Fatal(err)
	}
	b, err := Attach(hs[1], TestConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	t.Cleanup(func() { close(release) }) // first: lets the dial finish

	ctx := ctxT(t, 50*time.Millisecond)
	done := make(chan error, 1)
	go func() { done <- a.Send(ctx, b.ID(), rawTensor(1, 4, 1)) }()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Send = %v, want a context.DeadlineExceeded", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Send still waits for a dial 5 s after its 50 ms context ended")
	}
}
