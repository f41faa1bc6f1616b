package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// sendBehind sends big then small to b on one pooled stream (Stripes = 1,
// sequential Sends reuse the idle stream), so that small is queued behind
// big's bytes.
func sendBehind(t *testing.T, a, b *Node, big, small Tensor) (bigErr, smallErr error) {
	t.Helper()
	ctx := ctxT(t, time.Minute)
	bigErr = a.Send(ctx, b.ID(), big)
	smallErr = a.Send(ctx, b.ID(), small)
	return bigErr, smallErr
}

// TestRecvGivingUpDrains: a Recv that gives up while its tensor arrives
// must not lose the frames queued behind it on the same stream (their
// Sends have returned nil): the rest of the tensor is drained, the
// stream stays up, and the sender's Send succeeds.
func TestRecvGivingUpDrains(t *testing.T) {
	const size = 32 << 20 // float32s: 128 MiB, well past the stream window
	recvCtx, cancelRecv := context.WithCancel(context.Background())
	defer cancelRecv()
	var once sync.Once
	var mu sync.Mutex
	received := 0
	hooks := &testHooks{recvProgress: func(_ peer.ID, n int) {
		mu.Lock()
		received += n
		r := received
		mu.Unlock()
		if r >= 4<<20 {
			once.Do(cancelRecv)
		}
	}}
	a := newTestNode(t, func(c *Config) { c.Stripes = 1 })
	b := newTestNode(t, nil, withTestHooks(hooks))
	connect(t, a, b)
	big, small := rawTensor(5, size, 9), rawTensor(6, 1000, 10)
	dst := make([]byte, len(big.Payload))
	errc := make(chan error, 1)
	var gaveUp time.Duration
	go func() {
		start := time.Now()
		_, err := b.Recv(recvCtx, a.ID(), 5, dst)
		gaveUp = time.Since(start)
		errc <- err
	}()
	waitPosted(t, b, mkey{a.ID(), 5})
	type res struct{ big, small error }
	sent := make(chan res, 1)
	go func() {
		be, se := sendBehind(t, a, b, big, small)
		sent <- res{be, se}
	}()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Recv: %v, want context.Canceled", err)
	}
	// Once Recv has returned, nothing writes into dst any more.
	snap := bytes.Clone(dst)
	got, err := b.Recv(ctxT(t, 30*time.Second), a.ID(), 6, nil)
	if err != nil {
		t.Fatalf("the tensor queued behind the abandoned one: %v", err)
	}
	if !bytes.Equal(got.Payload, small.Payload) {
		t.Fatal("the tensor queued behind differs")
	}
	r := <-sent
	if r.big != nil || r.small != nil {
		t.Fatalf("sends: %v, %v; want both nil", r.big, r.small)
	}
	if !bytes.Equal(snap, dst) {
		t.Fatal("dst was written after Recv returned")
	}
	mu.Lock()
	t.Logf("Recv gave up after %v with %d MiB in; drained the rest", gaveUp, received>>20)
	mu.Unlock()
	// The drained tensor is gone, not parked for a later Recv.
	if _, err := b.Recv(ctxT(t, 200*time.Millisecond), a.ID(), 5, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Recv of the abandoned tensor: %v, want a timeout", err)
	}
	b.ts.mu.Lock()
	left := len(b.ts.asm)
	b.ts.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d assemblies left", left)
	}
}

// TestShortBufferDrains: a tensor too large for its Recv's buffer fails
// that Recv and is drained; the next frame on the stream arrives.
func TestShortBufferDrains(t *testing.T) {
	a := newTestNode(t, func(c *Config) { c.Stripes = 1 })
	b := newTestNode(t, nil)
	connect(t, a, b)
	errc := make(chan error, 1)
	go func() {
		_, err := b.Recv(ctxT(t, 30*time.Second), a.ID(), 9, make([]byte, 10))
		errc <- err
	}()
	waitPosted(t, b, mkey{a.ID(), 9})
	bigErr, smallErr := sendBehind(t, a, b, rawTensor(9, 1<<20, 1), rawTensor(10, 100, 2))
	if err := <-errc; !errors.Is(err, ErrShortBuffer) {
		t.Fatalf("got %v, want ErrShortBuffer", err)
	}
	if bigErr != nil || smallErr != nil {
		t.Fatalf("sends: %v, %v", bigErr, smallErr)
	}
	if _, err := b.Recv(ctxT(t, 30*time.Second), a.ID(), 10, nil); err != nil {
		t.Fatalf("the tensor behind: %v", err)
	}
}

// TestAdmitHook: a refused tensor is drained unread (never parked, never
// handed to a Recv), counted, and the frames behind it arrive.
func TestAdmitHook(t *testing.T) {
	a := newTestNode(t, func(c *Config) { c.Stripes = 1 })
	b := newTestNode(t, nil)
	connect(t, a, b)
	var mu sync.Mutex
	var seen []string
	pass := b.AddAdmit(func(peer.ID, *Tensor) error { return nil })
	defer pass()
	remove := b.AddAdmit(func(from peer.ID, tn *Tensor) error {
		mu.Lock()
		seen = append(seen, fmt.Sprintf("%s/%d/%v/%d", from.ShortString(), tn.Tag, tn.Shape, tn.Version))
		mu.Unlock()
		if tn.Tag == 7 {
			return errors.New("not in this round")
		}
		return nil
	})
	for _, tag := range []Tag{7, 8} {
		if err := a.Send(ctxT(t, 30*time.Second), b.ID(), rawTensor(tag, 3<<20, uint64(tag))); err != nil {
			t.Fatal(err)
		}
	}
	got, err := b.Recv(ctxT(t, 30*time.Second), a.ID(), 8, nil)
	if err != nil || len(got.Payload) != 12<<20 {
		t.Fatalf("admitted tensor: %v", err)
	}
	if _, err := b.Recv(ctxT(t, 200*time.Millisecond), a.ID(), 7, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("refused tensor: %v, want a timeout", err)
	}
	b.ts.mu.Lock()
	parked := b.ts.parked
	b.ts.mu.Unlock()
	if parked != 0 {
		t.Fatalf("%d bytes parked", parked)
	}
	if v := counterValue(b.m.rejected.WithLabelValues("refused")); v != 1 {
		t.Fatalf("refused counter %v, want 1", v)
	}
	mu.Lock()
	defer mu.Unlock()
	want := fmt.Sprintf("%s/7/[%d]/3", a.ID().ShortString(), 3<<20)
	if len(seen) != 2 || seen[0] != want {
		t.Fatalf("hook saw %v, want %s first", seen, want)
	}
	remove()
	if err := a.Send(ctxT(t, 30*time.Second), b.ID(), rawTensor(7, 10, 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Recv(ctxT(t, 30*time.Second), a.ID(), 7, nil); err != nil {
		t.Fatalf("after removing the hook: %v", err)
	}
}

// TestRecvGivingUpOnStalledSender: a Recv whose sender stops halfway
// through a tensor gives up at its deadline, promptly, though its stripe
// reader is blocked reading into its buffer; nothing writes into the
// buffer once it returned; and the stream stays in step, so the rest of
// the tensor, when it comes, is drained and the frame behind it arrives.
func TestRecvGivingUpOnStalledSender(t *testing.T) {
	a, b := newTestNode(t, nil), newTestNode(t, nil)
	connect(t, a, b)
	h := rawHeader(5, 1<<20)
	payload := randBytes(int(h.length), 7)
	frame := appendFrame(nil, &h, payload)
	next := rawHeader(6, 1000)
	nextPayload := randBytes(int(next.length), 8)

	s, err := a.host.NewStream(ctxT(t, 5*time.Second), b.ID(), ProtocolID)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Reset()
	s.SetWriteDeadline(time.Now().Add(time.Minute))
	dst := make([]byte, h.length)
	errc := make(chan error, 1)
	var took time.Duration
	go func() {
		start := time.Now()
		_, err := b.Recv(ctxT(t, 300*time.Millisecond), a.ID(), 5, dst)
		took = time.Since(start)
		errc <- err
	}()
	waitPosted(t, b, mkey{a.ID(), 5})
	half := fixedHeaderLen + 12 + len(payload)/2 // into the payload (the header is shorter)
	if _, err := s.Write(frame[:half]); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Recv: %v, want its deadline", err)
	}
	if took > time.Second {
		t.Fatalf("Recv gave up after %v: want its 300 ms and a little", took)
	}
	snap := bytes.Clone(dst)
	if _, err := s.Write(append(frame[half:], appendFrame(nil, &next, nextPayload)...)); err != nil {
		t.Fatal(err)
	}
	got, err := b.Recv(ctxT(t, 10*time.Second), a.ID(), 6, nil)
	if err != nil {
		t.Fatalf("the frame behind the abandoned tensor: %v", err)
	}
	if !bytes.Equal(got.Payload, nextPayload) {
		t.Fatal("the frame behind differs")
	}
	if !bytes.Equal(snap, dst) {
		t.Fatal("dst was written after Recv returned")
	}
	t.Logf("Recv gave up after %v", took)
}
