package node

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
)

// The NAT test bed (scripts/natbed.sh): a relay on the public segment and
// peers a and b each behind its own masquerading router.
const (
	natRelayIP = "11.79.0.1"
	natTensorN = 1 << 18 // floats: a 1 MiB tensor
	natTag     = Tag(24)
)

// natResult is what peer b reports: how long the relayed connection and
// the direct one took, and the direct connection's addresses.
type natResult struct {
	RelaySeconds  float64 `json:"relay_s"`  // b's start → limited conn to a via the relay
	DirectSeconds float64 `json:"direct_s"` // limited conn → direct conn (hole punch)
	SendSeconds   float64 `json:"send_s"`   // the 1 MiB tensor on the direct conn
	Local, Remote string
}

// TestNATHolePunch runs a relay and two peers behind NAT (masquerading
// routers in network namespaces, scripts/natbed.sh) as three processes
// (this test binary, re-executed in each namespace). a and b book a slot
// on the relay (--relay); b reaches a through the relay over a limited
// connection; DCUtR hole punching must then bring a direct connection,
// and a 1 MiB tensor must go from b to a over it (tensors never take a
// limited connection). Once for TCP (simultaneous open), once for QUIC.
// Needs root, ip and nft (it skips without them, and with -short); ~8 s,
// most of it creating the namespaces. The namespaces are named
// nat-PID-*, so that concurrent runs do not meet.
func TestNATHolePunch(t *testing.T) {
	if role := os.Getenv("STARLING_NAT_ROLE"); role != "" {
		natRole(t, role)
		return
	}
	if testing.Short() {
		t.Skip("-short: the NAT test bed takes ~10 s")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to create network namespaces")
	}
	for _, c := range []string{"ip", "nft", "bash"} {
		if _, err := exec.LookPath(c); err != nil {
			t.Skipf("needs the %s command (iproute2, nftables)", c)
		}
	}
	bed, err := filepath.Abs("../scripts/natbed.sh")
	if err != nil {
		t.Fatal(err)
	}
	prefix := fmt.Sprintf("nat-%d-", os.Getpid())
	natbed := func(arg string) *exec.Cmd {
		cmd := exec.Command(bed, arg)
		cmd.Env = append(os.Environ(), "NATBED_PREFIX="+prefix)
		return cmd
	}
	if out, err := natbed("up").CombinedOutput(); err != nil {
		natbed("down").Run()
		t.Fatalf("natbed.sh up: %v\n%s", err, out)
	}
	t.Cleanup(func() { natbed("down").Run() })
	for i, tr := range []string{"tcp", "quic"} {
		t.Run(tr, func(t *testing.T) { natRun(t, prefix, tr, 4001+i) })
	}
}

// natRun starts the relay, a and b for one transport and port and checks
// b's report.
func natRun(t *testing.T, prefix, transport string, port int) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	start := func(role, ns string) (*exec.Cmd, *bytes.Buffer) {
		var out bytes.Buffer
		cmd := exec.CommandContext(ctx, "ip", "netns", "exec", ns, os.Args[0], "-test.run=^TestNATHolePunch$", "-test.v")
		cmd.Env = append(os.Environ(), "STARLING_NAT_ROLE="+role, "STARLING_NAT_DIR="+dir,
			"STARLING_NAT_TRANSPORT="+transport, fmt.Sprintf("STARLING_NAT_PORT=%d", port))
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd, &out
	}
	relay, relayOut := start("relay", prefix+"relay")
	a, aOut := start("a", prefix+"a")
	b, bOut := start("b", prefix+"b")
	errB := b.Wait()
	errA := a.Wait()
	os.WriteFile(filepath.Join(dir, "done"), nil, 0o644) // the relay stops
	relay.Wait()
	if logs := os.Getenv("STARLING_NAT_LOGS"); logs != "" { // with GOLOG_LOG_LEVEL=debug, say
		for role, out := range map[string]*bytes.Buffer{"relay": relayOut, "a": aOut, "b": bOut} {
			os.WriteFile(filepath.Join(logs, transport+"-"+role+".log"), out.Bytes(), 0o644)
		}
	}
	if errA != nil || errB != nil {
		t.Fatalf("a: %v, b: %v\n--- relay:\n%s\n--- a:\n%s\n--- b:\n%s", errA, errB, relayOut, aOut, bOut)
	}
	var r natResult
	raw, err := os.ReadFile(filepath.Join(dir, "b.json"))
	if err == nil {
		err = json.Unmarshal(raw, &r)
	}
	if err != nil {
		t.Fatalf("b's report: %v\n--- b:\n%s", err, bOut)
	}
	t.Logf("%s: connected via the relay in %.2f s, upgraded to direct in %.2f s (%s -> %s), 1 MiB tensor over it in %.3f s",
		transport, r.RelaySeconds, r.DirectSeconds, r.Local, r.Remote, r.SendSeconds)
}

// natRole is one process of the test bed, inside its namespace.
func natRole(t *testing.T, role string) {
	dir, transport, port := os.Getenv("STARLING_NAT_DIR"), os.Getenv("STARLING_NAT_TRANSPORT"), os.Getenv("STARLING_NAT_PORT")
	listen := "/ip4/0.0.0.0/tcp/" + port
	if transport == "quic" {
		listen = "/ip4/0.0.0.0/udp/" + port + "/quic-v1"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	relayFile := filepath.Join(dir, "relay.addr")
	aFile := filepath.Join(dir, "a.id")
	if role == "relay" {
		r := newTestNode(t, func(c *Config) { c.ListenAddrs = []string{listen}; c.RelayService = true })
		raddr := strings.Replace(listen, "0.0.0.0", natRelayIP, 1) + "/p2p/" + r.ID().String()
		natWrite(t, relayFile, raddr)
		natWait(t, ctx, filepath.Join(dir, "done"))
		return
	}
	raddr := string(natWait(t, ctx, relayFile))
	behindNAT := func(c *Config) {
		c.ListenAddrs = []string{listen}
		c.HolePunching = true
		c.Relays = []string{raddr}
	}
	n := newTestNode(t, behindNAT, withPrivate())
	t.Logf("%s is %s", role, n.ID())
	if role == "a" {
		// Wait for the reservation (a relayed address) and for the hole
		// punching service, then for b's tensor.
		for !hasCircuit(n.Addrs()) || !holePunchReady(n) {
			if ctx.Err() != nil {
				t.Fatalf("a: after 30 s, addresses %v, hole punching ready: %v", n.Addrs(), holePunchReady(n))
			}
			time.Sleep(50 * time.Millisecond)
		}
		natWrite(t, aFile, n.ID().String())
		got, err := n.Recv(ctx, "", natTag, nil)
		if err != nil {
			t.Fatalf("a: receiving b's tensor: %v", err)
		}
		if want := rawTensor(natTag, natTensorN, 7); !bytes.Equal(got.Payload, want.Payload) {
			t.Fatal("a: the tensor from b arrived corrupted")
		}
		natWrite(t, filepath.Join(dir, "a.ok"), "")
		return
	}
	// b: reach a through the relay, wait for the hole punch, send.
	aID, err := peer.Decode(string(natWait(t, ctx, aFile)))
	if err != nil {
		t.Fatal(err)
	}
	for !holePunchReady(n) {
		if ctx.Err() != nil {
			t.Fatalf("b: hole punching not ready after 30 s (no public observed address?)")
		}
		time.Sleep(50 * time.Millisecond)
	}
	t0 := time.Now()
	circuit := ma.StringCast(raddr + "/p2p-circuit/p2p/" + aID.String())
	if err := n.ConnectRetry(ctx, peer.AddrInfo{ID: aID, Addrs: []ma.Multiaddr{circuit}}); err != nil {
		t.Fatalf("b: reaching a through the relay: %v", err)
	}
	var r natResult
	r.RelaySeconds = time.Since(t0).Seconds()
	t1 := time.Now()
	limited := false
	for _, c := range n.Host().Network().ConnsToPeer(aID) {
		limited = limited || c.Stat().Limited
	}
	if !limited {
		t.Fatalf("b: no limited (relayed) connection to a after dialling its circuit address")
	}
	// Before the hole punch, a tensor must not take the relay.
	if d := directConn(n, aID); d == nil {
		sctx, scancel := context.WithTimeout(ctx, 100*time.Millisecond)
		err := n.Send(sctx, aID, rawTensor(natTag+1, 16, 1))
		scancel()
		if d := directConn(n, aID); d == nil && !errors.Is(err, ErrLimitedConn) && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("b: Send with only a relayed connection = %v, want ErrLimitedConn", err)
		}
	}
	var d network.Conn
	for d = directConn(n, aID); d == nil; d = directConn(n, aID) {
		if ctx.Err() != nil {
			t.Fatalf("b: no direct connection to a (hole punching failed); connections: %v", connSummary(n, aID))
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.DirectSeconds = time.Since(t1).Seconds()
	r.Local, r.Remote = d.LocalMultiaddr().String(), d.RemoteMultiaddr().String()
	t2 := time.Now()
	if err := n.Send(ctx, aID, rawTensor(natTag, natTensorN, 7)); err != nil {
		t.Fatalf("b: sending to a over %s: %v", r.Remote, err)
	}
	r.SendSeconds = time.Since(t2).Seconds()
	raw, _ := json.Marshal(r)
	natWrite(t, filepath.Join(dir, "b.json"), string(raw))
	// Let a read the whole tensor before b's connection closes.
	natWait(t, ctx, filepath.Join(dir, "a.ok"))
}

// directConn returns a connection to p that is not limited (relayed).
func directConn(n *Node, p peer.ID) network.Conn {
	for _, c := range n.Host().Network().ConnsToPeer(p) {
		if !c.Stat().Limited && !c.IsClosed() {
			return c
		}
	}
	return nil
}

func connSummary(n *Node, p peer.ID) []string {
	var s []string
	for _, c := range n.Host().Network().ConnsToPeer(p) {
		s = append(s, fmt.Sprintf("%s limited=%v", c.RemoteMultiaddr(), c.Stat().Limited))
	}
	return s
}

// holePunchReady reports whether n's hole punching service runs: it waits
// for a public (observed) address first, and a relayed connection that
// comes in before that is never upgraded (go-libp2p v0.52 registers its
// connection notifiee only then).
func holePunchReady(n *Node) bool {
	return slices.Contains(n.Host().Mux().Protocols(), "/libp2p/dcutr")
}

func hasCircuit(addrs []ma.Multiaddr) bool {
	for _, a := range addrs {
		if _, err := a.ValueForProtocol(ma.P_CIRCUIT); err == nil {
			return true
		}
	}
	return false
}

// natWrite writes a file atomically (rename), for the other processes.
func natWrite(t *testing.T, path, s string) {
	if err := os.WriteFile(path+".tmp", []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

// natWait waits for path to exist, until ctx ends, and returns its content.
func natWait(t *testing.T, ctx context.Context, path string) []byte {
	for {
		if b, err := os.ReadFile(path); err == nil {
			return b
		}
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", filepath.Base(path), ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
