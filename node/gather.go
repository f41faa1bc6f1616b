package node

import (
	"context"
	"net"
	"sync"

	ci "github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/core/sec"
	tptu "github.com/libp2p/go-libp2p/p2p/net/upgrader"
	libp2ptls "github.com/libp2p/go-libp2p/p2p/security/tls"

	"github.com/starling-ml/starling/node/mux"
)

// gatheredTLS is libp2p's TLS 1.3 transport with each write to a secured
// connection sent to the socket in one write call. crypto/tls writes
// every 16 KiB record on its own, so a 256 KiB yamux frame (maxFrame)
// cost 17 write system calls; gathered, it costs one, at the price of
// copying records that are still in the cache. The handshake, the wire
// format and the peer's view are libp2p's TLS unchanged.
type gatheredTLS struct {
	*libp2ptls.Transport
}

var _ sec.SecureTransport = (*gatheredTLS)(nil)

// newGatheredTLS has the signature libp2p.Security wants.
func newGatheredTLS(id protocol.ID, key ci.PrivKey, muxers []tptu.StreamMuxer) (*gatheredTLS, error) {
	t, err := libp2ptls.New(id, key, muxers)
	if err != nil {
		return nil, err
	}
	return &gatheredTLS{t}, nil
}

// SecureInbound implements sec.SecureTransport.
func (t *gatheredTLS) SecureInbound(ctx context.Context, insecure net.Conn, p peer.ID) (sec.SecureConn, error) {
	return gathered(ctx, insecure, p, t.Transport.SecureInbound)
}

// SecureOutbound implements sec.SecureTransport.
func (t *gatheredTLS) SecureOutbound(ctx context.Context, insecure net.Conn, p peer.ID) (sec.SecureConn, error) {
	return gathered(ctx, insecure, p, t.Transport.SecureOutbound)
}

// gathered secures insecure with secure over a gatherConn.
func gathered(ctx context.Context, insecure net.Conn, p peer.ID, secure func(context.Context, net.Conn, peer.ID) (sec.SecureConn, error)) (sec.SecureConn, error) {
	raw := &gatherConn{Conn: insecure}
	c, err := secure(ctx, raw, p)
	if err != nil {
		return nil, err
	}
	return &gatheredConn{SecureConn: c, raw: raw}, nil
}

// gatheredConn is a secured connection whose Writes reach the socket as
// one write each (see gatherConn).
type gatheredConn struct {
	sec.SecureConn
	raw *gatherConn
}

// Write encrypts b and writes all of its records at once.
func (c *gatheredConn) Write(b []byte) (int, error) { return c.write(b, nil) }

// WriteVectored encrypts hdr and payload and writes all of their records
// at once (mux.VectorWriter: a frame header and its payload cost one
// write system call).
func (c *gatheredConn) WriteVectored(hdr, payload []byte) (int, error) {
	return c.write(hdr, payload)
}

// write encrypts a, then b (if not empty), and writes all of their
// records at once.
func (c *gatheredConn) write(a, b []byte) (int, error) {
	c.raw.gather()
	n, err := c.SecureConn.Write(a)
	if err == nil && len(b) > 0 {
		var k int
		k, err = c.SecureConn.Write(b)
		n += k
	}
	if ferr := c.raw.flush(); err == nil && ferr != nil {
		return 0, ferr
	}
	return n, err
}

var _ mux.VectorWriter = (*gatheredConn)(nil)

// gatherMax bounds the bytes a gathering connection holds: past it, they
// are written out (a Write larger than one yamux frame, which yamux does
// not make).
const gatherMax = 1 << 20

// gatherBufs holds gathering buffers between flushes, so that an idle
// connection holds none.
var gatherBufs = sync.Pool{New: func() any { b := make([]byte, 0, maxFrame+maxFrame/8); return &b }}

// gatherConn is the socket under TLS. Between gather and flush, what TLS
// writes is appended to a buffer instead of written: the records of one
// Write, and any record that TLS writes meanwhile from another goroutine
// (a key update answered by a Read), in order. Outside, writes go straight
// through. A write error is returned by the write that meets it: the
// flush, or the append that found the buffer full.
type gatherConn struct {
	net.Conn
	mu      sync.Mutex
	writers int // Writes between gather and flush
	buf     *[]byte
}

func (g *gatherConn) gather() {
	g.mu.Lock()
	g.writers++
	if g.buf == nil {
		g.buf = gatherBufs.Get().(*[]byte)
	}
	g.mu.Unlock()
}

// flush writes out what was gathered once no Write is gathering.
func (g *gatherConn) flush() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.writers--
	if g.writers > 0 {
		return nil
	}
	err := g.writeOutLocked()
	gatherBufs.Put(g.buf)
	g.buf = nil
	return err
}

func (g *gatherConn) writeOutLocked() error {
	b := *g.buf
	*g.buf = b[:0]
	if len(b) == 0 {
		return nil
	}
	_, err := g.Conn.Write(b)
	return err
}

// Write implements net.Conn for TLS.
func (g *gatherConn) Write(b []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.buf == nil {
		return g.Conn.Write(b)
	}
	if len(*g.buf)+len(b) > gatherMax {
		if err := g.writeOutLocked(); err != nil {
			return 0, err
		}
	}
	*g.buf = append(*g.buf, b...)
	return len(b), nil
}
