package mux

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
)

// Transport is the muxer's configuration and its network.Multiplexer.
type Transport struct {
	// Window is the receive window of a stream in bytes (at least
	// initialWindow): how much a sender may have in flight on one stream.
	// Memory beyond initialWindow is reserved from the peer scope; where
	// the scope refuses, the stream keeps initialWindow.
	Window int
	// MaxFrame is the largest data frame this side sends, in bytes: it
	// bounds how long one stream holds the connection's write lock.
	MaxFrame int
	// AcceptBacklog is how many opened streams may wait for AcceptStream;
	// past it new streams are reset.
	AcceptBacklog int
	// CloseTimeout is how long a closed stream waits for the peer's end
	// of the stream before it is reset and forgotten.
	CloseTimeout time.Duration
	// ControlTimeout is the write deadline of control frames (window
	// updates, resets, FINs) written by the connection itself.
	ControlTimeout time.Duration
	// ReadWait is how long the connection's reader offers a data frame
	// of at least minOffer bytes that no Read waits for to the stream's
	// next Read, which then reads the payload from the socket straight
	// into its buffer, before it buffers the payload itself (0: buffer
	// at once). Frames of other streams wait meanwhile; after an offer
	// runs out, a stream's next skipAfterWait frames are buffered at once.
	ReadWait time.Duration
}

// DefaultTransport returns a Transport with a 16 MiB window, 256 KiB
// frames and a 10 ms ReadWait.
func DefaultTransport() *Transport {
	return &Transport{
		Window:         16 << 20,
		MaxFrame:       256 << 10,
		AcceptBacklog:  256,
		CloseTimeout:   time.Minute,
		ControlTimeout: 30 * time.Second,
		ReadWait:       10 * time.Millisecond,
	}
}

var _ network.Multiplexer = (*Transport)(nil)

// NewConn implements network.Multiplexer: it starts the connection's reader
// and control writer on nc.
func (t *Transport) NewConn(nc net.Conn, isServer bool, scope network.PeerScope) (network.MuxedConn, error) {
	cfg := *t
	cfg.Window = max(cfg.Window, initialWindow)
	if cfg.MaxFrame <= 0 || cfg.MaxFrame > maxFrameLen {
		return nil, fmt.Errorf("mux: MaxFrame %d outside 1..%d", cfg.MaxFrame, maxFrameLen)
	}
	c := &Conn{
		nc:       nc,
		cfg:      cfg,
		scope:    scope,
		wlock:    make(chan struct{}, 1),
		streams:  make(map[uint32]*stream),
		ctrlWake: make(chan struct{}, 1),
		accept:   make(chan *stream, max(cfg.AcceptBacklog, 1)),
		unacked:  make(chan struct{}, max(cfg.AcceptBacklog, 1)),
		closed:   make(chan struct{}),
	}
	c.vw, _ = nc.(VectorWriter)
	if isServer {
		c.nextID = 2
	} else {
		c.nextID = 1
	}
	c.wg.Add(2)
	go c.readLoop()
	go c.ctrlLoop()
	return c, nil
}

// VectorWriter is a connection that writes a header and a payload in one
// write (the node's gathered TLS connection is one). Connections that are
// not get net.Buffers, a writev on a bare TCP connection.
type VectorWriter interface {
	WriteVectored(hdr, payload []byte) (int, error)
}

// Conn is one multiplexed connection. Safe for concurrent use.
type Conn struct {
	nc    net.Conn
	vw    VectorWriter
	cfg   Transport
	scope network.PeerScope

	// wlock is held (a token in it) while a frame is written to nc;
	// hdr, vec and wdl belong to its holder.
	wlock chan struct{}
	hdr   [headerLen]byte
	vec   [2][]byte
	wdl   time.Time // nc's write deadline as last set

	mu       sync.Mutex
	streams  map[uint32]*stream
	nextID   uint32
	ctrl     []header // control frames to write, in order
	err      error    // why the connection closed, once closed
	ctrlWake chan struct{}
	accept   chan *stream
	unacked  chan struct{} // a token per opened stream the peer has not accepted
	closed   chan struct{}
	wg       sync.WaitGroup
	rtimer   *time.Timer // the reader's ReadWait timer
	stats    struct {
		buffered atomic.Int64 // payload bytes that went through a stream's buffer
		expired  atomic.Int64 // offers no Read took within ReadWait
	}
}

var _ network.MuxedConn = (*Conn)(nil)

// Close closes the connection and every stream on it, and waits for the
// connection's goroutines.
func (c *Conn) Close() error {
	return c.CloseWithError(0)
}

// CloseWithError sends a GoAway with code (best effort, without waiting
// for a busy connection), closes the connection and waits for its
// goroutines.
func (c *Conn) CloseWithError(code network.ConnErrorCode) error {
	select {
	case c.wlock <- struct{}{}:
		if !c.IsClosed() {
			header{typ: typeGoAway, length: uint32(code)}.put(c.hdr[:])
			c.nc.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
			c.nc.Write(c.hdr[:])
		}
		<-c.wlock
	default:
	}
	c.fail(ErrConnClosed)
	c.wg.Wait()
	return nil
}

// IsClosed implements network.MuxedConn.
func (c *Conn) IsClosed() bool {
	select {
	case <-c.closed:
		return true
	default:
		return false
	}
}

// As implements network.MuxedConn: it finds *Conn.
func (c *Conn) As(target any) bool {
	if p, ok := target.(**Conn); ok {
		*p = c
		return true
	}
	return false
}

// fail closes the connection for err (the first error wins) and wakes
// every stream.
func (c *Conn) fail(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	close(c.closed)
	streams := c.streams
	c.streams = map[uint32]*stream{}
	c.mu.Unlock()
	c.nc.Close()
	for _, s := range streams {
		s.connClosed()
	}
}

// connErr returns the error streams report after the connection closed.
func (c *Conn) connErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return &connError{cause: c.err}
}

// OpenStream implements network.MuxedConn: it registers a stream and sends
// its SYN before returning, so that data written next follows it.
func (c *Conn) OpenStream(ctx context.Context) (network.MuxedStream, error) {
	select { // at most AcceptBacklog streams not yet accepted
	case c.unacked <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-c.closed:
		return nil, c.connErr()
	}
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		<-c.unacked
		return nil, c.connErr()
	}
	id := c.nextID
	c.nextID += 2
	s := c.newStream(id)
	s.needAck = true
	c.streams[id] = s
	c.mu.Unlock()
	dl, _ := ctx.Deadline()
	err := c.writeFrame(header{typ: typeWindow, flags: flagSYN, id: id, length: uint32(s.window - initialWindow)}, nil, dl, ctx.Done())
	if err != nil {
		c.remove(s)
		return nil, err
	}
	return s, nil
}

// AcceptStream implements network.MuxedConn.
func (c *Conn) AcceptStream() (network.MuxedStream, error) {
	select {
	case s := <-c.accept:
		c.queueCtrl(header{typ: typeWindow, flags: flagACK, id: s.id, length: uint32(s.window - initialWindow)})
		return s, nil
	case <-c.closed:
		return nil, c.connErr()
	}
}

// newStream returns a stream with id and its receive window reserved.
func (c *Conn) newStream(id uint32) *stream {
	s := &stream{c: c, id: id, window: initialWindow, credit: initialWindow,
		rwake: make(chan struct{}, 1), rpost: make(chan struct{}, 1), wwake: make(chan struct{}, 1)}
	if c.scope != nil {
		if span, err := c.scope.BeginSpan(); err == nil {
			s.span = span
			if span.ReserveMemory(c.cfg.Window, network.ReservationPriorityMedium) == nil {
				s.window = c.cfg.Window
			}
		}
	}
	s.recvAvail = s.window
	return s
}

// remove forgets s and releases its memory.
func (c *Conn) remove(s *stream) {
	c.mu.Lock()
	if c.streams[s.id] == s {
		delete(c.streams, s.id)
	}
	c.mu.Unlock()
	s.release()
}

// queueCtrl queues a control frame for the control writer.
func (c *Conn) queueCtrl(h header) {
	c.mu.Lock()
	if c.err == nil {
		c.ctrl = append(c.ctrl, h)
	}
	c.mu.Unlock()
	select {
	case c.ctrlWake <- struct{}{}:
	default:
	}
}

// ctrlLoop writes queued control frames, all that are queued in one write.
func (c *Conn) ctrlLoop() {
	defer c.wg.Done()
	var buf []byte
	for {
		select {
		case <-c.ctrlWake:
		case <-c.closed:
			return
		}
		c.mu.Lock()
		q := c.ctrl
		c.ctrl = nil
		c.mu.Unlock()
		if len(q) == 0 {
			continue
		}
		buf = buf[:0]
		for _, h := range q {
			var b [headerLen]byte
			h.put(b[:])
			buf = append(buf, b[:]...)
		}
		if err := c.lockWrite(time.Time{}, nil); err != nil {
			return
		}
		err := c.writeLocked(buf, nil, time.Now().Add(c.cfg.ControlTimeout))
		<-c.wlock
		if err != nil {
			c.fail(err)
			return
		}
	}
}

// lockWrite takes the write lock by dl (zero: no deadline) unless done
// closes or the connection does.
func (c *Conn) lockWrite(dl time.Time, done <-chan struct{}) error {
	select {
	case c.wlock <- struct{}{}:
		return nil
	default:
	}
	var timeout <-chan time.Time
	if !dl.IsZero() {
		t := time.NewTimer(time.Until(dl))
		defer t.Stop()
		timeout = t.C
	}
	select {
	case c.wlock <- struct{}{}:
		return nil
	case <-timeout:
		return errTimeout
	case <-done:
		return context.Canceled
	case <-c.closed:
		return c.connErr()
	}
}

// writeFrame writes h and payload as one frame by dl.
func (c *Conn) writeFrame(h header, payload []byte, dl time.Time, done <-chan struct{}) error {
	if err := c.lockWrite(dl, done); err != nil {
		return err
	}
	if c.IsClosed() {
		<-c.wlock
		return c.connErr()
	}
	h.put(c.hdr[:])
	err := c.writeLocked(c.hdr[:], payload, dl)
	<-c.wlock
	if err != nil {
		// A frame cut short leaves the stream of frames out of step.
		c.fail(err)
		if errors.Is(err, errTimeout) {
			return errTimeout
		}
		return c.connErr()
	}
	return nil
}

// writeLocked writes hdr and payload to nc by dl; the caller holds wlock.
func (c *Conn) writeLocked(hdr, payload []byte, dl time.Time) error {
	if !dl.Equal(c.wdl) {
		if err := c.nc.SetWriteDeadline(dl); err != nil {
			return err
		}
		c.wdl = dl
	}
	var err error
	switch {
	case len(payload) == 0:
		_, err = c.nc.Write(hdr)
	case c.vw != nil:
		_, err = c.vw.WriteVectored(hdr, payload)
	default:
		c.vec = [2][]byte{hdr, payload}
		bufs := net.Buffers(c.vec[:])
		_, err = bufs.WriteTo(c.nc)
		c.vec = [2][]byte{}
	}
	return err
}

// readBufSize is the reader's buffer: small, so that a payload read with
// it goes mostly straight to its destination.
const readBufSize = 8 << 10

// waitRead waits up to ReadWait for a wake-up on post or the connection's
// end. Called by the connection's reader only.
func (c *Conn) waitRead(post chan struct{}) {
	if c.rtimer == nil {
		c.rtimer = time.NewTimer(c.cfg.ReadWait)
	} else {
		c.rtimer.Reset(c.cfg.ReadWait)
	}
	select {
	case <-post:
	case <-c.rtimer.C:
	case <-c.closed:
	}
	c.rtimer.Stop()
}

// readLoop reads frames until the connection fails.
func (c *Conn) readLoop() {
	defer c.wg.Done()
	r := bufio.NewReaderSize(c.nc, readBufSize)
	var hb [headerLen]byte
	for {
		if _, err := io.ReadFull(r, hb[:]); err != nil {
			c.fail(err)
			return
		}
		h, err := parseHeader(hb[:])
		if err == nil {
			err = c.handle(r, h)
		}
		if err != nil {
			c.fail(err)
			return
		}
	}
}

// handle acts on one frame, reading its payload from r.
func (c *Conn) handle(r *bufio.Reader, h header) error {
	if h.typ == typeGoAway {
		return fmt.Errorf("%w: peer went away (code %d)", ErrConnClosed, h.length)
	}
	s, err := c.lookup(h)
	if err != nil {
		return err
	}
	if s == nil { // an ended stream: drop what is still under way
		if h.typ == typeData {
			_, err = io.CopyN(io.Discard, r, int64(h.length))
		}
		return err
	}
	switch h.typ {
	case typeData:
		if err := s.receive(r, int(h.length)); err != nil {
			return err
		}
	case typeWindow:
		if h.flags&flagACK != 0 {
			s.accepted()
		}
		s.grant(int(h.length))
	case typeReset:
		s.remoteReset(network.StreamErrorCode(h.length))
		return nil
	}
	if h.flags&flagFIN != 0 {
		s.remoteFin()
	}
	return nil
}

// lookup finds h's stream, creating it for a SYN; nil: a stream that
// ended.
func (c *Conn) lookup(h header) (*stream, error) {
	c.mu.Lock()
	s := c.streams[h.id]
	if h.flags&flagSYN == 0 || h.typ == typeReset {
		c.mu.Unlock()
		return s, nil
	}
	if s != nil || h.id%2 == c.nextID%2 {
		c.mu.Unlock()
		return nil, fmt.Errorf("%w: SYN for stream %d", ErrProtocol, h.id)
	}
	if c.err != nil {
		c.mu.Unlock()
		return nil, nil
	}
	s = c.newStream(h.id) // handle adds the SYN's grant
	c.streams[h.id] = s
	c.mu.Unlock()
	select {
	case c.accept <- s:
	default: // backlog full
		c.remove(s)
		c.queueCtrl(header{typ: typeReset, id: h.id, length: uint32(network.StreamResourceLimitExceeded)})
		return nil, nil
	}
	return s, nil
}

// errTimeout is returned by calls that pass their deadline: a net.Error
// with Timeout() true.
var errTimeout = os.ErrDeadlineExceeded
