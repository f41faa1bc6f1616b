package gossip

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"

	"github.com/starling-ml/starling/gossip/average"
	"github.com/starling-ml/starling/gossip/internal/avgtest"
	"github.com/starling-ml/starling/gossip/wire"
	"github.com/starling-ml/starling/node"
	"github.com/starling-ml/starling/peerid"
)

// nodeTransports attaches n nodes with gossip transports to a fully
// connected mocknet with the given link latency and bandwidth (bytes/s).
func nodeTransports(t testing.TB, n int, latency time.Duration, bw float64, model func(i int) string) ([]*node.Node, []*NodeTransport) {
	t.Helper()
	mn := mocknet.New()
	t.Cleanup(func() { mn.Close() })
	mn.SetLinkDefaults(mocknet.LinkOptions{Latency: latency, Bandwidth: bw})
	nodes := make([]*node.Node, n)
	trs := make([]*NodeTransport, n)
	for i := range n {
		h, err := mn.GenPeer()
		if err != nil {
			t.Fatal(err)
		}
		cfg := node.TestConfig()
		cfg.IOTimeout = 5 * time.Second
		if nodes[i], err = node.Attach(h, cfg); err != nil {
			t.Fatal(err)
		}
		nc := DefaultNodeConfig()
		if model != nil {
			nc.Model = model(i)
		}
		nc.ReplyTimeout = 5 * time.Second
		if trs[i], err = NewNodeTransport(nodes[i], nc); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { trs[i].Close(); nodes[i].Close() })
	}
	if err := mn.LinkAll(); err != nil {
		t.Fatal(err)
	}
	if err := mn.ConnectAllButSelf(); err != nil {
		t.Fatal(err)
	}
	return nodes, trs
}

// TestNodePushSumConsensus runs push-sum over node/ streams on 8 mocknet
// peers: synchronous rounds on the exponential graph reach exact consensus
// in log2(8) = 3 rounds, and the total weight stays 8.
func TestNodePushSumConsensus(t *testing.T) {
	const n, d = 8, 1000
	_, trs := nodeTransports(t, n, time.Millisecond, 0, nil)
	r := rand.New(rand.NewPCG(1, 2))
	xs, mean := avgtest.Models(r, n, d)
	spread0 := avgtest.Spread(xs, mean)
	ps := make([]*average.PushSumPeer, n)
	for i := range ps {
		ps[i] = average.NewPushSumPeer(xs[i])
		trs[i].Bind(ps[i], d)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	z := make([][]float32, n)
	for k := range uint64(3) {
		var wg sync.WaitGroup
		errs := make([]error, n)
		// Exact consensus needs every peer to split its mass before any
		// share of the round arrives; Push waits until all have.
		var shared sync.WaitGroup
		shared.Add(n)
		for i := range n {
			wg.Go(func() {
				errs[i] = ps[i].Step(ctx, barrierExchanger{trs[i], &shared}, trs[average.ExpGraphPeer(i, n, k)].Self(), k, 0)
			})
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d peer %d: %v", k, i, err)
			}
		}
	}
	wsum := 0.0
	for i := range ps {
		wsum += ps[i].Weight()
		z[i] = ps[i].Estimate(z[i])
	}
	if math.Abs(wsum-n) > 1e-9 {
		t.Fatalf("Σw = %v, want %d", wsum, n)
	}
	if s := avgtest.Spread(z, mean); s > 1e-5*spread0 {
		t.Fatalf("spread after 3 rounds %v (initial %v), want exact consensus", s, spread0)
	}
	if st := trs[0].Stats(); st.PushesIn != 3 {
		t.Fatalf("peer 0 absorbed %d pushes, want 3: %+v", st.PushesIn, st)
	}
}

// TestNodeSwap runs AD-PSGD exchanges over node/ streams: both models
// become their mean.
func TestNodeSwap(t *testing.T) {
	const d = 5000
	_, trs := nodeTransports(t, 2, time.Millisecond, 0, nil)
	a := make([]float32, d)
	b := make([]float32, d)
	for i := range a {
		a[i], b[i] = float32(i), float32(-3*i)
	}
	act, pas := average.NewPairwisePeer(a, average.Active), average.NewPairwisePeer(b, average.Passive)
	trs[0].Bind(act, d)
	trs[1].Bind(pas, d)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := act.Exchange(ctx, trs[0], trs[1].Self()); err != nil {
		t.Fatal(err)
	}
	x, y := act.Model(nil), pas.Model(nil)
	for i := range x {
		if want := float32(-i); x[i] != want || y[i] != want {
			t.Fatalf("element %d: %v and %v, want %v", i, x[i], y[i], want)
		}
	}
	// A passive peer refuses to start; an active one refuses to serve.
	if err := pas.Exchange(ctx, trs[1], trs[0].Self()); err == nil {
		t.Fatal("passive peer started an exchange")
	}
	err := trs[1].Swap(ctx, trs[0].Self(), x, y)
	if !errors.Is(err, ErrRefused) || !errors.Is(err, average.ErrNotDelivered) {
		t.Fatalf("swap with an active peer: %v, want ErrRefused and ErrNotDelivered", err)
	}
}

// TestNodeRefusals checks that pushes of another model, of the wrong
// length, with NaN values or to a peer with no handler are refused,
// reported as not delivered, counted, and leave the receiver unchanged.
func TestNodeRefusals(t *testing.T) {
	const d = 100
	_, trs := nodeTransports(t, 3, 0, 0, func(i int) string {
		if i == 2 {
			return "other-model"
		}
		return "default"
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	x := make([]float32, d)
	recv := average.NewPushSumPeer(x)
	trs[0].Bind(recv, d)
	send := func(from int, s average.Share) error { return trs[from].Push(ctx, trs[0].Self(), s) }
	ok := average.Share{X: make([]float32, d), W: 0.5}
	for i := range ok.X {
		ok.X[i] = 1
	}
	nan := average.Share{X: make([]float32, d), W: 0.5}
	nan.X[7] = float32(math.NaN())
	inf := average.Share{X: make([]float32, d), W: 0.5}
	inf.X[3] = float32(math.Inf(-1))
	cases := []struct {
		name string
		from int
		s    average.Share
		stat func(NodeStats) uint64
	}{
		{"other model", 2, ok, func(s NodeStats) uint64 { return s.RefusedModel }},
		{"short", 1, average.Share{X: make([]float32, d-1), W: 0.5}, func(s NodeStats) uint64 { return s.RefusedShape }},
		{"NaN", 1, nan, func(s NodeStats) uint64 { return s.RefusedHandler }},
		{"Inf", 1, inf, func(s NodeStats) uint64 { return s.RefusedHandler }},
		{"zero weight", 1, average.Share{X: make([]float32, d), W: 0}, func(s NodeStats) uint64 { return s.RefusedHandler }},
	}
	for _, tc := range cases {
		before := tc.stat(trs[0].Stats())
		err := send(tc.from, tc.s)
		if !errors.Is(err, ErrRefused) || !errors.Is(err, average.ErrNotDelivered) {
			t.Fatalf("%s: %v, want ErrRefused and ErrNotDelivered", tc.name, err)
		}
		if got := tc.stat(trs[0].Stats()); got != before+1 {
			t.Fatalf("%s: counter %d → %d", tc.name, before, got)
		}
		if w := recv.Weight(); w != 1 {
			t.Fatalf("%s reached the model: weight %v", tc.name, w)
		}
	}
	// A longer vector is refused too.
	before := trs[0].Stats().RefusedShape
	if err := send(1, average.Share{X: make([]float32, d+1), W: 0.5}); !errors.Is(err, ErrRefused) {
		t.Fatalf("long: %v, want ErrRefused", err)
	}
	if got := trs[0].Stats().RefusedShape; got != before+1 {
		t.Fatalf("long: counter %d → %d", before, got)
	}
	// A fetch request whose key does not fit is dropped unread and
	// counted; the requester learns nothing within its deadline.
	sctx, scancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := trs[1].Fetch(sctx, &wire.Announcement{Peer: trs[0].Self(), Key: string(make([]byte, 2*wire.MaxKeyLen)), Size: 4}, nil)
	scancel()
	if err == nil {
		t.Fatal("fetch with an oversized key succeeded")
	}
	eventually(t, 5*time.Second, "bad frame counted", func() bool { return trs[0].Stats().BadFrames == 1 })
	// No handler bound on peer 1.
	if err := trs[0].Push(ctx, trs[1].Self(), ok); !errors.Is(err, ErrRefused) {
		t.Fatalf("push to a peer with no handler: %v", err)
	}
	// A good push still works.
	if err := send(1, ok); err != nil {
		t.Fatal(err)
	}
	if w := recv.Weight(); w != 1.5 {
		t.Fatalf("weight %v after a good push, want 1.5", w)
	}
}

// TestNodeFetch serves a vector and fetches it by its announcement, and
// checks every way a fetch must fail: wrong digest, more bytes than
// announced, fewer bytes, an unknown or evicted key.
func TestNodeFetch(t *testing.T) {
	_, trs := nodeTransports(t, 2, time.Millisecond, 0, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	payload := make([]byte, 300_000)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	if err := trs[0].Serve("model/1", payload); err != nil {
		t.Fatal(err)
	}
	payload[0] = 99 // Serve copied it
	holder := trs[0].Self()
	ann := func(key string, size int, digest [32]byte) *wire.Announcement {
		return &wire.Announcement{Peer: holder, Key: key, Size: uint64(size), Digest: digest}
	}
	want := make([]byte, len(payload))
	copy(want, payload)
	want[0] = 0
	got, err := trs[1].Fetch(ctx, ann("model/1", len(want), wire.Digest(want)), nil)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Fatal("fetched bytes differ")
	}
	if _, err := trs[1].Fetch(ctx, ann("model/1", len(want), wire.Digest(payload)), nil); !errors.Is(err, ErrDigest) {
		t.Fatalf("wrong digest: %v", err)
	}
	if _, err := trs[1].Fetch(ctx, ann("model/1", len(want)+10, wire.Digest(want)), nil); !errors.Is(err, ErrDigest) {
		t.Fatalf("fewer bytes than announced: %v", err)
	}
	sctx, scancel := context.WithTimeout(ctx, 2*time.Second)
	_, err = trs[1].Fetch(sctx, ann("model/1", len(want)-10, wire.Digest(want)), nil)
	scancel()
	if !errors.Is(err, node.ErrShortBuffer) {
		t.Fatalf("more bytes than announced: %v, want node.ErrShortBuffer", err)
	}
	if _, err := trs[1].Fetch(ctx, ann("nope", 10, wire.Digest(nil)), nil); !errors.Is(err, ErrRefused) {
		t.Fatalf("unknown key: %v", err)
	}
	big := &wire.Announcement{Peer: holder, Key: "model/1", Size: 2 << 30}
	if _, err := trs[1].Fetch(ctx, big, nil); !errors.Is(err, wire.ErrTooLarge) {
		t.Fatalf("announced size over the cap: %v", err)
	}
	for i := range 10 {
		if err := trs[0].Serve(string(rune('a'+i)), []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := trs[1].Fetch(ctx, ann("model/1", len(want), wire.Digest(want)), nil); !errors.Is(err, ErrRefused) {
		t.Fatalf("evicted key: %v", err)
	}
	if got, err := trs[1].Fetch(ctx, ann("j", 1, wire.Digest([]byte{9})), nil); err != nil || got[0] != 9 {
		t.Fatalf("latest key: %v %v", got, err)
	}
}

// TestNodeFetchConcurrent pulls from one holder on several goroutines at
// once, as FedBuff's fetchers do: every pull succeeds. Concurrent requests
// share a tag; node/ used to reject the second of two that overlapped, and
// its requester waited for a reply until its deadline.
func TestNodeFetchConcurrent(t *testing.T) {
	_, trs := nodeTransports(t, 2, 0, 0, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const keys = 8
	for i := range keys {
		if err := trs[0].Serve(fmt.Sprint(i), bytes.Repeat([]byte{byte(i)}, 1000+i)); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8*keys)
	for g := range 8 {
		wg.Go(func() {
			for i := range keys {
				k := (i + g) % keys
				want := bytes.Repeat([]byte{byte(k)}, 1000+k)
				a := &wire.Announcement{Peer: trs[0].Self(), Key: fmt.Sprint(k), Size: uint64(len(want)), Digest: wire.Digest(want)}
				if _, err := trs[1].Fetch(ctx, a, nil); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestNodeDeadPeer checks that exchanges with a peer that died fail within
// their deadline instead of hanging.
func TestNodeDeadPeer(t *testing.T) {
	const d = 100
	nodes, trs := nodeTransports(t, 2, 0, 0, nil)
	trs[1].Bind(average.NewPushSumPeer(make([]float32, d)), d)
	dead := trs[1].Self()
	trs[1].Close()
	nodes[1].Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	p := average.NewPushSumPeer(make([]float32, d))
	err := p.Step(ctx, trs[0], dead, 0, 0)
	if err == nil {
		t.Fatal("push to a dead peer succeeded")
	}
	if el := time.Since(start); el > 3*time.Second {
		t.Fatalf("push to a dead peer took %v", el)
	}
	if errors.Is(err, average.ErrNotDelivered) && p.Weight() != 1 {
		t.Fatalf("not delivered but weight %v: mass lost", p.Weight())
	}
	_, err = trs[0].Fetch(ctx, &wire.Announcement{Peer: dead, Key: "k", Size: 4}, nil)
	if err == nil {
		t.Fatal("fetch from a dead peer succeeded")
	}
}

func TestNodeConfigValidate(t *testing.T) {
	if err := DefaultNodeConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	for _, mut := range []func(*NodeConfig){
		func(c *NodeConfig) { c.Model = "" },
		func(c *NodeConfig) { c.ReplyTimeout = 0 },
		func(c *NodeConfig) { c.MaxServed = 0 },
		func(c *NodeConfig) { c.MaxFetchBytes = 0 },
	} {
		c := DefaultNodeConfig()
		mut(&c)
		if err := c.Validate(); !errors.Is(err, ErrBadConfig) {
			t.Errorf("%+v: %v", c, err)
		}
	}
}

// FuzzDecodeFrame checks that no input makes the frame decoder panic and
// that what it accepts re-encodes to the same header.
func FuzzDecodeFrame(f *testing.F) {
	f.Add(appendF32(appendFrameHeader(nil, &frame{kind: kindPush, n: 2, seq: 9, weight: 0.5}), []float32{1, 2}))
	f.Add(append(appendFrameHeader(nil, &frame{kind: kindFetch, n: 3}), "abc"...))
	f.Add(appendFrameHeader(nil, &frame{kind: kindAck}))
	f.Add([]byte("GX"))
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := decodeFrame(b)
		if err != nil {
			return
		}
		h := appendFrameHeader(nil, &fr)
		if string(h) != string(b[:frameHeaderLen]) {
			t.Fatalf("header does not round-trip")
		}
		if fr.kind == kindPush || fr.kind == kindSwap || fr.kind == kindSwapReply {
			if len(fr.floats()) != int(fr.n) {
				t.Fatal("floats length")
			}
		}
	})
}

// BenchmarkNodeFetch measures one announce-and-pull of a vector over
// node/ streams on a mocknet link (no latency, no bandwidth cap), and one
// push-sum push (with its ack).
func BenchmarkNodeFetch(b *testing.B) {
	for _, n := range []int{50_000, 200_000} {
		b.Run(fmt.Sprintf("fetch/%dvalues", n), func(b *testing.B) {
			_, trs := nodeTransports(b, 2, 0, 0, nil)
			payload := make([]byte, 4*n)
			if err := trs[0].Serve("k", payload); err != nil {
				b.Fatal(err)
			}
			a := &wire.Announcement{Peer: trs[0].Self(), Key: "k", Size: uint64(len(payload)), Digest: wire.Digest(payload)}
			ctx := context.Background()
			var dst []byte
			b.SetBytes(int64(len(payload)))
			b.ReportAllocs()
			for b.Loop() {
				var err error
				if dst, err = trs[1].Fetch(ctx, a, dst); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("push/%dvalues", n), func(b *testing.B) {
			_, trs := nodeTransports(b, 2, 0, 0, nil)
			trs[1].Bind(average.NewPushSumPeer(make([]float32, n)), n)
			s := average.Share{X: make([]float32, n), W: 1e-9}
			ctx := context.Background()
			b.SetBytes(int64(4 * n))
			b.ReportAllocs()
			for b.Loop() {
				if err := trs[0].Push(ctx, trs[1].Self(), s); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// barrierExchanger holds every Push until all peers of the round have
// called Push (each has split its mass by then).
type barrierExchanger struct {
	average.Exchanger
	shared *sync.WaitGroup
}

func (b barrierExchanger) Push(ctx context.Context, to peerid.ID, s average.Share) error {
	b.shared.Done()
	b.shared.Wait()
	return b.Exchanger.Push(ctx, to, s)
}

// TestNodeConnected: Connected reports a live connection, and false for
// a peer whose connections are closed or an ID that is not libp2p's.
func TestNodeConnected(t *testing.T) {
	nodes, trs := nodeTransports(t, 2, time.Millisecond, 0, nil)
	if !trs[0].Connected(trs[1].Self()) {
		t.Fatal("connected peers reported unconnected")
	}
	if trs[0].Connected("not-a-peer-id") {
		t.Fatal("a malformed ID reported connected")
	}
	if err := nodes[0].Host().Network().ClosePeer(nodes[1].ID()); err != nil {
		t.Fatal(err)
	}
	if trs[0].Connected(trs[1].Self()) {
		t.Fatal("a closed connection reported connected")
	}
}
