package node

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/client"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/starling-ml/starling/compression"
	"github.com/starling-ml/starling/device"
	"github.com/starling-ml/starling/node/mux"
)

// testMuxer, if set, is the Muxer of every test node on loopback TCP: `go
// test ./node -node.muxer starling` runs the node tests over node/mux.
var testMuxer = flag.String("node.muxer", "", "Config.Muxer of the loopback test nodes (default: DefaultConfig's)")

// newTestNode starts a real libp2p host on loopback TCP.
func newTestNode(t testing.TB, mut func(*Config), opts ...Option) *Node {
	t.Helper()
	cfg := TestConfig()
	if *testMuxer != "" {
		cfg.Muxer = *testMuxer
	}
	if mut != nil {
		mut(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, err := New(ctx, cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

func connect(t testing.TB, a, b *Node) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.Connect(ctx, b.AddrInfo()); err != nil {
		t.Fatal(err)
	}
}

func randBytes(n int, seed uint64) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for k := range 8 {
			b[i+k] = byte(v >> (8 * k))
		}
	}
	return b
}

// rawTensor is a float32 tensor of n elements with random bytes.
func rawTensor(tag Tag, n int, seed uint64) Tensor {
	return Tensor{Tag: tag, Codec: compression.IDFP32, DType: Float32, Shape: []int{n},
		Version: 3, Step: 11, Payload: randBytes(4*n, seed)}
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestSendRecv(t *testing.T) {
	a, b := newTestNode(t, nil), newTestNode(t, nil)
	connect(t, a, b)
	want := rawTensor(7, 3*4, 1)
	want.Shape = []int{3, 4}

	got := make(chan Tensor, 1)
	go func() {
		tn, err := b.Recv(ctxT(t, 10*time.Second), a.ID(), 7, make([]byte, 100))
		if err != nil {
			t.Error(err)
		}
		got <- tn
	}()
	if err := a.Send(ctxT(t, 10*time.Second), b.ID(), want); err != nil {
		t.Fatal(err)
	}
	tn := <-got
	if !bytes.Equal(tn.Payload, want.Payload) || tn.Tag != 7 || tn.From != a.ID() ||
		tn.Version != 3 || tn.Step != 11 || tn.DType != Float32 || len(tn.Shape) != 2 || tn.Shape[0] != 3 || tn.Shape[1] != 4 {
		t.Fatalf("got %+v", tn)
	}
	if v := counterValue(b.m.tensors.WithLabelValues("recv")); v != 1 {
		t.Fatalf("recv counter %v", v)
	}
}

// TestRecvAfterArrival: a tensor that arrives before its Recv is parked,
// then copied into the Recv's buffer (or handed over when dst is nil).
func TestRecvAfterArrival(t *testing.T) {
	a, b := newTestNode(t, nil), newTestNode(t, nil)
	connect(t, a, b)
	t1, t2 := rawTensor(1, 1000, 2), rawTensor(2, 5000, 3)
	for _, tn := range []Tensor{t1, t2} {
		if err := a.Send(ctxT(t, 10*time.Second), b.ID(), tn); err != nil {
			t.Fatal(err)
		}
	}
	dst := make([]byte, 4000)
	got, err := b.Recv(ctxT(t, 10*time.Second), a.ID(), 1, dst)
	if err != nil || !bytes.Equal(got.Payload, t1.Payload) || &got.Payload[0] != &dst[0] {
		t.Fatalf("tag 1: %v", err)
	}
	got, err = b.Recv(ctxT(t, 10*time.Second), "", 2, nil) // any peer, no buffer
	if err != nil || !bytes.Equal(got.Payload, t2.Payload) || got.From != a.ID() {
		t.Fatalf("tag 2: %v", err)
	}
	b.ts.mu.Lock()
	parked := b.ts.parked
	b.ts.mu.Unlock()
	if parked != 0 {
		t.Fatalf("parked bytes %d after both claimed", parked)
	}
}

func TestRecvShortBuffer(t *testing.T) {
	a, b := newTestNode(t, nil), newTestNode(t, nil)
	connect(t, a, b)
	errc := make(chan error, 1)
	posted := make(chan struct{})
	go func() {
		close(posted)
		_, err := b.Recv(ctxT(t, 10*time.Second), a.ID(), 9, make([]byte, 10))
		errc <- err
	}()
	<-posted
	waitPosted(t, b, mkey{a.ID(), 9})
	a.Send(ctxT(t, 10*time.Second), b.ID(), rawTensor(9, 100, 1))
	if err := <-errc; !errors.Is(err, ErrShortBuffer) {
		t.Fatalf("got %v, want ErrShortBuffer", err)
	}
}

// waitPosted blocks until n has a Recv posted for key.
func waitPosted(t testing.TB, n *Node, key mkey) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n.ts.mu.Lock()
		r := n.ts.posted[key]
		ch := n.ts.changed
		n.ts.mu.Unlock()
		if r != nil {
			return
		}
		select {
		case <-ch:
		case <-time.After(time.Until(deadline)):
			t.Fatal("Recv never posted")
		}
	}
}

// TestTensor256MB sends a 256 MiB tensor (striped) and checks it bit for
// bit.
func TestTensor256MB(t *testing.T) {
	if testing.Short() {
		t.Skip("256 MiB transfer skipped with -short")
	}
	a, b := newTestNode(t, nil), newTestNode(t, nil)
	connect(t, a, b)
	want := rawTensor(1, 64<<20, 42) // 64 Mi float32 = 256 MiB
	dst := make([]byte, len(want.Payload))
	errc := make(chan error, 1)
	var got Tensor
	go func() {
		var err error
		got, err = b.Recv(ctxT(t, 2*time.Minute), a.ID(), 1, dst)
		errc <- err
	}()
	waitPosted(t, b, mkey{a.ID(), 1})
	start := time.Now()
	if err := a.Send(ctxT(t, 2*time.Minute), b.ID(), want); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	t.Logf("256 MiB in %v (%d stripes)", time.Since(start), a.ts.stripeCount(len(want.Payload), a.cfg.Stripes))
	if !bytes.Equal(got.Payload, want.Payload) {
		t.Fatal("payload differs")
	}
}

// TestSameTagInFlight sends two tensors with one tag to one peer at once,
// on two streams (gossip's concurrent fetch requests): the one-frame
// tensor that arrives while the other is still being received waits for
// it, and each Recv gets a whole tensor. Both used to fail, the second as
// a bad header.
func TestSameTagInFlight(t *testing.T) {
	started, queued := make(chan struct{}), make(chan struct{})
	var startOnce, queueOnce sync.Once
	hooks := &testHooks{
		recvProgress: func(peer.ID, int) {
			startOnce.Do(func() {
				close(started)
				select { // hold the first tensor until the second is behind it
				case <-queued:
				case <-time.After(10 * time.Second):
				}
			})
		},
		queued: func(Tag) { queueOnce.Do(func() { close(queued) }) },
	}
	a := newTestNode(t, func(c *Config) { c.Stripes = 1 })
	b := newTestNode(t, nil, withTestHooks(hooks))
	connect(t, a, b)
	// 32 MiB, more than a stream's window: the first Send holds its
	// stream until b reads on, so the second goes on another.
	first, second := rawTensor(7, 8<<20, 1), rawTensor(7, 100, 2)
	ctx := ctxT(t, time.Minute)
	type result struct {
		t   Tensor
		err error
	}
	recvd := make(chan result, 1)
	go func() {
		got, err := b.Recv(ctx, a.ID(), 7, make([]byte, len(first.Payload)))
		recvd <- result{got, err}
	}()
	waitPosted(t, b, mkey{a.ID(), 7})
	sent := make(chan error, 2)
	go func() { sent <- a.Send(ctx, b.ID(), first) }()
	select {
	case <-started:
	case <-ctx.Done():
		t.Fatal("the first tensor never arrived")
	}
	go func() { sent <- a.Send(ctx, b.ID(), second) }()
	r := <-recvd
	if r.err != nil || !bytes.Equal(r.t.Payload, first.Payload) {
		t.Fatalf("first Recv: %v (payload equal: %v)", r.err, bytes.Equal(r.t.Payload, first.Payload))
	}
	got, err := b.Recv(ctx, a.ID(), 7, nil)
	if err != nil || !bytes.Equal(got.Payload, second.Payload) {
		t.Fatalf("second Recv: %v (payload equal: %v)", err, bytes.Equal(got.Payload, second.Payload))
	}
	for range 2 {
		if err := <-sent; err != nil {
			t.Fatal(err)
		}
	}
}

// TestCancelMidTransfer cancels the sender's ctx once the receiver has some
// of the tensor: both sides must end promptly with an error. Then the
// receiver's: its Recv ends promptly, and the rest of the tensor is
// drained, so the sender's Send succeeds (TestRecvGivingUpDrains checks
// the frames behind it).
func TestCancelMidTransfer(t *testing.T) {
	const size = 32 << 20 // float32s: 128 MiB
	for _, side := range []string{"sender", "receiver"} {
		t.Run(side, func(t *testing.T) {
			sendCtx, cancelSend := context.WithTimeout(context.Background(), time.Minute)
			defer cancelSend()
			recvCtx, cancelRecv := context.WithTimeout(context.Background(), time.Minute)
			defer cancelRecv()
			var once sync.Once
			var received int
			hooks := &testHooks{recvProgress: func(_ peer.ID, n int) {
				received += n // called from one stripe reader at a time per chunk; racy sums are fine for a threshold
				if received >= 4<<20 {
					once.Do(func() {
						if side == "sender" {
							cancelSend()
						} else {
							cancelRecv()
						}
					})
				}
			}}
			a := newTestNode(t, func(c *Config) { c.Stripes = 1 })
			b := newTestNode(t, nil, withTestHooks(hooks))
			connect(t, a, b)
			tn := rawTensor(5, size, 9)
			errc := make(chan error, 1)
			go func() {
				_, err := b.Recv(recvCtx, a.ID(), 5, make([]byte, len(tn.Payload)))
				errc <- err
			}()
			waitPosted(t, b, mkey{a.ID(), 5})
			start := time.Now()
			sendErr := a.Send(sendCtx, b.ID(), tn)
			var recvErr error
			select {
			case recvErr = <-errc:
			case <-time.After(10 * time.Second):
				t.Fatal("receiver did not end within 10 s")
			}
			took := time.Since(start)
			if side == "sender" && (sendErr == nil || !errors.Is(recvErr, ErrReset)) {
				t.Fatalf("send err %v, recv err %v: want a failed Send and ErrReset", sendErr, recvErr)
			}
			if side == "receiver" && (sendErr != nil || !errors.Is(recvErr, context.Canceled)) {
				t.Fatalf("send err %v, recv err %v: want a drained Send and context.Canceled", sendErr, recvErr)
			}
			t.Logf("%s cancel: send %v / recv %v after %v", side, sendErr, recvErr, took)
		})
	}
}

func TestWrongPSKNoConnection(t *testing.T) {
	k1, _ := GeneratePSK()
	k2, _ := GeneratePSK()
	var logs syncBuffer
	a := newTestNode(t, func(c *Config) { c.PSK = k1 }, WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	b := newTestNode(t, func(c *Config) { c.PSK = k2 })
	plain := newTestNode(t, nil)
	same := newTestNode(t, func(c *Config) { c.PSK = k1 })
	for _, pair := range [][2]*Node{{a, b}, {b, a}, {a, plain}, {plain, a}} {
		ctx := ctxT(t, 5*time.Second)
		err := pair[0].Connect(ctx, pair[1].AddrInfo())
		if err == nil {
			t.Fatalf("%s connected to %s across different swarm keys", pair[0].ID(), pair[1].ID())
		}
		// The dialer hears a clear sentence, not libp2p's framing errors;
		// a handshake that stalls instead says that.
		if msg := err.Error(); !errors.Is(err, ErrSwarmKey) && !strings.Contains(msg, "handshake did not complete") ||
			strings.Contains(msg, "newline") || !strings.Contains(msg, "swarm key") || strings.Contains(msg, "\n") {
			t.Errorf("%s to %s: %q, want one line naming the swarm key", pair[0].ID(), pair[1].ID(), msg)
		}
		if err := pair[0].Send(ctx, pair[1].ID(), rawTensor(1, 10, 1)); err == nil {
			t.Fatal("send succeeded across different swarm keys")
		}
	}
	for _, n := range []*Node{a, b, plain} {
		for _, p := range n.Peers() {
			if p != same.ID() {
				t.Fatalf("%s has a connection to %s", n.ID(), p)
			}
		}
		if v := counterValue(n.m.tensors.WithLabelValues("recv")); v != 0 {
			t.Fatalf("%s received %v tensors", n.ID(), v)
		}
	}
	// a, dialled by b and by plain, names the cause at warn level, once for
	// the address both dialled from.
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(logs.String(), `msg="refused a connection" from=127.0.0.1 `) {
		if time.Now().After(deadline) {
			t.Fatalf("no warning for refused handshakes in:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := strings.Count(logs.String(), "refused a connection"); n > 1 {
		t.Fatalf("%d warnings for one address within %v, want 1:\n%s", n, refusalLogEvery, logs.String())
	}
	if !strings.Contains(logs.String(), "swarm key (--psk)") {
		t.Fatalf("the warning does not name the swarm key:\n%s", logs.String())
	}
	// Same key: works.
	connect(t, a, same)
	go a.Send(ctxT(t, 10*time.Second), same.ID(), rawTensor(1, 10, 1))
	if _, err := same.Recv(ctxT(t, 10*time.Second), a.ID(), 1, nil); err != nil {
		t.Fatal(err)
	}
}

func TestAllowlist(t *testing.T) {
	friend := newTestNode(t, nil)
	stranger := newTestNode(t, nil)
	var logs syncBuffer
	guarded := newTestNode(t, func(c *Config) { c.Allowlist = []peer.ID{friend.ID()} }, WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))

	for i, pair := range [][2]*Node{{stranger, guarded}, {guarded, stranger}} {
		ctx := ctxT(t, 5*time.Second)
		err := pair[0].Connect(ctx, pair[1].AddrInfo())
		// Either way the dialler hears why, in one sentence: the
		// stranger that its handshake succeeded but it was not admitted,
		// the guarded peer that it does not dial strangers.
		if !errors.Is(err, ErrNotAllowed) || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "--allow") {
			t.Fatalf("pair %d: Connect: %v", i, err)
		}
		waitDisconnected(t, pair[0], pair[1].ID())
		stranger.host.Peerstore().AddAddrs(guarded.ID(), guarded.host.Addrs(), time.Minute)
		if err := pair[0].Send(ctx, pair[1].ID(), rawTensor(1, 10, 1)); err == nil {
			t.Fatalf("%s sent to %s", pair[0].ID(), pair[1].ID())
		}
	}
	for _, p := range guarded.Peers() {
		if p == stranger.ID() {
			t.Fatal("guarded node keeps a connection to a stranger")
		}
	}
	if v := counterValue(guarded.m.tensors.WithLabelValues("recv")); v != 0 {
		t.Fatal("guarded node received a tensor from a stranger")
	}
	if v := counterValue(stranger.m.tensors.WithLabelValues("recv")); v != 0 {
		t.Fatal("stranger received a tensor")
	}
	// The guarded side names the stranger once, however often it knocks.
	if line := fmt.Sprintf("level=WARN msg=\"refused a connection\" peer=%s reason=\"not on the allowlist (--allow)\"", stranger.ID()); strings.Count(logs.String(), line) != 1 {
		t.Fatalf("want one line %q in:\n%s", line, logs.String())
	}
	connect(t, friend, guarded)
	go friend.Send(ctxT(t, 10*time.Second), guarded.ID(), rawTensor(1, 10, 1))
	if _, err := guarded.Recv(ctxT(t, 10*time.Second), friend.ID(), 1, nil); err != nil {
		t.Fatal(err)
	}
}

func waitDisconnected(t testing.TB, n *Node, p peer.ID) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for n.host.Network().Connectedness(p) == network.Connected {
		if time.Now().After(deadline) {
			t.Fatalf("%s still connected to %s", n.ID(), p)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestBadFramesResetStream writes malformed frames on real streams: each
// is refused with a reset, counted under its reason, and never delivered.
func TestBadFramesResetStream(t *testing.T) {
	var logs syncBuffer
	a, b := newTestNode(t, nil), newTestNode(t, func(c *Config) { c.MaxTensorBytes = 1 << 20 }, WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	connect(t, a, b)
	good := rawHeader(3, 64)
	payload := randBytes(int(good.length), 5)
	frame := func(mut func(h *header)) []byte {
		h := good
		mut(&h)
		return appendFrame(nil, &h, payload)
	}
	cases := []struct {
		reason string
		bytes  []byte
	}{
		{"too_large", frame(func(h *header) { h.codec = compression.IDInt8; h.length = 1 << 40 })},
		{"checksum", func() []byte { f := frame(func(*header) {}); f[len(f)-1] ^= 1; return f }()},
		{"unknown_codec", frame(func(h *header) { h.codec = 0x33 })},
		{"unknown_dtype", frame(func(h *header) { h.dtype = 99 })},
		{"shape_mismatch", frame(func(h *header) { h.shape[0] = 65 })},
		{"bad_magic", []byte("GET / HTTP/1.1\r\n\r\n......................................................")},
		{"truncated", frame(func(*header) {})[:fixedHeaderLen+12+100]},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			before := counterValue(b.m.rejected.WithLabelValues(c.reason))
			s, err := a.host.NewStream(ctxT(t, 5*time.Second), b.ID(), ProtocolID)
			if err != nil {
				t.Fatal(err)
			}
			s.SetDeadline(time.Now().Add(10 * time.Second))
			s.Write(c.bytes)
			if c.reason == "truncated" {
				s.CloseWrite()
			}
			// The receiver answers with a reset, never with data.
			n, err := s.Read(make([]byte, 1))
			if n != 0 || err == nil || errors.Is(err, io.EOF) {
				t.Fatalf("read %d, %v: want a reset", n, err)
			}
			if after := counterValue(b.m.rejected.WithLabelValues(c.reason)); after != before+1 {
				t.Fatalf("rejected{%s} went %v -> %v", c.reason, before, after)
			}
			// One warning names the sender and the reason; a truncated
			// frame (a peer dying mid-send) is only counted.
			line := fmt.Sprintf("level=WARN msg=\"rejected a tensor frame\" peer=%s reason=%s", a.ID(), c.reason)
			if got := strings.Count(logs.String(), line); got != 1 && c.reason != "truncated" || got != 0 && c.reason == "truncated" {
				t.Fatalf("%d log lines %q in:\n%s", got, line, logs.String())
			}
		})
	}
	// A second bad frame of a reason already logged is held back.
	s, err := a.host.NewStream(ctxT(t, 5*time.Second), b.ID(), ProtocolID)
	if err != nil {
		t.Fatal(err)
	}
	s.Write(cases[0].bytes)
	s.SetReadDeadline(time.Now().Add(10 * time.Second))
	s.Read(make([]byte, 1))
	if got := strings.Count(logs.String(), "reason="+cases[0].reason); got != 1 {
		t.Fatalf("%d lines for %s after a second bad frame, want 1 (rate limited)", got, cases[0].reason)
	}
	b.ts.mu.Lock()
	defer b.ts.mu.Unlock()
	if len(b.ts.ready) != 0 || len(b.ts.asm) != 0 || b.ts.parked != 0 {
		t.Fatalf("bad frames left state: ready %d asm %d parked %d", len(b.ts.ready), len(b.ts.asm), b.ts.parked)
	}
}

// TestLinkPipelined streams many 1 MiB chunks back to back over a Link and
// checks each one.
func TestLinkPipelined(t *testing.T) {
	a, b := newTestNode(t, nil), newTestNode(t, nil)
	connect(t, a, b)
	const chunks = 32
	l, err := a.Link(ctxT(t, 10*time.Second), b.ID(), 2)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var want [chunks]Tensor
	for i := range want {
		want[i] = rawTensor(Tag(100+i), 256<<10, uint64(i))
	}
	errc := make(chan error, 1)
	go func() {
		for i := range want {
			if err := l.Send(ctxT(t, 30*time.Second), want[i]); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	buf := make([]byte, 1<<20)
	for i := range want {
		got, err := b.Recv(ctxT(t, 30*time.Second), a.ID(), Tag(100+i), buf)
		if err != nil {
			select {
			case serr := <-errc:
				t.Fatalf("%v (Send: %v)", err, serr)
			default:
				t.Fatal(err)
			}
		}
		if !bytes.Equal(got.Payload, want[i].Payload) {
			t.Fatalf("chunk %d differs", i)
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if p := l.pool; len(p.idle) == 0 || len(p.idle) > 2 {
		t.Fatalf("link keeps %d idle streams, want 1..2", len(p.idle))
	}
}

// TestRelayedConnCarriesNoTensors connects two peers through a circuit
// relay only: Send refuses the limited connection, and a stream forced onto
// it is reset by the receiver.
func TestRelayedConnCarriesNoTensors(t *testing.T) {
	relay := newTestNode(t, func(c *Config) { c.RelayService = true })
	a, b := newTestNode(t, nil), newTestNode(t, nil)
	connect(t, b, relay)
	connect(t, a, relay)
	if _, err := client.Reserve(ctxT(t, 10*time.Second), b.host, relay.AddrInfo()); err != nil {
		t.Fatal(err)
	}
	circuit, err := ma.NewMultiaddr(relay.host.Addrs()[0].String() + "/p2p/" + relay.ID().String() + "/p2p-circuit")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Connect(ctxT(t, 10*time.Second), peer.AddrInfo{ID: b.ID(), Addrs: []ma.Multiaddr{circuit}}); err != nil {
		t.Fatal(err)
	}
	for _, c := range a.host.Network().ConnsToPeer(b.ID()) {
		if !c.Stat().Limited {
			t.Fatal("expected only a limited connection")
		}
	}
	if err := a.Send(ctxT(t, time.Second), b.ID(), rawTensor(1, 10, 1)); !errors.Is(err, ErrLimitedConn) {
		t.Fatalf("send over relay: %v, want ErrLimitedConn", err)
	}
	before := counterValue(b.m.rejected.WithLabelValues("limited_conn"))
	ctx := network.WithAllowLimitedConn(ctxT(t, 5*time.Second), "test")
	s, err := a.host.NewStream(ctx, b.ID(), ProtocolID)
	if err != nil {
		t.Fatal(err)
	}
	h := rawHeader(1, 10)
	s.Write(appendFrame(nil, &h, make([]byte, h.length)))
	if _, err := s.Read(make([]byte, 1)); err == nil || errors.Is(err, io.EOF) {
		t.Fatalf("read %v: want a reset", err)
	}
	if after := counterValue(b.m.rejected.WithLabelValues("limited_conn")); after != before+1 {
		t.Fatalf("limited_conn rejections %v -> %v", before, after)
	}
}

func TestMetricsEndpoint(t *testing.T) {
	a := newTestNode(t, nil)
	b := newTestNode(t, func(c *Config) { c.MetricsAddr = "127.0.0.1:0" })
	connect(t, a, b)
	go a.Send(ctxT(t, 10*time.Second), b.ID(), rawTensor(1, 1000, 1))
	if _, err := b.Recv(ctxT(t, 10*time.Second), a.ID(), 1, nil); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + b.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(body)
	for _, want := range []string{
		`starling_node_stream_bytes_total{direction="received",peer="` + a.ID().String() + `",protocol="/starling/tensor/1.0.0"}`,
		`starling_node_tensors_total{direction="recv"} 1`,
		`starling_node_transfer_seconds_bucket`,
		`libp2p_`, // libp2p's own collectors
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

func TestCloseFailsPendingRecv(t *testing.T) {
	a := newTestNode(t, nil)
	errc := make(chan error, 1)
	go func() {
		_, err := a.Recv(context.Background(), "", 1, nil)
		errc <- err
	}()
	waitPosted(t, a, mkey{"", 1})
	a.Close()
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Fatalf("got %v, want ErrClosed", err)
	}
	if _, err := a.Recv(context.Background(), "", 1, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Recv after Close: %v", err)
	}
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

// TestInsecure: Insecure nodes talk to each other in plaintext and to no
// node that runs TLS or Noise, either way round.
func TestInsecure(t *testing.T) {
	a := newTestNode(t, func(c *Config) { c.Insecure = true })
	b := newTestNode(t, func(c *Config) { c.Insecure = true })
	secure := newTestNode(t, nil)
	for _, pair := range [][2]*Node{{a, secure}, {secure, a}} {
		ctx := ctxT(t, 5*time.Second)
		if err := pair[0].Connect(ctx, pair[1].AddrInfo()); !errors.Is(err, ErrSecurityMismatch) {
			t.Fatalf("%s to %s across security settings: %v, want ErrSecurityMismatch", pair[0].ID(), pair[1].ID(), err)
		}
	}
	if len(secure.Peers()) != 0 || len(a.Peers()) != 0 {
		t.Fatalf("connections across security settings: %v %v", secure.Peers(), a.Peers())
	}
	connect(t, a, b)
	want := rawTensor(5, 1<<20, 9)
	go a.Send(ctxT(t, 10*time.Second), b.ID(), want)
	got, err := b.Recv(ctxT(t, 10*time.Second), a.ID(), 5, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Payload, want.Payload) || got.From != a.ID() {
		t.Fatalf("plaintext transfer differs")
	}
	c := b.host.Network().ConnsToPeer(a.ID())
	if len(c) == 0 || c[0].ConnState().Security != "/plaintext/2.0.0" {
		t.Fatalf("connection security %v, want plaintext", c)
	}
}

// TestUncheckedFrames: on a TLS connection the payload checksum is left to
// TLS (frames say so, and the receiver takes them); on a plaintext one
// frames carry it, and one that says it has none is refused.
func TestUncheckedFrames(t *testing.T) {
	unchecked := func(tag Tag) []byte {
		h := rawHeader(tag, 256)
		h.flags = flagNoChecksum
		b := appendHeader(nil, &h)
		b = append(b, randBytes(int(h.length), 1)...)
		return append(b, 0, 0, 0, 0) // no trailer checksum
	}
	for _, insecure := range []bool{false, true} {
		t.Run(fmt.Sprintf("insecure=%v", insecure), func(t *testing.T) {
			var flags atomic.Uint32
			hooks := &testHooks{recvFlags: func(f uint32) { flags.Or(f | 1<<31) }}
			a := newTestNode(t, func(c *Config) { c.Insecure = insecure })
			b := newTestNode(t, func(c *Config) { c.Insecure = insecure }, withTestHooks(hooks))
			connect(t, a, b)
			conns := a.host.Network().ConnsToPeer(b.ID())
			if len(conns) == 0 || authenticated(conns[0]) == insecure {
				t.Fatalf("authenticated(%v) = %v with Insecure %v", conns, !insecure, insecure)
			}
			// Send picks the frame kind itself; either way the tensor arrives.
			want := rawTensor(1, 1<<16, 3)
			go a.Send(ctxT(t, 10*time.Second), b.ID(), want)
			got, err := b.Recv(ctxT(t, 10*time.Second), a.ID(), 1, nil)
			if err != nil || !bytes.Equal(got.Payload, want.Payload) {
				t.Fatalf("Send/Recv: %v", err)
			}
			if f := flags.Load(); f == 0 || (f&flagNoChecksum != 0) == insecure {
				t.Fatalf("received frames had flags %#x; want the payload checksum left out only over TLS", f)
			}
			before := counterValue(b.m.rejected.WithLabelValues("bad_header"))
			s, err := a.host.NewStream(ctxT(t, 5*time.Second), b.ID(), ProtocolID)
			if err != nil {
				t.Fatal(err)
			}
			s.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := s.Write(unchecked(2)); err != nil {
				t.Fatal(err)
			}
			if !insecure {
				got, err := b.Recv(ctxT(t, 10*time.Second), a.ID(), 2, nil)
				if err != nil || len(got.Payload) != 4*256 {
					t.Fatalf("unchecked frame over TLS: %v", err)
				}
				s.Close()
				return
			}
			if n, err := s.Read(make([]byte, 1)); n != 0 || err == nil || errors.Is(err, io.EOF) {
				t.Fatalf("read %d, %v: want a reset", n, err)
			}
			if after := counterValue(b.m.rejected.WithLabelValues("bad_header")); after != before+1 {
				t.Fatalf("rejected{bad_header} went %v -> %v", before, after)
			}
		})
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent writers (a logger on
// stream-handler goroutines).
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestStarlingMuxer: nodes that offer node/mux first use it between them,
// in plaintext and with TLS, and fall back to yamux with a node that does
// not offer it; tensors (striped over several streams) arrive intact.
func TestStarlingMuxer(t *testing.T) {
	starling := func(insecure bool) func(*Config) {
		return func(c *Config) { c.Muxer, c.Insecure, c.MinStripeBytes = MuxerStarling, insecure, 256<<10 }
	}
	for _, tc := range []struct {
		name string
		a, b func(*Config)
		want string
	}{
		{"plaintext", starling(true), starling(true), mux.ID},
		{"tls", starling(false), starling(false), mux.ID},
		{"fallback", starling(false), func(c *Config) { c.Muxer = MuxerYamux }, "/yamux/1.0.0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := newTestNode(t, tc.a), newTestNode(t, tc.b)
			connect(t, a, b)
			want := rawTensor(5, 1<<20, 9)
			go a.Send(ctxT(t, 10*time.Second), b.ID(), want)
			got, err := b.Recv(ctxT(t, 10*time.Second), a.ID(), 5, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Payload, want.Payload) {
				t.Fatal("tensor differs")
			}
			c := b.host.Network().ConnsToPeer(a.ID())
			if len(c) == 0 || string(c[0].ConnState().StreamMultiplexer) != tc.want {
				t.Fatalf("muxer %v, want %s", c, tc.want)
			}
		})
	}
}

// finiteTensor is a float32 tensor of n finite values.
func finiteTensor(tag Tag, n int, seed uint64) Tensor {
	t := rawTensor(tag, n, seed)
	r := rand.New(rand.NewPCG(seed, 1))
	for i := 0; i < n; i++ {
		binary.LittleEndian.PutUint32(t.Payload[4*i:], math.Float32bits(float32(r.NormFloat64())))
	}
	return t
}

// TestRecvFinite: Recv reports a float32 tensor free of NaN and ±Inf
// (checked in the checksum's pass on plaintext, in the staging buffer over
// TLS) whether it was read into the Recv's buffer or parked first, and in
// one stripe or several; it does not for one holding a NaN or +Inf (which
// it still delivers).
func TestRecvFinite(t *testing.T) {
	plain := func(c *Config) { c.Insecure, c.MinStripeBytes = true, 256<<10 }
	for _, tc := range []struct {
		name   string
		mut    func(*Config)
		n      int
		bad    uint32 // a value's bits put at n/3, if not 0
		parked bool
		want   bool
	}{
		{"plaintext", plain, 1 << 18, 0, false, true},
		{"plaintext striped", plain, 1 << 20, 0, false, true},
		{"plaintext parked", plain, 1 << 18, 0, true, true},
		{"plaintext small", plain, 3, 0, false, true},
		{"plaintext NaN", plain, 1 << 20, 0x7fc00000, false, false},
		{"plaintext +Inf parked", plain, 1 << 18, 0x7f800000, true, false},
		{"tls", nil, 1 << 18, 0, false, true},
		{"tls striped", nil, 1 << 20, 0, false, true},
		{"tls NaN", nil, 1 << 20, 0x7fc00000, false, false},
		{"tls +Inf parked", nil, 1 << 18, 0x7f800000, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := newTestNode(t, tc.mut), newTestNode(t, tc.mut)
			connect(t, a, b)
			want := finiteTensor(5, tc.n, 9)
			if tc.bad != 0 {
				binary.LittleEndian.PutUint32(want.Payload[4*(tc.n/3):], tc.bad)
			}
			sent := make(chan error, 1)
			send := func() { sent <- a.Send(ctxT(t, 10*time.Second), b.ID(), want) }
			if tc.parked {
				send()
				if err := <-sent; err != nil {
					t.Fatal(err)
				}
				sent <- nil
				waitParked(t, b, mkey{a.ID(), 5})
			} else {
				go send()
			}
			got, err := b.Recv(ctxT(t, 10*time.Second), a.ID(), 5, make([]byte, len(want.Payload)))
			if err != nil {
				t.Fatal(err)
			}
			if err := <-sent; err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Payload, want.Payload) {
				t.Fatal("tensor differs")
			}
			if got.Finite != tc.want {
				t.Fatalf("Finite %v, want %v", got.Finite, tc.want)
			}
		})
	}
}

// TestRecvAxpy: RecvAxpy leaves alpha·x + the received tensor in dst, with
// AxpyFinite's bits, whether the tensor was read straight in (in one
// stripe or several, in plaintext or over TLS) or parked first; it reports
// a received NaN (Finite false) apart from a sum that overflows
// (SumFinite false), and leaves a tensor that is not raw float32 as
// received (Summed false).
func TestRecvAxpy(t *testing.T) {
	plain := func(c *Config) { c.Insecure, c.MinStripeBytes = true, 256<<10 }
	tls := func(c *Config) { c.MinStripeBytes = 256 << 10 }
	const alpha = -1.5
	for _, tc := range []struct {
		name      string
		mut       func(*Config)
		n         int
		bad       uint32 // a received value's bits put at n/3, if not 0
		overflow  bool   // x[n/2] = MaxFloat32
		parked    bool
		codec     compression.ID // the tensor's codec, if not raw float32
		summed    bool
		fin, sumF bool
		plain     bool // on a connection with checksums
	}{
		{"plaintext", plain, 1 << 18, 0, false, false, 0, true, true, true, true},
		{"plaintext striped", plain, 1 << 20, 0, false, false, 0, true, true, true, true},
		{"plaintext parked", plain, 1 << 18, 0, false, true, 0, true, true, true, true},
		{"tls striped", tls, 1 << 20, 0, false, false, 0, true, true, true, false},
		{"tls parked", tls, 1 << 18, 0, false, true, 0, true, true, true, false},
		{"NaN received", plain, 1 << 20, 0x7fc00000, false, false, 0, true, false, false, true},
		{"overflow", tls, 1 << 18, 0, true, false, 0, true, true, false, false},
		{"not float32", plain, 1 << 18, 0, false, false, 7, false, false, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := newTestNode(t, tc.mut), newTestNode(t, tc.mut)
			connect(t, a, b)
			sentT := finiteTensor(5, tc.n, 9)
			if tc.codec != 0 {
				sentT.Codec = tc.codec
			}
			if tc.bad != 0 {
				binary.LittleEndian.PutUint32(sentT.Payload[4*(tc.n/3):], tc.bad)
			}
			x := make([]float32, tc.n)
			r := rand.New(rand.NewPCG(3, 4))
			for i := range x {
				x[i] = float32(r.NormFloat64())
			}
			if tc.overflow {
				x[tc.n/2] = -math.MaxFloat32
			}
			want := make([]float32, tc.n)
			for i := range want {
				want[i] = math.Float32frombits(binary.LittleEndian.Uint32(sentT.Payload[4*i:]))
			}
			summed := tc.summed && axpyToRuns
			if summed {
				device.AxpyFinite(device.NewFast(), alpha, x, want)
			}
			dst := make([]byte, 4*tc.n)
			type result struct {
				t   Tensor
				err error
			}
			recvd := make(chan result, 1)
			recv := func() {
				got, err := b.RecvAxpy(ctxT(t, 10*time.Second), a.ID(), 5, dst, Axpy{Alpha: alpha, X: x})
				recvd <- result{got, err}
			}
			if tc.parked { // the whole tensor first, then the Recv
				if err := a.Send(ctxT(t, 10*time.Second), b.ID(), sentT); err != nil {
					t.Fatal(err)
				}
				waitParked(t, b, mkey{a.ID(), 5})
				recv()
			} else { // the Recv first: the stripes are summed as they arrive
				go recv()
				waitPosted(t, b, mkey{a.ID(), 5})
				if err := a.Send(ctxT(t, 10*time.Second), b.ID(), sentT); err != nil {
					t.Fatal(err)
				}
			}
			res := <-recvd
			got, err := res.t, res.err
			if err != nil {
				t.Fatal(err)
			}
			if got.Summed != summed || (summed && (got.Finite != tc.fin || got.SumFinite != tc.sumF)) {
				t.Fatalf("Summed %v Finite %v SumFinite %v, want %v %v %v", got.Summed, got.Finite, got.SumFinite, summed, tc.fin, tc.sumF)
			}
			for i, w := range want {
				g := math.Float32frombits(binary.LittleEndian.Uint32(dst[4*i:]))
				if math.Float32bits(g) != math.Float32bits(w) && !(g != g && w != w) {
					t.Fatalf("dst[%d] = %v, want %v", i, g, w)
				}
			}
			// Checksums: of dst's stripes, over plaintext.
			if (got.Checksums != nil) != tc.plain {
				t.Fatalf("Checksums %v, want some: %v", got.Checksums, tc.plain)
			}
			checkCRCs(t, got.Checksums, dst)
			if tc.n == 1<<20 && tc.plain && len(got.Checksums) < 2 {
				t.Fatalf("%d checksums for a striped tensor", len(got.Checksums))
			}
		})
	}
	n := newTestNode(t, nil)
	if _, err := n.RecvAxpy(ctxT(t, time.Second), n.ID(), 5, make([]byte, 8), Axpy{X: make([]float32, 3)}); err == nil {
		t.Fatal("RecvAxpy with 8 bytes for 3 values: no error")
	}
}

// checkCRCs checks that sums are the CRC-32C of payload's stripes.
func checkCRCs(t testing.TB, sums []uint32, payload []byte) {
	t.Helper()
	k := uint16(len(sums))
	for i, c := range sums {
		off, n := stripeOffset(uint64(len(payload)), k, uint16(i)), stripeLen(uint64(len(payload)), k, uint16(i))
		if w := crc32.Checksum(payload[off:off+n], crc32.MakeTable(crc32.Castagnoli)); c != w {
			t.Fatalf("stripe %d of %d: checksum %08x, want %08x", i, k, c, w)
		}
	}
}

// TestSendChecksums: a tensor received over plaintext and sent on with
// its Checksums arrives intact and with the same checksums; a wrong one
// is sent as given (the receiver rejects the tensor), and checksums for
// another number of stripes are left unused.
func TestSendChecksums(t *testing.T) {
	plain := func(c *Config) { c.Insecure, c.MinStripeBytes = true, 256<<10 }
	a, b, c := newTestNode(t, plain), newTestNode(t, plain), newTestNode(t, plain)
	connect(t, a, b)
	connect(t, b, c)
	sent := finiteTensor(5, 1<<20, 9)
	if err := a.Send(ctxT(t, 10*time.Second), b.ID(), sent); err != nil {
		t.Fatal(err)
	}
	got, err := b.Recv(ctxT(t, 10*time.Second), a.ID(), 5, make([]byte, len(sent.Payload)))
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Checksums) < 2 {
		t.Fatalf("%d checksums for a striped tensor", len(got.Checksums))
	}
	checkCRCs(t, got.Checksums, got.Payload)
	sums := got.Checksums
	for i, tc := range []struct {
		name string
		sums []uint32
		ok   bool
	}{
		{"forwarded", sums, true},
		{"for fewer stripes", []uint32{0}, true},
		{"one wrong", append([]uint32{sums[0] ^ 1}, sums[1:]...), false}, // last: c resets the streams
	} {
		fwd := got
		fwd.Tag, fwd.Checksums = Tag(10+i), tc.sums
		var back Tensor
		recvd := make(chan error, 1)
		go func() { // posted first: a parked tensor that fails is dropped
			var err error
			back, err = c.Recv(ctxT(t, 10*time.Second), b.ID(), fwd.Tag, make([]byte, len(sent.Payload)))
			recvd <- err
		}()
		waitPosted(t, c, mkey{b.ID(), fwd.Tag})
		// With a wrong checksum the Send may fail too: c resets the
		// streams of stripes still arriving.
		if err := b.Send(ctxT(t, 10*time.Second), c.ID(), fwd); err != nil && tc.ok {
			t.Fatalf("%s: %v", tc.name, err)
		}
		err := <-recvd
		if !tc.ok {
			if !errors.Is(err, ErrChecksum) {
				t.Fatalf("%s: Recv: %v, want ErrChecksum", tc.name, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !bytes.Equal(back.Payload, sent.Payload) || !slices.Equal(back.Checksums, sums) {
			t.Fatalf("%s: payload or checksums changed on the way", tc.name)
		}
	}
}

// TestParkedRecycled: parked buffers copied out to their Recv's are
// recycled for later tensors, and a parked buffer handed to a Recv that
// brought none is not: what it got stays as it was.
func TestParkedRecycled(t *testing.T) {
	a, b := newTestNode(t, nil), newTestNode(t, nil)
	connect(t, a, b)
	var kept []byte
	for i := range 6 {
		sent := finiteTensor(Tag(20+i), 1<<18, uint64(i))
		if err := a.Send(ctxT(t, 10*time.Second), b.ID(), sent); err != nil {
			t.Fatal(err)
		}
		waitParked(t, b, mkey{a.ID(), sent.Tag})
		var dst []byte
		if i != 2 {
			dst = make([]byte, len(sent.Payload))
		}
		got, err := b.Recv(ctxT(t, 10*time.Second), a.ID(), sent.Tag, dst)
		if err != nil || !bytes.Equal(got.Payload, sent.Payload) {
			t.Fatalf("tensor %d: %v, or the payload differs", i, err)
		}
		if i == 2 {
			kept = got.Payload
		}
		if kept != nil && !bytes.Equal(kept, finiteTensor(22, 1<<18, 2).Payload) {
			t.Fatalf("after tensor %d: a handed-over buffer was written", i)
		}
	}
}

// waitParked waits until n holds the tensor of key parked whole.
func waitParked(t testing.TB, n *Node, key mkey) {
	t.Helper()
	for i := 0; ; i++ {
		n.ts.mu.Lock()
		ready := n.ts.ready[key] != nil
		n.ts.mu.Unlock()
		if ready {
			return
		}
		if i == 1000 {
			t.Fatal("the tensor was never parked")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
