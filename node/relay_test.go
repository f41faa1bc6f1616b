package node

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
)

// withPrivate makes the node take itself for unreachable, as AutoNAT
// would behind a NAT.
func withPrivate() Option { return func(o *options) { o.private = true } }

// TestStaticRelay: a node that cannot be dialled (it takes itself for
// unreachable, and the other knows none of its direct addresses) books a
// slot on its --relay, advertises the relayed address, and a peer reaches
// it there over a limited connection that carries control traffic.
func TestStaticRelay(t *testing.T) {
	r := newTestNode(t, func(c *Config) { c.RelayService = true })
	var raddr string
	for _, a := range r.Addrs() {
		raddr = a.String() + "/p2p/" + r.ID().String()
		break
	}
	b := newTestNode(t, func(c *Config) { c.Relays = []string{raddr} }, withPrivate())
	a := newTestNode(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// The relayed address of b (autorelay advertises relayed addresses
	// on public relay addresses only, and r listens on loopback).
	circuit := ma.StringCast(raddr + "/p2p-circuit")
	var err error
	for {
		cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
		err = a.Host().Connect(cctx, peer.AddrInfo{ID: b.ID(), Addrs: []ma.Multiaddr{circuit}})
		ccancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("dialling b at %v: %v", circuit, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	conns := a.Host().Network().ConnsToPeer(b.ID())
	if len(conns) == 0 || !conns[0].Stat().Limited {
		t.Fatalf("%d connections to b, want a limited (relayed) one", len(conns))
	}
}

// TestAutoRelay: without --relay, an unreachable node books a slot on a
// connected peer that offers the relay service.
func TestAutoRelay(t *testing.T) {
	old := autoRelayInterval
	autoRelayInterval = 200 * time.Millisecond
	t.Cleanup(func() { autoRelayInterval = old })
	r := newTestNode(t, func(c *Config) { c.RelayService = true })
	raddr := r.Addrs()[0].String() + "/p2p/" + r.ID().String()
	b := newTestNode(t, func(c *Config) { c.AutoRelay = true }, withPrivate())
	connect(t, b, r)
	a := newTestNode(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	circuit := ma.StringCast(raddr + "/p2p-circuit")
	for {
		cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
		err := a.Host().Connect(cctx, peer.AddrInfo{ID: b.ID(), Addrs: []ma.Multiaddr{circuit}})
		ccancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("dialling b at %v: %v", circuit, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if conns := a.Host().Network().ConnsToPeer(b.ID()); len(conns) == 0 || !conns[0].Stat().Limited {
		t.Fatalf("%d connections to b, want a limited (relayed) one", len(conns))
	}
}

func TestBadRelayRefused(t *testing.T) {
	c := TestConfig()
	c.Relays = []string{"/ip4/127.0.0.1/tcp/1"}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "/p2p/ID") {
		t.Fatalf("Validate = %v, want a sentence about /p2p/ID", err)
	}
}
