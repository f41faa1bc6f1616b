package mux

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
)

// rawPeer is the far end of a muxed connection spoken by hand: it writes
// crafted frames and collects the frames it receives.
type rawPeer struct {
	t      *testing.T
	nc     net.Conn
	frames chan header
}

// newRawPair returns a muxed connection (the dialer's side) and a raw peer
// on a loopback TCP connection.
func newRawPair(t *testing.T, config ...func(*Transport)) (*Conn, *rawPeer) {
	t.Helper()
	a, b := tcpPair(t)
	tr := DefaultTransport()
	tr.Window = 1 << 20
	for _, f := range config {
		f(tr)
	}
	mc, err := tr.NewConn(a, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mc.Close() })
	p := &rawPeer{t: t, nc: b, frames: make(chan header, 1024)}
	go func() {
		var hb [headerLen]byte
		for {
			if _, err := io.ReadFull(b, hb[:]); err != nil {
				close(p.frames)
				return
			}
			h, _ := parseHeader(hb[:])
			if h.typ == typeData && h.length > 0 {
				io.CopyN(io.Discard, b, int64(h.length))
			}
			p.frames <- h
		}
	}()
	return mc.(*Conn), p
}

func tcpPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			t.Error(err)
		}
		acc <- c
	}()
	a, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b := <-acc
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// send writes one frame with payload.
func (p *rawPeer) send(h header, payload []byte) {
	p.t.Helper()
	var hb [headerLen]byte
	h.put(hb[:])
	if _, err := p.nc.Write(append(hb[:], payload...)); err != nil {
		p.t.Fatal(err)
	}
}

// open opens stream id from the raw side and accepts it on c.
func (p *rawPeer) open(c *Conn, id uint32) network.MuxedStream {
	p.t.Helper()
	p.send(header{typ: typeWindow, flags: flagSYN, id: id}, nil)
	s, err := c.AcceptStream()
	if err != nil {
		p.t.Fatal(err)
	}
	return s
}

// waitOffer waits until the connection's reader offers a frame of s to
// its next Read.
func waitOffer(t *testing.T, s network.MuxedStream) {
	t.Helper()
	st := s.(*stream)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		st.mu.Lock()
		open := st.ostate == offerOpen
		st.mu.Unlock()
		if open {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the frame was never offered to a Read")
		}
	}
}

// TestReadDeadlineMidFrame: a frame whose payload stalls half-way while
// a Read reads it, the Read posted before the frame arrived (the reader
// fills it) or after (it takes the reader's offer). The Read ends by its
// deadline with what arrived, and the rest of the frame, sent later,
// still reaches the stream in order.
func TestReadDeadlineMidFrame(t *testing.T) {
	for _, offered := range []bool{false, true} {
		t.Run(fmt.Sprintf("offered=%v", offered), func(t *testing.T) {
			testReadDeadlineMidFrame(t, offered)
		})
	}
}

func testReadDeadlineMidFrame(t *testing.T, offered bool) {
	c, p := newRawPair(t, func(tr *Transport) { tr.ReadWait = time.Minute })
	s := p.open(c, 2)
	payload := bytes.Repeat([]byte("0123456789abcdef"), 1<<12) // 64 KiB
	got := make([]byte, 0, len(payload))
	readErr := make(chan error, 1)
	buf := make([]byte, len(payload))
	read := func() {
		s.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		go func() {
			n, err := s.Read(buf)
			got = append(got, buf[:n]...)
			readErr <- err
		}()
	}
	if !offered {
		read()
	}
	// The header and the first half; the rest is held back.
	var hb [headerLen]byte
	header{typ: typeData, id: 2, length: uint32(len(payload))}.put(hb[:])
	half := len(payload) / 2
	if _, err := p.nc.Write(append(hb[:], payload[:half]...)); err != nil {
		t.Fatal(err)
	}
	if offered {
		waitOffer(t, s)
		read()
	}
	select {
	case err := <-readErr:
		if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("Read: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Read did not end by its deadline while its payload stalled")
	}
	if _, err := p.nc.Write(payload[half:]); err != nil {
		t.Fatal(err)
	}
	s.SetReadDeadline(time.Now().Add(5 * time.Second))
	for len(got) < len(payload) {
		n, err := s.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			t.Fatalf("Read after the stall: %v (%d of %d bytes)", err, len(got), len(payload))
		}
	}
	if !bytes.Equal(got, payload) {
		t.Fatal("payload out of step after a Read timed out mid-frame")
	}
}

// expectHello reads "hello" from s within 5 seconds; what names the frame.
func expectHello(t *testing.T, s network.MuxedStream, what string) {
	t.Helper()
	s.SetReadDeadline(time.Now().Add(5 * time.Second))
	hello := make([]byte, 5)
	if _, err := io.ReadFull(s, hello); err != nil || string(hello) != "hello" {
		t.Fatalf("%s: %q, %v", what, hello, err)
	}
}

// TestOfferedFrame: a frame that arrives before its Read goes from the
// socket straight into that Read's buffer, and the frame of another
// stream behind it arrives after; at most that small one is buffered (it
// is not offered).
func TestOfferedFrame(t *testing.T) {
	c, p := newRawPair(t, func(tr *Transport) { tr.ReadWait = time.Minute })
	s2, s4 := p.open(c, 2), p.open(c, 4)
	payload := bytes.Repeat([]byte("0123456789abcdef"), minOffer/16)
	p.send(header{typ: typeData, id: 2, length: uint32(len(payload))}, payload)
	p.send(header{typ: typeData, id: 4, length: 5}, []byte("hello"))
	waitOffer(t, s2)
	s2.SetReadDeadline(time.Now().Add(5 * time.Second))
	got := make([]byte, len(payload))
	if _, err := io.ReadFull(s2, got); err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("offered frame: %v (equal %v)", err, bytes.Equal(got, payload))
	}
	expectHello(t, s4, "the frame behind it")
	if n := c.stats.buffered.Load(); n > 5 {
		t.Errorf("%d bytes buffered, want at most the small frame's 5", n)
	}
}

// TestOfferExpires: frames of a stream that nobody reads are buffered
// after one ReadWait, not one per frame, and do not hold up another
// stream's frame for longer.
func TestOfferExpires(t *testing.T) {
	c, p := newRawPair(t, func(tr *Transport) { tr.ReadWait = 20 * time.Millisecond })
	s2, s4 := p.open(c, 2), p.open(c, 4)
	var sent []byte
	for i := range 3 {
		payload := bytes.Repeat([]byte{byte('a' + i)}, minOffer)
		p.send(header{typ: typeData, id: 2, length: uint32(len(payload))}, payload)
		sent = append(sent, payload...)
	}
	p.send(header{typ: typeData, id: 4, length: 5}, []byte("hello"))
	expectHello(t, s4, "the frame behind the unread ones")
	if n := c.stats.expired.Load(); n != 1 {
		t.Errorf("%d offers ran out, want 1 (the next frames skip the wait)", n)
	}
	if n := c.stats.buffered.Load(); n != int64(len(sent)) {
		t.Errorf("%d bytes buffered, want %d", n, len(sent))
	}
	s2.SetReadDeadline(time.Now().Add(5 * time.Second))
	got := make([]byte, len(sent))
	if _, err := io.ReadFull(s2, got); err != nil || !bytes.Equal(got, sent) {
		t.Fatalf("buffered frames: %v (equal %v)", err, bytes.Equal(got, sent))
	}
}

// TestCloseReadEndsOffer: CloseRead on a stream whose frame is offered
// lets the connection's reader go on at once (the frame is dropped).
func TestCloseReadEndsOffer(t *testing.T) {
	c, p := newRawPair(t, func(tr *Transport) { tr.ReadWait = time.Minute })
	s2, s4 := p.open(c, 2), p.open(c, 4)
	p.send(header{typ: typeData, id: 2, length: minOffer}, make([]byte, minOffer))
	p.send(header{typ: typeData, id: 4, length: 5}, []byte("hello"))
	waitOffer(t, s2)
	s2.CloseRead()
	expectHello(t, s4, "the frame behind the closed stream's")
	if n := c.stats.expired.Load(); n != 0 {
		t.Errorf("%d offers ran out, want 0", n)
	}
}

// TestCreditViolationClosesConn: a peer sending past the window breaks the
// protocol and loses the connection.
func TestCreditViolationClosesConn(t *testing.T) {
	c, p := newRawPair(t)
	s := p.open(c, 2)
	// The stream's window is initialWindow + what the accept granted.
	var hb [headerLen]byte
	header{typ: typeData, id: 2, length: uint32(c.cfg.Window + 1)}.put(hb[:])
	go p.nc.Write(append(hb[:], make([]byte, c.cfg.Window+1)...)) // cut off when c closes
	s.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := io.Copy(io.Discard, s)
	if !errors.Is(err, ErrConnClosed) || !errors.Is(err, network.ErrReset) {
		t.Fatalf("read from a stream over its credit: %v, want ErrConnClosed and ErrReset", err)
	}
	if !c.IsClosed() {
		t.Fatal("connection still open after a credit violation")
	}
}

// TestWriteStopsAtCredit: with no window update from the peer, Write sends
// initialWindow bytes and then ends at its deadline.
func TestWriteStopsAtCredit(t *testing.T) {
	c, p := newRawPair(t)
	s, err := c.OpenStream(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	s.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
	n, err := s.Write(make([]byte, 2*initialWindow))
	if n != initialWindow || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Write with no credit granted: %d bytes, %v; want %d bytes, deadline", n, err, initialWindow)
	}
	// The peer grants more: the rest goes out.
	p.send(header{typ: typeWindow, flags: flagACK, id: 1, length: initialWindow}, nil)
	s.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if n, err := s.Write(make([]byte, initialWindow)); n != initialWindow || err != nil {
		t.Fatalf("Write after a grant: %d, %v", n, err)
	}
	sent := 0
	for sent < 2*initialWindow {
		select {
		case h := <-p.frames:
			if h.typ == typeData {
				sent += int(h.length)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("peer got %d of %d bytes", sent, 2*initialWindow)
		}
	}
}

// TestResetEndsPendingRead: Reset from another goroutine ends a waiting
// Read with ErrReset and tells the peer.
func TestResetEndsPendingRead(t *testing.T) {
	c, p := newRawPair(t)
	s, err := c.OpenStream(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	readErr := make(chan error, 1)
	go func() {
		_, err := s.Read(make([]byte, 1024))
		readErr <- err
	}()
	time.AfterFunc(20*time.Millisecond, func() { s.ResetWithError(42) })
	select {
	case err := <-readErr:
		var se *network.StreamError
		if !errors.As(err, &se) || se.ErrorCode != 42 || se.Remote || !errors.Is(err, network.ErrReset) {
			t.Fatalf("Read after Reset: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Reset did not end the pending Read")
	}
	for h := range p.frames {
		if h.typ == typeReset && h.id == 1 && h.length == 42 {
			return
		}
	}
	t.Fatal("peer never got the reset")
}

// TestRandomSizes moves a random byte stream with writes and reads of
// random sizes both ways on several streams, against the bytes sent.
func TestRandomSizes(t *testing.T) {
	a, b := tcpPair(t)
	tr := DefaultTransport()
	tr.Window = 1 << 20
	tr.MaxFrame = 64 << 10
	ca, _ := tr.NewConn(a, false, nil)
	cb, _ := tr.NewConn(b, true, nil)
	defer ca.Close()
	defer cb.Close()
	const streams, total = 3, 512 << 10
	errs := make(chan error, 2*streams)
	for i := range streams {
		go func() {
			s, err := ca.OpenStream(context.Background())
			if err != nil {
				errs <- err
				return
			}
			s.SetDeadline(time.Now().Add(30 * time.Second))
			r := rand.New(rand.NewPCG(uint64(i), 1))
			data := make([]byte, total)
			for k := 0; k < total; k += 8 {
				binary.LittleEndian.PutUint64(data[k:], r.Uint64())
			}
			for off := 0; off < total; {
				n := min(total-off, 1+r.IntN(300<<10))
				if _, err := s.Write(data[off : off+n]); err != nil {
					errs <- err
					return
				}
				off += n
			}
			s.CloseWrite()
			back, err := io.ReadAll(s)
			if err == nil && !bytes.Equal(back, data) {
				err = errors.New("echo differs from what was sent")
			}
			s.Close()
			errs <- err
		}()
		go func() {
			s, err := cb.AcceptStream()
			if err != nil {
				errs <- err
				return
			}
			s.SetDeadline(time.Now().Add(30 * time.Second))
			r := rand.New(rand.NewPCG(uint64(i), 2))
			var got []byte
			buf := make([]byte, 512<<10)
			for {
				n, err := s.Read(buf[:1+r.IntN(len(buf))])
				got = append(got, buf[:n]...)
				if err == io.EOF {
					break
				}
				if err != nil {
					errs <- err
					return
				}
			}
			_, err = s.Write(got)
			s.Close()
			errs <- err
		}()
	}
	for range 2 * streams {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}
