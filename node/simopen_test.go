package node

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
)

// TestSimultaneousDials: peers that dial each other at the same moment
// connect, although now and then their dials meet in one TCP connection
// that both opened (a TCP simultaneous open: they dial from their
// listening ports), where the handshake fails on both ends. Before
// Connect dialled again, about one pair in twenty failed, with TLS as
// ErrSwarmKey and with Insecure as ErrNotAllowed.
func TestSimultaneousDials(t *testing.T) {
	for _, insecure := range []bool{false, true} {
		name := "tls"
		if insecure {
			name = "insecure"
		}
		t.Run(name, func(t *testing.T) {
			var simOpens atomic.Int64
			log := slog.New(countHandler{msg: "TCP simultaneous open", n: &simOpens})
			mut := func(c *Config) { c.Insecure = insecure }
			pairs := simOpenPairs()
			for range pairs {
				a, b := newTestNode(t, mut, WithLogger(log)), newTestNode(t, mut, WithLogger(log))
				dialPair(t, a, b, func(ctx context.Context, from, to *Node) error { return from.Connect(ctx, to.AddrInfo()) })
			}
			t.Logf("%d pairs, %d redials after a simultaneous open (both of its peers redial)", pairs, simOpens.Load())
		})
	}
}

// TestSimultaneousStreams: peers not yet connected that open a stream to
// each other at the same moment (a butterfly's partners, a ring of two)
// get their streams although their implicit dials sometimes meet in a
// TCP simultaneous open.
func TestSimultaneousStreams(t *testing.T) {
	const proto = "/starling/test-simopen/1"
	for range simOpenPairs() {
		a, b := newTestNode(t, nil), newTestNode(t, nil)
		for _, n := range []*Node{a, b} {
			n.Host().SetStreamHandler(proto, func(s network.Stream) { s.Close() })
		}
		a.Host().Peerstore().AddAddrs(b.ID(), b.Host().Addrs(), time.Hour)
		b.Host().Peerstore().AddAddrs(a.ID(), a.Host().Addrs(), time.Hour)
		dialPair(t, a, b, func(ctx context.Context, from, to *Node) error {
			s, err := OpenStream(ctx, from.Host(), to.ID(), proto)
			if err == nil {
				s.Reset()
			}
			return err
		})
	}
}

// dialPair runs dial(a, b) and dial(b, a) at the same moment, fails t if
// either fails, and closes a and b.
func dialPair(t *testing.T, a, b *Node, dial func(ctx context.Context, from, to *Node) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var errs [2]error
	start := make(chan struct{})
	wg.Go(func() { <-start; errs[0] = dial(ctx, a, b) })
	wg.Go(func() { <-start; errs[1] = dial(ctx, b, a) })
	close(start)
	wg.Wait()
	for k, err := range errs {
		if err != nil {
			t.Fatalf("%s and %s, peer %d: %v", a.ID(), b.ID(), k, err)
		}
	}
	a.Close()
	b.Close()
}

// simOpenPairs is how many pairs the simultaneous-dial tests start: 60,
// or 15 with -short (CI's race run, where about half the pairs meet in a
// simultaneous open; without it one in ten to twenty does).
func simOpenPairs() int {
	if testing.Short() {
		return 15
	}
	return 60
}

// countHandler counts the records whose message starts with msg.
type countHandler struct {
	msg string
	n   *atomic.Int64
}

func (h countHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h countHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, h.msg) {
		h.n.Add(1)
	}
	return nil
}
func (h countHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h countHandler) WithGroup(string) slog.Handler      { return h }

// TestSimultaneousOpenError: simultaneousOpen knows crypto/tls's error
// for two clients on one connection, and no other.
func TestSimultaneousOpenError(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		accepted <- c
	}()
	c1, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c2 := <-accepted
	if c2 == nil {
		t.Fatal("accept failed")
	}
	cfg := &tls.Config{InsecureSkipVerify: true}
	var wg sync.WaitGroup
	var errs [2]error
	for i, c := range []net.Conn{c1, c2} {
		c.SetDeadline(time.Now().Add(10 * time.Second))
		wg.Go(func() { errs[i] = tls.Client(c, cfg).Handshake(); c.Close() })
	}
	wg.Wait()
	simOpens := 0
	for _, err := range errs {
		if err != nil && simultaneousOpen(err) {
			simOpens++
		}
	}
	if simOpens == 0 {
		t.Fatalf("two TLS clients failed with %v and %v; simultaneousOpen knows neither", errs[0], errs[1])
	}
	for _, s := range []string{"connection reset by peer", "message did not have trailing newline", "tls: first record does not look like a TLS handshake"} {
		if simultaneousOpen(&net.OpError{Op: "read", Err: errorString(s)}) {
			t.Errorf("simultaneousOpen(%q) = true", s)
		}
	}
}

type errorString string

func (e errorString) Error() string { return string(e) }

// TestSimOpenDelay: after a simultaneous open the lower peer ID dials
// again at once and the higher one later, ever later with each try.
func TestSimOpenDelay(t *testing.T) {
	lo, hi := peer.ID("a"), peer.ID("b")
	for try := 1; try < simOpenTries; try++ {
		if d := simOpenDelay(lo, hi, try); d != 0 {
			t.Errorf("lower ID, try %d: %v, want 0", try, d)
		}
		if d := simOpenDelay(hi, lo, try); d < simOpenWait || d <= simOpenDelay(hi, lo, try-1) {
			t.Errorf("higher ID, try %d: %v, want at least %v and more than try %d's", try, d, simOpenWait, try-1)
		}
	}
}
