package sim

import (
	"context"
	"testing"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/p2p/net/connmgr"
	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"

	"github.com/starling-ml/starling/node"
)

// TestSimHostsTrimConnections: a simulated host has a connection manager
// that sees its connections and trims them above the high watermark, as a
// real peer's does, and honours Protect. (Mocknet's hosts have none: a
// 256-client federation kept every connection any round opened.)
func TestSimHostsTrimConnections(t *testing.T) {
	mn := mocknet.New()
	t.Cleanup(func() { mn.Close() })
	cfg := node.TestConfig()
	cfg.ConnLow, cfg.ConnHigh, cfg.ConnGrace = 2, 4, 0
	hosts := make([]host.Host, 8)
	for i := range hosts {
		mh, err := mn.GenPeer()
		if err != nil {
			t.Fatal(err)
		}
		if hosts[i], err = withConnManager(mh, cfg); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { hosts[i].Close() })
	}
	if err := mn.LinkAll(); err != nil {
		t.Fatal(err)
	}
	h := hosts[0]
	h.ConnManager().Protect(hosts[1].ID(), "test")
	for _, o := range hosts[1:] {
		if _, err := mn.ConnectPeers(h.ID(), o.ID()); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(h.Network().Conns()); n != 7 {
		t.Fatalf("%d connections before trimming, want 7", n)
	}
	h.ConnManager().(*connmgr.BasicConnMgr).TrimOpenConns(context.Background())
	if n := len(h.Network().Conns()); n > cfg.ConnLow+1 {
		t.Fatalf("%d connections after trimming, want at most %d", n, cfg.ConnLow+1)
	}
	if len(h.Network().ConnsToPeer(hosts[1].ID())) == 0 {
		t.Fatal("the protected peer's connection was trimmed")
	}
}
