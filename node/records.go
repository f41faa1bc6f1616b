package node

import (
	"context"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	ci "github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/core/sec"
	tptu "github.com/libp2p/go-libp2p/p2p/net/upgrader"
	libp2ptls "github.com/libp2p/go-libp2p/p2p/security/tls"

	"golang.org/x/crypto/chacha20poly1305"

	"github.com/starling-ml/starling/internal/aesgcm"
	"github.com/starling-ml/starling/node/mux"
)

// recordsID is Starling's security protocol between Starling peers:
// libp2p's TLS 1.3 handshake (identities, certificates and ALPN muxer
// negotiation unchanged), then records of up to maxRecord bytes sealed
// with AES-128-GCM (ChaCha20-Poly1305 where TLS chose it) under keys
// exported from that handshake (RFC 8446
// §7.5), the pattern of DTLS-SRTP (RFC 5764). Peers that do not offer it
// get libp2p's /tls/1.0.0 or Noise. Reasoning and measurements:
// docs/design.md, "Starling's record layer".
const recordsID protocol.ID = "/starling/tls-records/1.0.0"

const (
	maxRecord     = 256 << 10 // largest plaintext of one record
	recordHdr     = 4         // big-endian plaintext length, the record's additional data
	recordTag     = 16        // GCM tag
	recordMaxWire = recordHdr + maxRecord + recordTag
	// recordAhead is how far past the record it needs a read may fill
	// the receive buffer: enough for the next frame's header record and
	// the next record's length, little enough that moving the unread rest
	// to the buffer's start costs nothing next to a record.
	recordAhead = 4 << 10
)

// rekeyEvery is how many records one key seals before both sides move to
// the next key of the direction's ratchet (at most 1 GiB per key, far
// inside AES-GCM's limits). A variable for tests.
var rekeyEvery uint64 = 1 << 12

// Errors of the record layer. After any of them the connection's reads
// fail for good.
var (
	errRecordAuth   = errors.New("starling records: record failed authentication")
	errRecordLength = errors.New("starling records: record length out of range")
	errRecordAlert  = errors.New("starling records: peer sent a TLS alert (it rejected the handshake)")
)

// recordsTLS is the sec.SecureTransport of recordsID.
type recordsTLS struct {
	id protocol.ID
	t  *libp2ptls.Transport
}

var _ sec.SecureTransport = (*recordsTLS)(nil)

// newRecordsTLS has the signature libp2p.Security wants.
func newRecordsTLS(id protocol.ID, key ci.PrivKey, muxers []tptu.StreamMuxer) (*recordsTLS, error) {
	t, err := libp2ptls.New(id, key, muxers)
	if err != nil {
		return nil, err
	}
	return &recordsTLS{id: id, t: t}, nil
}

// ID implements sec.SecureTransport.
func (t *recordsTLS) ID() protocol.ID { return t.id }

// SecureInbound implements sec.SecureTransport.
func (t *recordsTLS) SecureInbound(ctx context.Context, insecure net.Conn, p peer.ID) (sec.SecureConn, error) {
	return t.secure(ctx, insecure, p, false)
}

// SecureOutbound implements sec.SecureTransport.
func (t *recordsTLS) SecureOutbound(ctx context.Context, insecure net.Conn, p peer.ID) (sec.SecureConn, error) {
	return t.secure(ctx, insecure, p, true)
}

func (t *recordsTLS) secure(ctx context.Context, insecure net.Conn, p peer.ID, client bool) (sec.SecureConn, error) {
	hc := &handshakeConn{Conn: insecure}
	var c sec.SecureConn
	var err error
	if client {
		c, err = t.t.SecureOutbound(ctx, hc, p)
	} else {
		c, err = t.t.SecureInbound(ctx, hc, p)
	}
	if err != nil {
		return nil, err
	}
	rc, err := newRecordConn(c, insecure, client)
	if err != nil {
		insecure.Close()
		return nil, err
	}
	return rc, nil
}

// handshakeConn is the socket under the TLS handshake. Its reads never
// cross the end of a TLS record, so that when the handshake ends nothing
// the peer sent after its last handshake record has been read.
type handshakeConn struct {
	net.Conn
	hdr  [5]byte
	nhdr int // header bytes read from the socket
	sent int // header bytes returned
	left int // body bytes of the current record still to read
}

// Read implements net.Conn for crypto/tls.
func (h *handshakeConn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if h.nhdr < len(h.hdr) {
		k, err := h.Conn.Read(h.hdr[h.nhdr:])
		h.nhdr += k
		if h.nhdr < len(h.hdr) {
			if err == nil && k == 0 {
				err = io.ErrNoProgress
			}
			return 0, err
		}
		h.left = int(binary.BigEndian.Uint16(h.hdr[3:5]))
	}
	if h.sent < len(h.hdr) {
		k := copy(p, h.hdr[h.sent:])
		h.sent += k
		h.nextIfDone()
		return k, nil
	}
	k, err := h.Conn.Read(p[:min(len(p), h.left)])
	h.left -= k
	h.nextIfDone()
	return k, err
}

// nextIfDone moves to the next record once this one is read.
func (h *handshakeConn) nextIfDone() {
	if h.sent == len(h.hdr) && h.left == 0 {
		h.nhdr, h.sent = 0, 0
	}
}

// recordCipher is a record AEAD and its key length.
type recordCipher struct {
	keyLen int
	new    func(key []byte) (cipher.AEAD, error)
}

var (
	aes128GCM        = recordCipher{16, aesgcm.New}
	chacha20Poly1305 = recordCipher{chacha20poly1305.KeySize, chacha20poly1305.New}
)

// cipherFor returns the records' AEAD for a handshake's cipher suite:
// ChaCha20-Poly1305 where TLS chose it (crypto/tls may, where an end
// lacks AES hardware), else AES-128-GCM.
func cipherFor(suite uint16) recordCipher {
	if suite == tls.TLS_CHACHA20_POLY1305_SHA256 {
		return chacha20Poly1305
	}
	return aes128GCM
}

// recordKeys seals or opens one direction's records: the AEAD with nonce
// iv XOR the record's number under the current key, and a new key every
// rekeyEvery records.
type recordKeys struct {
	ciph   recordCipher
	secret []byte
	aead   cipher.AEAD
	iv     [12]byte
	seq    uint64
	n      [12]byte // the current record's nonce (nonce's result)
}

func newRecordKeys(ciph recordCipher, secret []byte) (*recordKeys, error) {
	k := &recordKeys{ciph: ciph}
	if err := k.set(secret); err != nil {
		return nil, err
	}
	return k, nil
}

// set derives key and IV from secret (HKDF-Expand, SHA-256).
func (k *recordKeys) set(secret []byte) error {
	key, err := hkdf.Expand(sha256.New, secret, "starling records key", k.ciph.keyLen)
	if err != nil {
		return err
	}
	iv, err := hkdf.Expand(sha256.New, secret, "starling records iv", len(k.iv))
	if err != nil {
		return err
	}
	a, err := k.ciph.new(key)
	if err != nil {
		return err
	}
	k.secret, k.aead, k.seq = secret, a, 0
	copy(k.iv[:], iv)
	return nil
}

// nonce returns the current record's nonce, valid until the next call.
func (k *recordKeys) nonce() []byte {
	k.n = k.iv
	binary.BigEndian.PutUint64(k.n[4:], binary.BigEndian.Uint64(k.iv[4:])^k.seq)
	return k.n[:]
}

// next counts a sealed or opened record and ratchets the key when due.
func (k *recordKeys) next() error {
	k.seq++
	if k.seq < rekeyEvery {
		return nil
	}
	s, err := hkdf.Expand(sha256.New, k.secret, "starling records next", 32)
	if err != nil {
		return err
	}
	return k.set(s)
}

// recordConn is a connection secured by recordsID. Reads and Writes go to
// the socket; the TLS connection that made the keys is kept only for the
// peer's identity and the negotiated muxer, and is never read or written
// again. Safe for one Read and one Write at a time, concurrently.
type recordConn struct {
	sec.SecureConn          // identities and ConnState
	raw            net.Conn // the socket

	wmu  sync.Mutex
	seal *recordKeys
	whdr [recordHdr]byte // the record being sealed's header (its additional data)
	werr error           // sticky: a failed write may have left half a record

	rmu   sync.Mutex
	open  *recordKeys
	in    *[]byte // receive buffer (pooled; nil while empty)
	r, w  int     // in[r:w]: read, not yet opened
	plain []byte  // opened, not yet returned (within in)
	rerr  error   // sticky: a bad record ends the connection
}

var (
	_ sec.SecureConn   = (*recordConn)(nil)
	_ mux.VectorWriter = (*recordConn)(nil)
)

// recordBufs holds send and receive buffers between uses, so that an idle
// connection holds none.
var recordBufs = sync.Pool{New: func() any {
	b := make([]byte, 2*recordMaxWire+recordAhead)
	return &b
}}

func newRecordConn(c sec.SecureConn, raw net.Conn, client bool) (*recordConn, error) {
	cs, ok := c.(interface{ ConnectionState() tls.ConnectionState })
	if !ok {
		return nil, fmt.Errorf("starling records: %T exposes no TLS state", c)
	}
	st := cs.ConnectionState()
	if st.Version != tls.VersionTLS13 {
		return nil, fmt.Errorf("starling records: TLS version %x, want 1.3", st.Version)
	}
	secret := func(label string) ([]byte, error) { return st.ExportKeyingMaterial(label, nil, 32) }
	c2s, err := secret("starling records client to server")
	if err != nil {
		return nil, err
	}
	s2c, err := secret("starling records server to client")
	if err != nil {
		return nil, err
	}
	if !client {
		c2s, s2c = s2c, c2s
	}
	rc := &recordConn{SecureConn: c, raw: raw}
	ciph := cipherFor(st.CipherSuite)
	if rc.seal, err = newRecordKeys(ciph, c2s); err != nil {
		return nil, err
	}
	if rc.open, err = newRecordKeys(ciph, s2c); err != nil {
		return nil, err
	}
	return rc, nil
}

// Write seals b into records and writes them.
func (c *recordConn) Write(b []byte) (int, error) { return c.write(b, nil) }

// WriteVectored seals hdr and payload as records of their own and writes
// them with one write (mux.VectorWriter).
func (c *recordConn) WriteVectored(hdr, payload []byte) (int, error) { return c.write(hdr, payload) }

func (c *recordConn) write(a, b []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.werr != nil {
		return 0, c.werr
	}
	bp := recordBufs.Get().(*[]byte)
	defer recordBufs.Put(bp)
	buf := (*bp)[:0]
	n, pending := 0, 0 // plaintext bytes written out, and sealed in buf
	flush := func() error {
		if len(buf) == 0 {
			return nil
		}
		if _, err := c.raw.Write(buf); err != nil {
			c.werr = fmt.Errorf("starling records: write: %w", err)
			return c.werr
		}
		buf, n, pending = buf[:0], n+pending, 0
		return nil
	}
	for _, p := range [2][]byte{a, b} {
		for len(p) > 0 {
			m := min(len(p), maxRecord)
			if len(buf)+recordHdr+m+recordTag > cap(buf) {
				if err := flush(); err != nil {
					return n, err
				}
			}
			binary.BigEndian.PutUint32(c.whdr[:], uint32(m))
			buf = append(buf, c.whdr[:]...)
			buf = c.seal.aead.Seal(buf, c.seal.nonce(), p[:m], c.whdr[:])
			if err := c.seal.next(); err != nil {
				c.werr = err
				return n, err
			}
			pending += m
			p = p[m:]
		}
	}
	err := flush()
	return n, err
}

// Read returns the plaintext of the next record, or what is left of it.
// A record that fits p is opened straight into p.
func (c *recordConn) Read(p []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if len(p) == 0 {
		return 0, nil
	}
	if len(c.plain) > 0 {
		k := copy(p, c.plain)
		c.plain = c.plain[k:]
		c.releaseIfEmpty()
		return k, nil
	}
	if c.rerr != nil {
		return 0, c.rerr
	}
	if err := c.fill(recordHdr); err != nil {
		return 0, err
	}
	in := *c.in
	hdr := in[c.r : c.r+recordHdr]
	m := int(binary.BigEndian.Uint32(hdr))
	if m == 0 || m > maxRecord {
		c.rerr = errRecordLength
		if hdr[0] == 0x15 && hdr[1] == 3 { // a TLS alert record
			c.rerr = errRecordAlert
		}
		return 0, c.rerr
	}
	if err := c.fill(recordHdr + m + recordTag); err != nil {
		return 0, err
	}
	in = *c.in
	rec := in[c.r : c.r+recordHdr+m+recordTag]
	dst := rec[recordHdr:recordHdr] // in place, when p is too small
	if len(p) >= m {
		dst = p[:0]
	}
	out, err := c.open.aead.Open(dst, c.open.nonce(), rec[recordHdr:], rec[:recordHdr])
	if err != nil {
		c.rerr = errRecordAuth
		return 0, c.rerr
	}
	if err := c.open.next(); err != nil {
		c.rerr = err
		return 0, err
	}
	c.r += len(rec)
	if len(p) >= m {
		c.releaseIfEmpty()
		return m, nil
	}
	k := copy(p, out)
	c.plain = out[k:]
	return k, nil
}

// fill reads until in[r:] holds n bytes, moving the unread bytes to the
// buffer's start first when n would not fit behind them. It reads at most
// recordAhead bytes past the n. A timeout keeps what was read.
func (c *recordConn) fill(n int) error {
	if c.in == nil {
		c.in = recordBufs.Get().(*[]byte)
		c.r, c.w = 0, 0
	}
	in := *c.in
	if c.w-c.r >= n {
		return nil
	}
	if c.r+n+recordAhead > len(in) {
		c.w = copy(in, in[c.r:c.w])
		c.r = 0
	}
	for c.w-c.r < n {
		k, err := c.raw.Read(in[c.w:min(len(in), c.r+n+recordAhead)])
		c.w += k
		if c.w-c.r >= n {
			break
		}
		if err != nil {
			if err == io.EOF {
				if c.w > c.r {
					err = io.ErrUnexpectedEOF
				}
				c.rerr = err
			}
			c.releaseIfEmpty()
			return err
		}
	}
	return nil
}

// releaseIfEmpty returns the receive buffer to the pool once it holds
// nothing unread.
func (c *recordConn) releaseIfEmpty() {
	if c.in != nil && c.r == c.w && len(c.plain) == 0 {
		recordBufs.Put(c.in)
		c.in, c.r, c.w = nil, 0, 0
	}
}

// Close closes the socket. (No TLS close_notify: the muxer above ends its
// streams itself, and a cut connection is one to the peer either way.)
func (c *recordConn) Close() error { return c.raw.Close() }

// LocalAddr implements net.Conn.
func (c *recordConn) LocalAddr() net.Addr { return c.raw.LocalAddr() }

// RemoteAddr implements net.Conn.
func (c *recordConn) RemoteAddr() net.Addr { return c.raw.RemoteAddr() }

// SetDeadline implements net.Conn.
func (c *recordConn) SetDeadline(t time.Time) error { return c.raw.SetDeadline(t) }

// SetReadDeadline implements net.Conn.
func (c *recordConn) SetReadDeadline(t time.Time) error { return c.raw.SetReadDeadline(t) }

// SetWriteDeadline implements net.Conn.
func (c *recordConn) SetWriteDeadline(t time.Time) error { return c.raw.SetWriteDeadline(t) }
