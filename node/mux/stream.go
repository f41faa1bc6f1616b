package mux

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
)

// pendState is where a Read waiting for data stands.
type pendState uint8

const (
	pendNone    pendState = iota
	pendWaiting           // Read waits; the reader may fill pend
	pendFilling           // the reader is reading a payload into pend
	pendDone              // the reader put pn bytes into pend
)

// offerState is where a data frame the connection's reader offers to the
// stream's next Read stands.
type offerState uint8

const (
	offerNone  offerState = iota
	offerOpen             // the reader waits for a Read to take the frame
	offerTaken            // a Read is reading the payload from the reader
	offerDone             // it has read offerK bytes
)

// minOffer is the smallest payload offered to a Read: copying a smaller
// one costs less than holding up the connection's other streams.
const minOffer = 64 << 10

// skipAfterWait is how many frames of a stream are buffered without a
// wait after a ReadWait ran out: a reader that is slow does not stall the
// connection on every frame.
const skipAfterWait = 16

// stream is one multiplexed stream (network.MuxedStream). Read and Write
// may be called from two goroutines at once; two concurrent Reads or two
// concurrent Writes are not supported (as for any net.Conn-like stream,
// their bytes would interleave).
type stream struct {
	c      *Conn
	id     uint32
	window int // receive window in bytes
	span   network.ResourceScopeSpan
	rwake  chan struct{} // Read's wake-up (data, state, deadline)
	rpost  chan struct{} // the reader's wake-up: its offer was taken, or reading ended
	wwake  chan struct{} // Write's wake-up (credit, state, deadline)
	once   sync.Once     // release

	mu sync.Mutex
	// Receive side.
	recvAvail int     // bytes the peer may still send
	unacked   int     // bytes consumed and not yet granted back
	queue     []chunk // payload that arrived with no Read waiting
	pend      []byte  // the waiting Read's buffer
	pstate    pendState
	pn        int
	connDL    bool          // nc's read deadline is set for this stream's fill
	offer     *bufio.Reader // the conn's reader lends it to a Read (ostate)
	ostate    offerState
	offerN    int   // payload bytes of the offered frame
	offerK    int   // bytes the Read took from it
	offerErr  error // the Read's error reading them
	skipWait  int   // frames to buffer without waiting, after a ReadWait ran out
	readDL    time.Time
	remoteEnd bool // the peer's FIN arrived
	readShut  bool // CloseRead or Close
	// Send side.
	credit   int // bytes this side may still send
	writeDL  time.Time
	localFin bool // CloseWrite or Close
	// Both.
	resetErr   error // set once reset, from either side
	userClosed bool
	needAck    bool // opened here and not yet accepted: holds a c.unacked token
	closeTimer *time.Timer
}

var _ network.MuxedStream = (*stream)(nil)

// chunk is buffered payload: b is the unread part of *buf.
type chunk struct {
	buf *[]byte
	b   []byte
}

// chunkSize is the size of pooled receive chunks; larger frames get their
// own allocation.
const chunkSize = 256 << 10

var chunkPool = sync.Pool{New: func() any { b := make([]byte, chunkSize); return &b }}

func getChunk(n int) chunk {
	if n > chunkSize {
		b := make([]byte, n)
		return chunk{b: b}
	}
	p := chunkPool.Get().(*[]byte)
	return chunk{buf: p, b: (*p)[:n]}
}

func (ch chunk) put() {
	if ch.buf != nil {
		chunkPool.Put(ch.buf)
	}
}

func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// waitFor waits for a wake-up on ch, dl (zero: none) or the connection's
// end.
func (s *stream) waitFor(ch chan struct{}, dl time.Time) {
	if dl.IsZero() {
		select {
		case <-ch:
		case <-s.c.closed:
		}
		return
	}
	t := time.NewTimer(time.Until(dl))
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
	case <-s.c.closed:
	}
}

// Read implements io.Reader. With no data buffered it waits, offering p to
// the connection's reader, which reads the next payload straight into it.
func (s *stream) Read(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		switch {
		case s.resetErr != nil:
			return 0, s.resetErr
		case s.readShut:
			return 0, ErrReadClosed
		case len(s.queue) > 0:
			n := s.copyOutLocked(p)
			s.ackLocked(n)
			return n, nil
		case s.remoteEnd:
			return 0, io.EOF
		case s.c.IsClosed():
			return 0, s.c.connErr()
		case len(p) == 0:
			return 0, nil
		}
		dl := s.readDL
		if !dl.IsZero() && !time.Now().Before(dl) {
			return 0, errTimeout
		}
		if s.ostate == offerOpen {
			if n := s.takeOfferLocked(p); n > 0 {
				s.ackLocked(n)
				return n, nil
			}
			continue
		}
		s.pend, s.pstate = p, pendWaiting
		s.mu.Unlock()
		s.waitFor(s.rwake, dl)
		s.mu.Lock()
		for s.pstate == pendFilling { // the fill ends by its deadline or the conn's end
			s.mu.Unlock()
			<-s.rwake
			s.mu.Lock()
		}
		n := 0
		if s.pstate == pendDone {
			n = s.pn
		}
		s.pend, s.pstate, s.pn = nil, pendNone, 0
		if n > 0 {
			s.ackLocked(n)
			return n, nil
		}
	}
}

// takeOfferLocked reads the offered frame's payload into p itself, under
// the stream's read deadline, and hands the connection back to its reader.
func (s *stream) takeOfferLocked(p []byte) int {
	s.ostate = offerTaken
	k, err := s.fillLocked(s.offer, p[:min(len(p), s.offerN)])
	s.offerK, s.offerErr, s.ostate = k, err, offerDone
	notify(s.rpost)
	return k
}

// fillLocked reads len(p) payload bytes from r into p, with s.mu released,
// under the stream's read deadline (set on the connection meanwhile, and
// moved by SetReadDeadline and interruptFillLocked).
func (s *stream) fillLocked(r *bufio.Reader, p []byte) (int, error) {
	if !s.readDL.IsZero() {
		s.c.nc.SetReadDeadline(s.readDL)
		s.connDL = true
	}
	s.mu.Unlock()
	k, err := io.ReadFull(r, p)
	s.mu.Lock()
	if s.connDL {
		s.c.nc.SetReadDeadline(time.Time{})
		s.connDL = false
	}
	return k, err
}

// copyOutLocked copies buffered payload into p.
func (s *stream) copyOutLocked(p []byte) int {
	n := 0
	for n < len(p) && len(s.queue) > 0 {
		ch := &s.queue[0]
		k := copy(p[n:], ch.b)
		n += k
		ch.b = ch.b[k:]
		if len(ch.b) == 0 {
			ch.put()
			s.queue[0] = chunk{}
			s.queue = s.queue[1:]
		}
	}
	if len(s.queue) == 0 {
		s.queue = nil
	}
	return n
}

// dropQueueLocked discards buffered payload and returns its length.
func (s *stream) dropQueueLocked() int {
	n := 0
	for _, ch := range s.queue {
		n += len(ch.b)
		ch.put()
	}
	s.queue = nil
	return n
}

// ackLocked counts n consumed bytes and grants them back to the peer in
// batches of half the window.
func (s *stream) ackLocked(n int) {
	s.unacked += n
	if s.unacked < s.window/2 || s.remoteEnd || s.resetErr != nil {
		return
	}
	g := s.unacked
	s.unacked = 0
	s.recvAvail += g
	s.c.queueCtrl(header{typ: typeWindow, id: s.id, length: uint32(g)})
}

// receive takes a data frame's n payload bytes from r: into a waiting
// Read's buffer while one waits and nothing is buffered, else into the
// queue. Called by the connection's reader only.
func (s *stream) receive(r *bufio.Reader, n int) error {
	s.mu.Lock()
	if n > s.recvAvail {
		s.mu.Unlock()
		return fmt.Errorf("%w: stream %d sent %d bytes over its credit of %d", ErrProtocol, s.id, n, s.recvAvail)
	}
	s.recvAvail -= n
	waited := false
	for n > 0 {
		if s.readShut || s.resetErr != nil {
			s.mu.Unlock()
			_, err := io.CopyN(io.Discard, r, int64(n))
			s.mu.Lock()
			if s.resetErr == nil { // closed for reading: keep the sender going
				s.ackLocked(n)
			}
			s.mu.Unlock()
			return err
		}
		if s.pstate == pendWaiting && len(s.queue) == 0 {
			p := s.pend[:min(n, len(s.pend))]
			s.pstate = pendFilling
			k, err := s.fillLocked(r, p)
			s.pn, s.pstate, s.pend = k, pendDone, nil
			notify(s.rwake)
			n -= k
			if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
				s.mu.Unlock()
				return err
			}
			continue
		}
		if !waited && s.c.cfg.ReadWait > 0 && n >= minOffer {
			if s.skipWait > 0 {
				s.skipWait--
				waited = true
			} else {
				// Offer the rest of the frame to the stream's next Read,
				// which reads it straight into its buffer.
				k, err := s.offerLocked(r, n)
				waited = k == 0
				n -= k
				if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
					s.mu.Unlock()
					return err
				}
				continue
			}
		}
		s.mu.Unlock()
		ch := getChunk(n)
		s.c.stats.buffered.Add(int64(n))
		if _, err := io.ReadFull(r, ch.b); err != nil {
			ch.put()
			return err
		}
		s.mu.Lock()
		if s.readShut || s.resetErr != nil {
			ch.put()
			if s.resetErr == nil {
				s.ackLocked(n)
			}
		} else {
			s.queue = append(s.queue, ch)
			notify(s.rwake)
		}
		n = 0
	}
	s.mu.Unlock()
	return nil
}

// offerLocked offers the frame's n payload bytes in r to the stream's next
// Read for up to ReadWait and returns how many bytes a Read took, and its
// error. Called by the connection's reader, which waits meanwhile.
func (s *stream) offerLocked(r *bufio.Reader, n int) (int, error) {
	s.offer, s.offerN, s.ostate = r, n, offerOpen
	select {
	case <-s.rpost:
	default:
	}
	s.mu.Unlock()
	s.c.waitRead(s.rpost)
	s.mu.Lock()
	for s.ostate == offerTaken { // the read ends by its deadline or the conn's end
		s.mu.Unlock()
		<-s.rpost
		s.mu.Lock()
	}
	k, err := 0, error(nil)
	switch s.ostate {
	case offerOpen:
		if !s.readShut && s.resetErr == nil {
			s.skipWait = skipAfterWait
			s.c.stats.expired.Add(1)
		}
	case offerDone:
		k, err = s.offerK, s.offerErr
	}
	s.offer, s.offerN, s.offerK, s.offerErr, s.ostate = nil, 0, 0, nil, offerNone
	return k, err
}

// interruptFillLocked cuts a fill in progress short (CloseRead, Reset).
func (s *stream) interruptFillLocked() {
	notify(s.rpost)
	if s.pstate == pendFilling || s.ostate == offerTaken {
		s.c.nc.SetReadDeadline(time.Unix(1, 0))
		s.connDL = true
	}
}

// Write implements io.Writer: p goes out in frames of up to MaxFrame and
// the stream's credit, each written from p itself.
func (s *stream) Write(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		s.mu.Lock()
		for {
			if err := s.writeErrLocked(); err != nil {
				s.mu.Unlock()
				return n, err
			}
			if s.credit > 0 {
				break
			}
			dl := s.writeDL
			if !dl.IsZero() && !time.Now().Before(dl) {
				s.mu.Unlock()
				return n, errTimeout
			}
			s.mu.Unlock()
			s.waitFor(s.wwake, dl)
			s.mu.Lock()
		}
		k := min(len(p)-n, s.credit, s.c.cfg.MaxFrame)
		s.credit -= k
		dl := s.writeDL
		s.mu.Unlock()
		if err := s.c.writeFrame(header{typ: typeData, id: s.id, length: uint32(k)}, p[n:n+k], dl, nil); err != nil {
			s.mu.Lock()
			s.credit += k
			s.mu.Unlock()
			return n, err
		}
		n += k
	}
	return n, nil
}

func (s *stream) writeErrLocked() error {
	switch {
	case s.resetErr != nil:
		return s.resetErr
	case s.localFin:
		return ErrWriteClosed
	case s.c.IsClosed():
		return s.c.connErr()
	}
	return nil
}

// grant adds n bytes of send credit (a window update from the peer).
func (s *stream) grant(n int) {
	s.mu.Lock()
	s.credit += n
	s.mu.Unlock()
	notify(s.wwake)
}

// CloseWrite implements network.MuxedStream: it queues a FIN behind the
// frames already written.
func (s *stream) CloseWrite() error {
	s.mu.Lock()
	if s.localFin || s.resetErr != nil {
		s.mu.Unlock()
		return nil
	}
	s.localFin = true
	s.mu.Unlock()
	notify(s.wwake)
	s.c.queueCtrl(header{typ: typeData, flags: flagFIN, id: s.id})
	s.maybeRemove()
	return nil
}

// CloseRead implements network.MuxedStream: buffered and later payload is
// discarded (and its credit returned, so that the peer is not stalled).
func (s *stream) CloseRead() error {
	s.mu.Lock()
	if !s.readShut {
		s.readShut = true
		s.interruptFillLocked()
		if s.resetErr == nil {
			s.ackLocked(s.dropQueueLocked())
		}
	}
	s.mu.Unlock()
	notify(s.rwake)
	return nil
}

// Close implements network.MuxedStream: CloseRead and CloseWrite; the
// stream is forgotten once the peer ends its half too, or reset after
// CloseTimeout.
func (s *stream) Close() error {
	s.CloseRead()
	s.CloseWrite()
	s.mu.Lock()
	s.userClosed = true
	if !s.remoteEnd && s.resetErr == nil && s.closeTimer == nil {
		s.closeTimer = time.AfterFunc(s.c.cfg.CloseTimeout, func() { s.ResetWithError(network.StreamGarbageCollected) })
	}
	s.mu.Unlock()
	s.maybeRemove()
	return nil
}

// Reset implements network.MuxedStream.
func (s *stream) Reset() error { return s.ResetWithError(0) }

// ResetWithError implements network.MuxedStream: both halves end now and
// the peer is sent code.
func (s *stream) ResetWithError(code network.StreamErrorCode) error {
	s.mu.Lock()
	if s.resetErr != nil {
		s.mu.Unlock()
		return nil
	}
	s.resetErr = &network.StreamError{ErrorCode: code}
	s.interruptFillLocked()
	s.dropQueueLocked()
	s.mu.Unlock()
	notify(s.rwake)
	notify(s.wwake)
	s.c.queueCtrl(header{typ: typeReset, id: s.id, length: uint32(code)})
	s.c.remove(s)
	return nil
}

// remoteReset ends the stream for the peer's reset.
func (s *stream) remoteReset(code network.StreamErrorCode) {
	s.mu.Lock()
	if s.resetErr == nil {
		s.resetErr = &network.StreamError{ErrorCode: code, Remote: true}
		s.dropQueueLocked()
	}
	s.mu.Unlock()
	notify(s.rwake)
	notify(s.wwake)
	s.c.remove(s)
}

// remoteFin ends the peer's half.
func (s *stream) remoteFin() {
	s.mu.Lock()
	s.remoteEnd = true
	s.mu.Unlock()
	notify(s.rwake)
	s.maybeRemove()
}

// maybeRemove forgets the stream once both halves ended and its user
// closed it.
func (s *stream) maybeRemove() {
	s.mu.Lock()
	done := s.userClosed && s.localFin && s.remoteEnd
	s.mu.Unlock()
	if done {
		s.c.remove(s)
	}
}

// accepted gives back the token OpenStream took, once.
func (s *stream) accepted() {
	s.mu.Lock()
	give := s.needAck
	s.needAck = false
	s.mu.Unlock()
	if give {
		<-s.c.unacked
	}
}

// connClosed wakes the stream's waiters after the connection closed.
func (s *stream) connClosed() {
	notify(s.rwake)
	notify(s.wwake)
	s.release()
}

// release gives back the stream's memory and stops its close timer.
func (s *stream) release() {
	s.accepted()
	s.once.Do(func() {
		s.mu.Lock()
		if s.closeTimer != nil {
			s.closeTimer.Stop()
		}
		s.mu.Unlock()
		if s.span != nil {
			s.span.Done()
		}
	})
}

// SetDeadline implements network.MuxedStream.
func (s *stream) SetDeadline(t time.Time) error {
	s.SetReadDeadline(t)
	return s.SetWriteDeadline(t)
}

// SetReadDeadline implements network.MuxedStream; it applies to a Read in
// progress too, a payload being read into it included.
func (s *stream) SetReadDeadline(t time.Time) error {
	s.mu.Lock()
	s.readDL = t
	if s.pstate == pendFilling || s.ostate == offerTaken {
		s.c.nc.SetReadDeadline(t)
		s.connDL = !t.IsZero()
	}
	waiting := s.pstate == pendWaiting
	s.mu.Unlock()
	if waiting {
		notify(s.rwake)
	}
	return nil
}

// SetWriteDeadline implements network.MuxedStream.
func (s *stream) SetWriteDeadline(t time.Time) error {
	s.mu.Lock()
	s.writeDL = t
	s.mu.Unlock()
	notify(s.wwake)
	return nil
}
