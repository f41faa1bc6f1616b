package node

import (
	"bytes"
	"errors"
	"net"
	"sync"
	"testing"

	"github.com/libp2p/go-libp2p/core/sec"
)

// writeLog is a net.Conn that records its writes.
type writeLog struct {
	net.Conn
	mu     sync.Mutex
	writes [][]byte
	err    error
}

func (w *writeLog) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return 0, w.err
	}
	w.writes = append(w.writes, bytes.Clone(b))
	return len(b), nil
}

func (w *writeLog) sizes() []int {
	w.mu.Lock()
	defer w.mu.Unlock()
	var s []int
	for _, b := range w.writes {
		s = append(s, len(b))
	}
	return s
}

// gathering returns a gatherConn over a writeLog, gathering.
func gathering() (*writeLog, *gatherConn) {
	w := &writeLog{}
	g := &gatherConn{Conn: w}
	g.gather()
	return w, g
}

// TestGatherConn: what TLS writes between gather and flush reaches the
// socket as one write, in order, including a record written meanwhile by
// another goroutine; outside, writes go straight through; a flush error
// is the Write's.
func TestGatherConn(t *testing.T) {
	rec := func(n int, b byte) []byte { return bytes.Repeat([]byte{b}, n) }
	t.Run("straight", func(t *testing.T) {
		w := &writeLog{}
		g := &gatherConn{Conn: w}
		g.Write(rec(5, 1))
		g.Write(rec(7, 2))
		if got := w.sizes(); len(got) != 2 || got[0] != 5 || got[1] != 7 {
			t.Fatalf("writes %v, want [5 7]", got)
		}
	})
	t.Run("gathered", func(t *testing.T) {
		w, g := gathering()
		g.Write(rec(100, 1))
		g.Write(rec(200, 2))
		var wg sync.WaitGroup
		wg.Go(func() { g.Write(rec(3, 9)) }) // a key update from the reader
		wg.Wait()
		if got := w.sizes(); len(got) != 0 {
			t.Fatalf("wrote %v before the flush", got)
		}
		if err := g.flush(); err != nil {
			t.Fatal(err)
		}
		want := append(append(rec(100, 1), rec(200, 2)...), rec(3, 9)...)
		if len(w.writes) != 1 || !bytes.Equal(w.writes[0], want) {
			t.Fatalf("writes %v, want one of %d bytes in order", w.sizes(), len(want))
		}
		if g.buf != nil {
			t.Fatal("an idle connection kept its buffer")
		}
		g.Write(rec(4, 3))
		if got := w.sizes(); len(got) != 2 || got[1] != 4 {
			t.Fatalf("after the flush, writes %v, want [303 4]", got)
		}
	})
	t.Run("overlapping", func(t *testing.T) {
		w, g := gathering()
		g.gather()
		g.Write(rec(10, 1))
		g.flush() // the other Write still gathers
		if got := w.sizes(); len(got) != 0 {
			t.Fatalf("wrote %v while a Write gathers", got)
		}
		g.Write(rec(20, 2))
		g.flush()
		if got := w.sizes(); len(got) != 1 || got[0] != 30 {
			t.Fatalf("writes %v, want [30]", got)
		}
	})
	t.Run("full", func(t *testing.T) {
		w, g := gathering()
		for range 3 {
			g.Write(rec(gatherMax/2, 1))
		}
		g.flush()
		if got := w.sizes(); len(got) != 2 || got[0] != gatherMax || got[1] != gatherMax/2 {
			t.Fatalf("writes %v, want [%d %d]", got, gatherMax, gatherMax/2)
		}
	})
	t.Run("error", func(t *testing.T) {
		broken := errors.New("broken pipe")
		w := &writeLog{err: broken}
		raw := &gatherConn{Conn: w}
		c := &gatheredConn{SecureConn: secureStub{w: raw}, raw: raw}
		if n, err := c.Write(rec(10, 1)); n != 0 || !errors.Is(err, broken) {
			t.Fatalf("Write = %d, %v; want 0 and the socket's error", n, err)
		}
	})
}

// secureStub stands in for a TLS connection: it writes b as two records.
type secureStub struct {
	sec.SecureConn
	w *gatherConn
}

func (s secureStub) Write(b []byte) (int, error) {
	h := len(b) / 2
	s.w.Write(b[:h])
	s.w.Write(b[h:])
	return len(b), nil
}
