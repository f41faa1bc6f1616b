package node

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// foundSet collects discovered peers.
func foundSet() (func(peer.AddrInfo), <-chan peer.ID) {
	ch := make(chan peer.ID, 64)
	return func(ai peer.AddrInfo) {
		select {
		case ch <- ai.ID:
		default:
		}
	}, ch
}

func waitFound(t *testing.T, ch <-chan peer.ID, want peer.ID, d time.Duration) {
	t.Helper()
	timeout := time.After(d)
	for {
		select {
		case p := <-ch:
			if p == want {
				return
			}
		case <-timeout:
			t.Fatalf("did not discover %s within %v", want, d)
		}
	}
}

// TestDHTDiscovery: three hosts on loopback; b and c know only the
// bootstrap node and find each other through the rendezvous on the swarm
// name in the private DHT.
func TestDHTDiscovery(t *testing.T) {
	dhtCfg := func(c *Config) {
		c.DHT = true
		c.SwarmName = "dht-test"
		c.RendezvousInterval = 200 * time.Millisecond
	}
	boot := newTestNode(t, dhtCfg)
	bootAddr := boot.Addrs()[0].String()
	withBoot := func(c *Config) { dhtCfg(c); c.Bootstrap = []string{bootAddr} }
	fb, chB := foundSet()
	fc, chC := foundSet()
	b := newTestNode(t, withBoot, WithPeerFound(fb))
	c := newTestNode(t, withBoot, WithPeerFound(fc))
	waitFound(t, chB, c.ID(), 30*time.Second)
	waitFound(t, chC, b.ID(), 30*time.Second)

	// Another swarm on the same bootstrap-less DHT prefix never meets them.
	if got := boot.dht.RoutingTable().Size(); got < 2 {
		t.Fatalf("bootstrap routing table has %d peers", got)
	}
	for _, p := range b.dht.Host().Mux().Protocols() {
		if p == "/ipfs/kad/1.0.0" {
			t.Fatal("node speaks the public IPFS DHT protocol")
		}
	}
}

// TestMDNSDiscovery runs two hosts in a network namespace of its own (so
// that no multicast reaches a real LAN) and checks that they find each
// other by mDNS. It re-executes the test binary inside a fresh namespace;
// without the privilege to create one it skips.
func TestMDNSDiscovery(t *testing.T) {
	if os.Getenv("STARLING_MDNS_NETNS") == "1" {
		mdnsInNamespace(t)
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a network namespace")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs the ip command (iproute2)")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestMDNSDiscovery$", "-test.v")
	cmd.Env = append(os.Environ(), "STARLING_MDNS_NETNS=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("in a new network namespace: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}

func mdnsInNamespace(t *testing.T) {
	if out, err := exec.Command("ip", "link", "set", "lo", "up", "multicast", "on").CombinedOutput(); err != nil {
		t.Fatalf("ip link: %v: %s", err, out)
	}
	mdnsCfg := func(c *Config) { c.MDNS = true; c.SwarmName = "mdns-test" }
	fa, chA := foundSet()
	fb, chB := foundSet()
	a := newTestNode(t, mdnsCfg, WithPeerFound(fa))
	b := newTestNode(t, mdnsCfg, WithPeerFound(fb))
	other := newTestNode(t, func(c *Config) { c.MDNS = true; c.SwarmName = "another-swarm" })
	waitFound(t, chA, b.ID(), 20*time.Second)
	waitFound(t, chB, a.ID(), 20*time.Second)
	for _, p := range a.Peers() {
		if p == other.ID() {
			t.Fatal("a node of another swarm was discovered")
		}
	}
}
