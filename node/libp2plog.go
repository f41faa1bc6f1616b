package node

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"

	logging "github.com/libp2p/go-libp2p/gologshim"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
)

// An inbound connection that fails libp2p's handshake (a wrong or missing
// swarm key: the bytes make no sense) is dropped inside the upgrader, which
// says so only in a debug record of its logger. libp2pHandler, installed as
// go-libp2p's default log handler (gologshim) by the first New, writes
// libp2p's records as libp2p itself would (text on stderr, levels from
// GOLOG_LOG_LEVEL) and hands that one record to the listening node, which
// logs a rate-limited warning naming the remote address and the likely
// cause. The handler is process-wide; nodes register while open.
var (
	installLibp2pLog sync.Once
	listeners        sync.Map // *Node → struct{}: nodes built by New, until Close
)

// handshakeRecord is the upgrader's message for a failed inbound upgrade.
const handshakeRecord = "accept upgrade error"

type libp2pHandler struct {
	system string
	level  slog.Level
	base   slog.Handler
}

func newLibp2pHandler() *libp2pHandler {
	return &libp2pHandler{level: logging.ConfigFromEnv().LevelForSystem(""), base: slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})}
}

func (h *libp2pHandler) Enabled(_ context.Context, l slog.Level) bool {
	return l >= h.level || h.system == "upgrader"
}

func (h *libp2pHandler) Handle(ctx context.Context, r slog.Record) error {
	if h.system == "upgrader" && r.Message == handshakeRecord {
		reportHandshake(r)
	}
	if r.Level < h.level {
		return nil
	}
	return h.base.Handle(ctx, r)
}

func (h *libp2pHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	c := *h
	for _, a := range attrs {
		if a.Key == "logger" {
			c.system = a.Value.String()
			c.level = logging.ConfigFromEnv().LevelForSystem(c.system)
		}
	}
	c.base = h.base.WithAttrs(attrs)
	return &c
}

func (h *libp2pHandler) WithGroup(name string) slog.Handler {
	c := *h
	c.base = h.base.WithGroup(name)
	return &c
}

// reportHandshake passes a failed inbound upgrade to the node listening on
// its local address.
func reportHandshake(r slog.Record) {
	var err error
	var local, remote string
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "err":
			err, _ = a.Value.Any().(error)
		case "local_multiaddr":
			local = fmt.Sprint(a.Value.Any())
		case "remote_multiaddr":
			remote = fmt.Sprint(a.Value.Any())
		}
		return true
	})
	reason := handshakeReason(err)
	if reason == "" {
		return
	}
	port := tcpPort(local)
	listeners.Range(func(k, _ any) bool {
		n := k.(*Node)
		for _, a := range n.host.Network().ListenAddresses() {
			if port != "" && tcpPort(a.String()) == port {
				n.ts.ref.warnAs("refused a connection", "from", remoteIP(remote), reason, "addr", remote, "err", err)
				return false
			}
		}
		return true
	})
}

// handshakeReason says in words why an inbound upgrade failed, or returns
// "" for failures logged elsewhere (the allowlist) or not worth a warning.
func handshakeReason(err error) string {
	if err == nil {
		return ""
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "gater rejected"):
		return "" // the allowlist logs its refusals
	case securityMismatch(err):
		return "other transport security (--insecure on one side only)"
	case strings.Contains(msg, "failed to negotiate security protocol"):
		return "handshake failed: wrong or missing swarm key (--psk), or --insecure on one side only"
	case strings.Contains(msg, "context deadline exceeded"):
		return "handshake did not complete in time: wrong or missing swarm key (--psk), or a stalled peer"
	}
	return "handshake failed"
}

// remoteIP returns the IP of a multiaddr string (the key its refusals
// are rate limited by: each connection comes from another port), or s.
func remoteIP(s string) string {
	a, err := ma.NewMultiaddr(s)
	if err != nil {
		return s
	}
	ip, err := manet.ToIP(a)
	if err != nil {
		return s
	}
	return ip.String()
}

// tcpPort returns the TCP port of a multiaddr string, or "".
func tcpPort(s string) string {
	a, err := ma.NewMultiaddr(s)
	if err != nil {
		return ""
	}
	na, err := manet.ToNetAddr(a)
	if err != nil {
		return ""
	}
	if t, ok := na.(*net.TCPAddr); ok {
		return fmt.Sprint(t.Port)
	}
	return ""
}
