package peerrun

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/starling-ml/starling/node"
	"github.com/starling-ml/starling/swarm"
)

func startPeer(t *testing.T, insecure bool) *swarm.Peer {
	t.Helper()
	c := swarm.DefaultConfig()
	c.Node = node.TestConfig()
	c.Node.Insecure = insecure
	c.Gossip.Namespace = "connect-test"
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
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return sa.(*syscall.SockaddrInet4).Port
}

// TestConnectReportsCause: the retries after a refused dial fail with
// libp2p's "dial backoff"; connect reports the refusal itself.
func TestConnectReportsCause(t *testing.T) {
	a, b := startPeer(t, false), startPeer(t, false)
	port := refusingPort(t)
	addr := fmt.Sprintf("/ip4/127.0.0.1/tcp/%d/p2p/%s", port, b.ID())
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	err := connect(ctx, a, addr)
	if err == nil || !strings.Contains(err.Error(), "refused") || strings.Contains(err.Error(), "backoff") {
		t.Fatalf("connect to a closed port: %v, want the refusal", err)
	}
}

// TestConnectSecurityMismatch: a peer with other transport security fails
// at once with node.ErrSecurityMismatch instead of being retried.
func TestConnectSecurityMismatch(t *testing.T) {
	a, b := startPeer(t, true), startPeer(t, false)
	addr := fmt.Sprintf("%s/p2p/%s", b.Node.Addrs()[0], b.ID())
	start := time.Now()
	err := connect(context.Background(), a, addr)
	if !errors.Is(err, node.ErrSecurityMismatch) {
		t.Fatalf("insecure to TLS: %v, want ErrSecurityMismatch", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("gave up after %v, want at once", d)
	}
}
