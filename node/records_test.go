package node

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	ci "github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/sec"
	libp2ptls "github.com/libp2p/go-libp2p/p2p/security/tls"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"

	"github.com/starling-ml/starling/node/mux"
)

// recordEnds returns two record connections over raws whose keys match:
// what a seals, b opens, and the other way round.
func recordEnds(t testing.TB, ra, rb net.Conn) (a, b *recordConn) {
	return recordEndsWith(t, aes128GCM, ra, rb)
}

// recordEndsWith is recordEnds with the AEAD ciph.
func recordEndsWith(t testing.TB, ciph recordCipher, ra, rb net.Conn) (a, b *recordConn) {
	t.Helper()
	s1, s2 := make([]byte, 32), make([]byte, 32)
	rand.Read(s1)
	rand.Read(s2)
	keys := func(s []byte) *recordKeys {
		k, err := newRecordKeys(ciph, bytes.Clone(s))
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	a = &recordConn{raw: ra, seal: keys(s1), open: keys(s2)}
	b = &recordConn{raw: rb, seal: keys(s2), open: keys(s1)}
	return a, b
}

// sealed returns what a writes to its socket for each of msgs.
func sealed(t testing.TB, a *recordConn, msgs ...[]byte) [][]byte {
	t.Helper()
	w := &writeLog{}
	a.raw = w
	for _, m := range msgs {
		if _, err := a.Write(m); err != nil {
			t.Fatal(err)
		}
	}
	return w.writes
}

// feedConn is a net.Conn whose reads come from r.
type feedConn struct {
	net.Conn
	r io.Reader
}

func (f *feedConn) Read(p []byte) (int, error) { return f.r.Read(p) }

// readAll reads n bytes from c in reads of at most step bytes.
func readAll(c *recordConn, n, step int) ([]byte, error) {
	out := make([]byte, 0, n)
	buf := make([]byte, step)
	for len(out) < n {
		k, err := c.Read(buf[:min(step, n-len(out))])
		out = append(out, buf[:k]...)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// TestRecordsRoundTrip: payloads of every awkward size arrive intact over
// a socket, through reads larger and smaller than a record, across key
// changes, and a vectored write is two records in one write.
func TestRecordsRoundTrip(t *testing.T) {
	defer func(r uint64) { rekeyEvery = r }(rekeyEvery)
	rekeyEvery = 3
	t.Run("aes-gcm", func(t *testing.T) { roundTrip(t, aes128GCM) })
	t.Run("chacha20-poly1305", func(t *testing.T) { roundTrip(t, chacha20Poly1305) })
	if cipherFor(tls.TLS_CHACHA20_POLY1305_SHA256).keyLen != chacha20Poly1305.keyLen ||
		cipherFor(tls.TLS_AES_128_GCM_SHA256).keyLen != aes128GCM.keyLen {
		t.Fatal("cipherFor does not follow the handshake's suite")
	}
}

func roundTrip(t *testing.T, ciph recordCipher) {
	ra, rb := net.Pipe()
	a, b := recordEndsWith(t, ciph, ra, rb)
	sizes := []int{1, 7, maxRecord - 1, maxRecord, maxRecord + 1, 3*maxRecord + 5, 100}
	var want []byte
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i, n := range sizes {
			p := randBytes(n, uint64(i))
			if i%2 == 0 {
				a.Write(p)
			} else {
				a.WriteVectored(p[:min(5, n)], p[min(5, n):])
			}
		}
	}()
	for i, n := range sizes {
		want = append(want, randBytes(n, uint64(i))...)
	}
	for _, step := range []int{maxRecord + 100, 1000} { // straight into p, then through the buffer
		n := len(want) / 2
		if step == 1000 {
			n = len(want)
		}
		got, err := readAll(b, n, step)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		if !bytes.Equal(got, want[:n]) {
			t.Fatalf("step %d: payload differs", step)
		}
		want = want[n:]
	}
	<-done

	w := &writeLog{}
	a.raw = w
	if n, err := a.WriteVectored(make([]byte, 12), make([]byte, maxRecord)); n != 12+maxRecord || err != nil {
		t.Fatalf("WriteVectored = %d, %v", n, err)
	}
	if got := w.sizes(); len(got) != 1 || got[0] != 2*(recordHdr+recordTag)+12+maxRecord {
		t.Fatalf("writes %v, want one of both records", got)
	}
}

// TestRecordsReject: a record changed, replayed, reordered, reflected,
// cut short or of a length out of range fails the connection for good.
func TestRecordsReject(t *testing.T) {
	cases := []struct {
		name string
		wire func(recs [][]byte, own [][]byte) []byte
		want error
	}{
		{"intact", func(r, _ [][]byte) []byte { return bytes.Join(r, nil) }, nil},
		{"bit flipped", func(r, _ [][]byte) []byte { r[0][recordHdr+3] ^= 1; return bytes.Join(r, nil) }, errRecordAuth},
		{"tag flipped", func(r, _ [][]byte) []byte { r[0][len(r[0])-1] ^= 0x80; return bytes.Join(r, nil) }, errRecordAuth},
		{"length changed", func(r, _ [][]byte) []byte {
			binary.BigEndian.PutUint32(r[0], binary.BigEndian.Uint32(r[0])-1)
			return bytes.Join(r, nil)
		}, errRecordAuth},
		{"replayed", func(r, _ [][]byte) []byte { return bytes.Join([][]byte{r[0], r[0]}, nil) }, errRecordAuth},
		{"reordered", func(r, _ [][]byte) []byte { return bytes.Join([][]byte{r[1], r[0]}, nil) }, errRecordAuth},
		{"reflected", func(_, own [][]byte) []byte { return bytes.Join(own, nil) }, errRecordAuth},
		{"cut short", func(r, _ [][]byte) []byte { return r[0][:len(r[0])-1] }, io.ErrUnexpectedEOF},
		{"zero length", func(r, _ [][]byte) []byte { return make([]byte, 40) }, errRecordLength},
		{"too long", func(r, _ [][]byte) []byte { return binary.BigEndian.AppendUint32(nil, maxRecord+1) }, errRecordLength},
		{"TLS alert", func(r, _ [][]byte) []byte { return []byte{0x15, 3, 3, 0, 2, 2, 42} }, errRecordAlert},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, b := recordEnds(t, nil, nil)
			recs := sealed(t, a, []byte("first record"), []byte("second record"))
			own := sealed(t, b, []byte("first record"), []byte("second record"))
			b.raw = &feedConn{r: bytes.NewReader(tc.wire(recs, own))}
			got, err := readAll(b, len("first record")+len("second record"), 64)
			if tc.want == nil {
				if err != nil || string(got) != "first recordsecond record" {
					t.Fatalf("got %q, %v", got, err)
				}
				return
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %q, %v; want %v", got, err, tc.want)
			}
			if _, err2 := b.Read(make([]byte, 10)); !errors.Is(err2, tc.want) {
				t.Fatalf("next Read: %v, want %v again", err2, tc.want)
			}
		})
	}
}

// TestRecordsReadTimeout: a read deadline that passes in the middle of a
// record loses nothing: the next Read returns the record whole.
func TestRecordsReadTimeout(t *testing.T) {
	ra, rb := net.Pipe()
	a, b := recordEnds(t, nil, rb)
	wire := sealed(t, a, []byte("after the deadline"))[0]
	go ra.Write(wire[:7])
	b.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := b.Read(make([]byte, 64)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read = %v, want the deadline", err)
	}
	b.SetReadDeadline(time.Time{})
	go ra.Write(wire[7:])
	got := make([]byte, 64)
	n, err := b.Read(got)
	if err != nil || string(got[:n]) != "after the deadline" {
		t.Fatalf("Read = %q, %v", got[:n], err)
	}
}

// TestHandshakeConnStopsAtRecord: reads through handshakeConn end at TLS
// record boundaries, however large the buffer, so that the bytes behind
// the last handshake record stay in the socket.
func TestHandshakeConnStopsAtRecord(t *testing.T) {
	rec := func(n int) []byte { return append([]byte{22, 3, 3, byte(n >> 8), byte(n)}, make([]byte, n)...) }
	wire := bytes.Join([][]byte{rec(300), rec(0), rec(5)}, nil)
	src := bytes.NewReader(append(bytes.Clone(wire), "after"...))
	h := &handshakeConn{Conn: &feedConn{r: src}}
	var got []byte
	buf := make([]byte, 4096)
	for len(got) < len(wire) {
		n, err := h.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, buf[:n]...)
	}
	if !bytes.Equal(got, wire) {
		t.Fatalf("read %d bytes, want the %d of the records", len(got), len(wire))
	}
	if rest, _ := io.ReadAll(src); string(rest) != "after" {
		t.Fatalf("socket holds %q after the records, want %q", rest, "after")
	}
}

// securePair runs recordsTLS's handshake over loopback TCP.
func securePair(t testing.TB) (client, server sec.SecureConn, cid, sid peer.ID) {
	t.Helper()
	tr := func() (*recordsTLS, peer.ID) {
		k, _, err := ci.GenerateEd25519Key(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		id, _ := peer.IDFromPrivateKey(k)
		r, err := newRecordsTLS(recordsID, k, nil)
		if err != nil {
			t.Fatal(err)
		}
		return r, id
	}
	ct, cid := tr()
	st, sid := tr()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			server, err = st.SecureInbound(ctx, c, cid)
		}
		done <- err
	}()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	client, err = ct.SecureOutbound(ctx, c, sid)
	if err != nil {
		t.Fatal(err)
	}
	// The client writes before the server's handshake is over: what it
	// sends must not be read by the server's TLS.
	go client.Write([]byte("early"))
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server, cid, sid
}

// TestRecordsHandshake: two ends of a real handshake know each other's
// identity and exchange data both ways, the first bytes sent before the
// server's handshake ended.
func TestRecordsHandshake(t *testing.T) {
	client, server, cid, sid := securePair(t)
	if client.RemotePeer() != sid || server.RemotePeer() != cid {
		t.Fatalf("peers %s, %s; want %s, %s", client.RemotePeer(), server.RemotePeer(), sid, cid)
	}
	rc, rs := client.(*recordConn), server.(*recordConn)
	if bytes.Equal(rc.seal.secret, rc.open.secret) || !bytes.Equal(rc.seal.secret, rs.open.secret) {
		t.Fatal("each direction needs its own key, the same at both ends")
	}
	if _, ok := client.(mux.VectorWriter); !ok {
		t.Fatal("record connection is not a mux.VectorWriter")
	}
	server.SetReadDeadline(time.Now().Add(10 * time.Second))
	got := make([]byte, 5)
	if _, err := io.ReadFull(server, got); err != nil || string(got) != "early" {
		t.Fatalf("server read %q, %v", got, err)
	}
	want := randBytes(3*maxRecord+17, 4)
	go server.Write(want)
	client.SetReadDeadline(time.Now().Add(10 * time.Second))
	back := make([]byte, len(want))
	if _, err := io.ReadFull(client, back); err != nil || !bytes.Equal(back, want) {
		t.Fatalf("client read: %v (equal %t)", err, bytes.Equal(back, want))
	}
}

// TestRecordsNegotiated: Starling nodes secure their connection with
// recordsID; with a libp2p host that offers only /tls/1.0.0 a node falls
// back to it.
func TestRecordsNegotiated(t *testing.T) {
	a, b := newTestNode(t, nil), newTestNode(t, nil)
	connect(t, a, b)
	if c := b.host.Network().ConnsToPeer(a.ID()); len(c) == 0 || c[0].ConnState().Security != recordsID {
		t.Fatalf("conns %v, want one secured by %s", c, recordsID)
	}
	h, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"), libp2p.Transport(tcp.NewTCPTransport),
		libp2p.Security(libp2ptls.ID, libp2ptls.New), libp2p.DisableRelay())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ctx := ctxT(t, 10*time.Second)
	if err := a.Connect(ctx, peer.AddrInfo{ID: h.ID(), Addrs: h.Addrs()}); err != nil {
		t.Fatal(err)
	}
	if c := a.host.Network().ConnsToPeer(h.ID()); len(c) == 0 || c[0].ConnState().Security != libp2ptls.ID {
		t.Fatalf("conns %v, want one secured by %s", c, libp2ptls.ID)
	}
}
