package peerrun

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"

	"github.com/starling-ml/starling/node"
	"github.com/starling-ml/starling/swarm"
)

// testPeerConfig is the swarm configuration of this file's test peers.
func testPeerConfig() swarm.Config {
	c := swarm.DefaultConfig()
	c.Node = node.TestConfig()
	c.Gossip.Namespace = "connect-test"
	return c
}

func startPeer(t *testing.T, insecure bool) *swarm.Peer {
	t.Helper()
	c := testPeerConfig()
	c.Node.Insecure = insecure
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := swarm.Start(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// refusingPort returns a loopback TCP port that refuses connections for
// the rest of the test: a socket is bound to it but does not listen, so
// that no other process can take the port meanwhile (closing a listener
// would leave it free for anyone).
func refusingPort(t *testing.T) int {
	t.Helper()
	fd, port := refusingSocket(t)
	t.Cleanup(func() { syscall.Close(fd) })
	return port
}

// refusingSocket is refusingPort with the socket, which the caller closes
// to free the port.
func refusingSocket(t *testing.T) (int, int) {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return fd, sa.(*syscall.SockaddrInet4).Port
}

// TestRedialDelay: the backoff doubles from redialFirst and stays at
// redialMax.
func TestRedialDelay(t *testing.T) {
	want := []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second,
		4 * time.Second, 8 * time.Second, 10 * time.Second, 10 * time.Second}
	for i, w := range want {
		if got := redialDelay(i + 1); got != w {
			t.Errorf("after %d failures: %v, want %v", i+1, got, w)
		}
	}
	if got := redialDelay(1000); got != redialMax {
		t.Errorf("after 1000 failures: %v, want %v", got, redialMax)
	}
}

// waitFailure waits until d reports a failure containing want.
func waitFailure(t *testing.T, d *dialler, want string) string {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if f := strings.Join(d.Failures(), "\n"); strings.Contains(f, want) {
			return f
		}
		if time.Now().After(deadline) {
			t.Fatalf("failures %q never mention %q", d.Failures(), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestDiallerReportsCause: an address that refuses connections is
// redialled in the background, and its failure reported as the refusal,
// not as libp2p's "dial backoff" that follows it.
func TestDiallerReportsCause(t *testing.T) {
	a, b := startPeer(t, false), startPeer(t, false)
	port := refusingPort(t)
	addr := fmt.Sprintf("/ip4/127.0.0.1/tcp/%d/p2p/%s", port, b.ID())
	d, err := dialAll(context.Background(), a, []string{addr}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	waitFailure(t, d, "refused")
	time.Sleep(3 * redialFirst) // a few redials, each refused or backed off
	if f := waitFailure(t, d, "refused"); strings.Contains(f, "backoff") || strings.Contains(f, "\n") {
		t.Fatalf("failure %q: want the refusal in one line", f)
	}
}

// TestDiallerSecurityMismatch: a peer with other transport security is
// reported as such.
func TestDiallerSecurityMismatch(t *testing.T) {
	a, b := startPeer(t, true), startPeer(t, false)
	addr := fmt.Sprintf("%s/p2p/%s", b.Node.Addrs()[0], b.ID())
	d, err := dialAll(context.Background(), a, []string{addr}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	waitFailure(t, d, "none of our transport security protocols")
}

// TestDiallerReconnects: a --connect peer whose connection is lost is
// dialled again, while a dead address beside it changes nothing.
func TestDiallerReconnects(t *testing.T) {
	a, b := startPeer(t, false), startPeer(t, false)
	live := fmt.Sprintf("%s/p2p/%s", b.Node.Addrs()[0], b.ID())
	dead := fmt.Sprintf("/ip4/127.0.0.1/tcp/%d/p2p/%s", refusingPort(t), startPeer(t, false).ID())
	d, err := dialAll(context.Background(), a, []string{dead, live}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	d.WaitFirst()
	nw := a.Node.Host().Network()
	if nw.Connectedness(b.Node.ID()) != network.Connected {
		t.Fatal("not connected to the live peer after the first dials")
	}
	connected := func() {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for nw.Connectedness(b.Node.ID()) != network.Connected {
			if time.Now().After(deadline) {
				t.Fatalf("not connected to %s; failures %q", live, d.Failures())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	connected()
	if err := nw.ClosePeer(b.Node.ID()); err != nil {
		t.Fatal(err)
	}
	connected()
	waitFailure(t, d, "refused")
}

func TestConnectBadAddress(t *testing.T) {
	for _, a := range []string{"not-a-multiaddr", "/ip4/127.0.0.1/tcp/1"} {
		if _, err := parseConnect(a); !errors.Is(err, ErrUsage) {
			t.Errorf("%s: %v, want a usage error", a, err)
		}
	}
}

// TestDiallerIgnoresLibp2pBackoff: a --connect peer that was unreachable
// for a while (the other side of a partition, a restarting peer) is
// connected at the dialler's next redial once it listens again, not when
// libp2p's own dial backoff for its address ends (5 s after the first
// failure, then 5 s + tries² s: half a minute after a minute's cut).
func TestDiallerIgnoresLibp2pBackoff(t *testing.T) {
	a := startPeer(t, false)
	key := t.TempDir() + "/b.key"
	fd, port := refusingSocket(t)
	// b's identity, made by a first start on another port.
	c := testPeerConfig()
	c.Node.KeyFile = key
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b0, err := swarm.Start(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	id := b0.Node.ID()
	b0.Close()
	addr := fmt.Sprintf("/ip4/127.0.0.1/tcp/%d/p2p/%s", port, id)
	d, err := dialAll(context.Background(), a, []string{addr}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	waitFailure(t, d, "refused")
	time.Sleep(4 * redialFirst) // redials at 0.25 and 0.75 s, the next at 1.75 s
	syscall.Close(fd)
	c.Node.ListenAddrs = []string{fmt.Sprintf("/ip4/127.0.0.1/tcp/%d", port)}
	b, err := swarm.Start(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	up := time.Now()
	nw := a.Node.Host().Network()
	for nw.Connectedness(id) != network.Connected {
		if time.Since(up) > 3*time.Second {
			t.Fatalf("not connected %v after the peer listened (libp2p's backoff holds until 5 s after the first failure); failures %q", time.Since(up), d.Failures())
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("connected %v after the peer listened", time.Since(up))
}
