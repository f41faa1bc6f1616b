package swarm

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"

	"github.com/starling-ml/starling/node"
	"github.com/starling-ml/starling/node/nodetest"
	"github.com/starling-ml/starling/peerid"
)

// TestFetchGoesOnWithoutStuckHolders fetches a state that one honest peer
// holds while another peer asked is stuck: frozen before it answers, or
// frozen in the middle of its stripe after announcing the right digest.
// The fetch must take the state from the honest holder well within its
// deadline, not wait for the stuck peer until the deadline and fail.
func TestFetchGoesOnWithoutStuckHolders(t *testing.T) {
	mn := mocknet.New()
	t.Cleanup(func() { mn.Close() })
	ps := attachPeers(t, mn, 2)
	state := vec(100000, 1)
	digest := Digest(state)
	stuck := func(handler network.StreamHandler) host.Host {
		h, err := mn.GenPeer()
		if err != nil {
			t.Fatal(err)
		}
		h.SetStreamHandler(StateProtocol, handler)
		return h
	}
	never := make(chan struct{})
	t.Cleanup(func() { close(never) })
	frozen := stuck(func(s network.Stream) { <-never; s.Reset() })
	staller := stuck(func(s network.Stream) {
		var rb [reqLen]byte
		if _, err := io.ReadFull(s, rb[:]); err != nil {
			return
		}
		req, _ := decodeReq(rb[:])
		head := make([]byte, replyHead)
		binary.BigEndian.PutUint64(head[1:], 7)
		binary.BigEndian.PutUint64(head[9:], uint64(len(state)))
		copy(head[17:], digest[:])
		binary.BigEndian.PutUint64(head[49:], req.offset)
		binary.BigEndian.PutUint64(head[57:], req.length)
		s.Write(head)
		if req.length > 0 {
			s.Write(make([]byte, 100)) // a little of the stripe, then nothing
			<-never
		}
		s.Close()
	})
	if err := mn.LinkAll(); err != nil {
		t.Fatal(err)
	}
	if err := mn.ConnectAllButSelf(); err != nil {
		t.Fatal(err)
	}
	ps[1].state.publish(7, state)
	ps[0].state.stall = 300 * time.Millisecond
	for name, others := range map[string][]host.Host{
		"frozen":           {frozen},
		"staller":          {staller},
		"frozen, staller":  {frozen, staller},
		"staller, frozen2": {staller, frozen},
	} {
		ids := []peerid.ID{ps[1].ID()}
		for _, h := range others {
			ids = append(ids, peerid.ID(h.ID().String()))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		dst := make([]float32, len(state))
		start := time.Now()
		v, err := ps[0].Fetch(ctx, ids, 7, dst)
		took := time.Since(start)
		cancel()
		if err != nil || v != 7 || !slices.Equal(dst, state) {
			t.Errorf("%s: version %d, %v after %v; want the state", name, v, err, took)
			continue
		}
		if took > 5*time.Second {
			t.Errorf("%s: took %v", name, took)
		}
		t.Logf("%s: fetched in %v", name, took)
	}
}

// deadlineOnly is a context whose deadline is d but whose timer never
// fires: Err stays nil, as it does for a moment after a real deadline.
type deadlineOnly struct {
	context.Context
	d time.Time
}

func (c deadlineOnly) Deadline() (time.Time, bool) { return c.d, true }

// TestFetchAtRunDeadlineEndsWithTheDeadline: a fetch's streams take the
// run's deadline, and one that fails by it, before ctx.Err() is set, ends
// the fetch with the deadline, not with a "bad state" charged to the
// holder (which callers take for a faulty peer, and a run for a failure).
func TestFetchAtRunDeadlineEndsWithTheDeadline(t *testing.T) {
	// Real hosts on loopback: mocknet's streams ignore deadlines.
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	var nodes [2]*node.Node
	for i := range nodes {
		nd, err := node.New(ctx, node.TestConfig())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nd.Close() })
		nodes[i] = nd
	}
	asker, err := Attach(nodes[0].Host(), testConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { asker.Close() })
	never := make(chan struct{})
	t.Cleanup(func() { close(never) })
	nodes[1].Host().SetStreamHandler(StateProtocol, func(s network.Stream) { <-never; s.Reset() })
	if err := nodes[0].Connect(ctx, nodes[1].AddrInfo()); err != nil {
		t.Fatal(err)
	}
	run := deadlineOnly{ctx, time.Now().Add(500 * time.Millisecond)}
	done := make(chan error, 1)
	go func() {
		_, err := asker.Fetch(run, []peerid.ID{peerid.ID(nodes[1].ID().String())}, 1, make([]float32, 10))
		done <- err
	}()
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("fetch still running 10 s after its deadline")
	}
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrBadState) {
		t.Errorf("fetch past the run's deadline: %v; want the deadline, not a bad state", err)
	}
}

// TestAbandonedWaitEnds asks a peer for a version it does not have and
// gives up: the holder must stop waiting for that version when the asker
// leaves, not hold the request (and so StateIdle, which keeps a finished
// peer up) until the wait the asker asked for runs out.
func TestAbandonedWaitEnds(t *testing.T) {
	ps := newSwarm(t, 2)
	ps[1].state.publish(1, vec(10, 0))
	// The asker offers to wait 29 s and gives up after 300 ms.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	time.AfterFunc(300*time.Millisecond, cancel)
	if _, err := ps[0].Fetch(ctx, []peerid.ID{ps[1].ID()}, 9, make([]float32, 10)); err == nil {
		t.Fatal("fetched a version nobody has")
	}
	gaveUp := time.Now()
	for !ps[1].StateIdle(0) {
		if time.Since(gaveUp) > 3*time.Second {
			t.Fatalf("the holder still serves an abandoned request %v after the asker gave up", time.Since(gaveUp))
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("holder idle %v after the asker gave up", time.Since(gaveUp))
}

// TestAskerClosingWriteStillServed: an asker that closes its write side
// after the request (as askers did before watchGone) is still waited for
// and answered.
func TestAskerClosingWriteStillServed(t *testing.T) {
	ps := newSwarm(t, 2)
	ps[1].state.publish(1, vec(10, 0))
	time.AfterFunc(300*time.Millisecond, func() { ps[1].state.publish(2, vec(10, 5)) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := ps[0].state.h.NewStream(ctx, ps[1].state.h.ID(), StateProtocol)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	st.SetDeadline(time.Now().Add(10 * time.Second))
	req := stateReq{version: 2, waitMS: 5000}
	if _, err := st.Write(req.encode()); err != nil {
		t.Fatal(err)
	}
	st.CloseWrite()
	head := make([]byte, replyHead)
	if _, err := io.ReadFull(st, head); err != nil {
		t.Fatal(err)
	}
	if head[0] != stOK || binary.BigEndian.Uint64(head[1:]) != 2 {
		t.Fatalf("status %d version %d, want the version published while it waited", head[0], binary.BigEndian.Uint64(head[1:]))
	}
}

// TestFetchEndsWithStuckDials: a state fetch that asks peers it cannot
// reach yet returns when its context ends, not when the dials do (the
// 256-client federation's sampled clients sat in fetchState, asking the
// 255 others for version 1, for minutes).
func TestFetchEndsWithStuckDials(t *testing.T) {
	mn := mocknet.New()
	t.Cleanup(func() { mn.Close() })
	ps := attachPeers(t, mn, 3)
	if err := mn.LinkAll(); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	s := newStateService(nodetest.StuckDialHost{Host: ps[0].state.h, Release: release}, 1<<20, time.Second)
	ps[1].state.publish(1, vec(10, 0))
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := s.fetch(ctx, []peer.ID{ps[1].state.h.ID(), ps[2].state.h.ID()}, 1, make([]float32, 10), 1)
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("fetched through a dial that never finished")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the fetch still waits for its dials 5 s after its 100 ms context ended")
	}
}

// TestHeaderAsksAllocateLittle: asking a holder for its state's header
// (every peer a fetch asks does so) allocates buffers the size of the
// reply, not 1 MiB on each side.
func TestHeaderAsksAllocateLittle(t *testing.T) {
	for _, c := range []struct {
		length uint64
		want   int
	}{{0, replyHead + 4}, {10, replyHead + 44}, {1 << 30, 1 << 20}} {
		if got := replyBuffer(c.length); got != c.want {
			t.Errorf("replyBuffer(%d) = %d, want %d", c.length, got, c.want)
		}
	}
	ps := newSwarm(t, 2)
	ps[1].state.publish(1, vec(10, 0))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ask := func() {
		if _, err := ps[0].state.request(ctx, ps[1].state.h.ID(), stateReq{version: 1, waitMS: 1000}, nil); err != nil {
			t.Fatal(err)
		}
	}
	ask() // the connection and its first stream
	const n = 50
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range n {
		ask()
	}
	runtime.ReadMemStats(&after)
	// Both sides run in this process: 2 MiB an ask with 1 MiB buffers.
	if per := (after.TotalAlloc - before.TotalAlloc) / n; per > 256<<10 {
		t.Errorf("a header ask allocated %d KiB", per>>10)
	}
}
