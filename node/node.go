package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p"
	dht "github.com/libp2p/go-libp2p-kad-dht"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	logging "github.com/libp2p/go-libp2p/gologshim"
	"github.com/libp2p/go-libp2p/p2p/discovery/mdns"
	"github.com/libp2p/go-libp2p/p2p/host/autorelay"
	rcmgr "github.com/libp2p/go-libp2p/p2p/host/resource-manager"
	"github.com/libp2p/go-libp2p/p2p/net/connmgr"
	lswarm "github.com/libp2p/go-libp2p/p2p/net/swarm"
	"github.com/libp2p/go-libp2p/p2p/protocol/identify"
	"github.com/libp2p/go-libp2p/p2p/security/insecure"
	"github.com/libp2p/go-libp2p/p2p/security/noise"
	libp2ptls "github.com/libp2p/go-libp2p/p2p/security/tls"
	quic "github.com/libp2p/go-libp2p/p2p/transport/quic"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
	mss "github.com/multiformats/go-multistream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Node is one Starling peer: a libp2p host with the tensor service,
// discovery and metrics. Its methods are safe for concurrent use.
type Node struct {
	cfg     Config
	host    host.Host
	ownHost bool
	log     *slog.Logger
	reg     *prometheus.Registry
	m       *nodeMetrics
	ts      *tensors
	onPeer  func(peer.AddrInfo)

	dht     *dht.IpfsDHT
	mdns    mdns.Service
	metrics *http.Server
	metLn   net.Listener

	mu     sync.Mutex
	closed bool
	stop   context.CancelFunc // ends the background goroutines
	wg     sync.WaitGroup     // background goroutines
}

// Option sets an optional extra of a Node.
type Option func(*options)

type options struct {
	reg    *prometheus.Registry
	log    *slog.Logger
	onPeer func(peer.AddrInfo)
	hooks  *testHooks
	ref    *refusals // from log
	// private makes the node take itself for unreachable (tests of
	// relays on loopback, where AutoNAT has nobody to ask).
	private bool
}

// WithRegistry makes the node register its collectors (and libp2p's) in
// reg instead of a private registry of its own. Never the global default
// registry: two nodes in one process would collide there.
func WithRegistry(reg *prometheus.Registry) Option { return func(o *options) { o.reg = reg } }

// WithLogger sets the logger (default: slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// WithPeerFound registers f to be called with each peer that discovery
// (mDNS or the DHT rendezvous) finds, after the node has tried to connect
// to it. f runs on a discovery goroutine and must not block for long.
func WithPeerFound(f func(peer.AddrInfo)) Option { return func(o *options) { o.onPeer = f } }

func withTestHooks(h *testHooks) Option { return func(o *options) { o.hooks = h } }

func buildOptions(opts []Option) options {
	var o options
	for _, f := range opts {
		f(&o)
	}
	if o.reg == nil {
		o.reg = prometheus.NewRegistry()
	}
	if o.log == nil {
		o.log = slog.Default()
	}
	o.ref = newRefusals(o.log)
	return o
}

// New builds a libp2p host from cfg, starts the tensor service, discovery
// and (if cfg.MetricsAddr is set) the metrics endpoint. ctx bounds start-up
// only (bootstrap dials); Close stops the node.
func New(ctx context.Context, cfg Config, opts ...Option) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	o := buildOptions(opts)

	var sk crypto.PrivKey
	var err error
	if cfg.KeyFile != "" {
		sk, err = LoadOrCreateIdentity(cfg.KeyFile)
	} else {
		sk, _, err = crypto.GenerateEd25519Key(nil)
	}
	if err != nil {
		return nil, err
	}
	psk := cfg.PSK
	if psk == nil && cfg.PSKFile != "" {
		if psk, err = LoadPSK(cfg.PSKFile); err != nil {
			return nil, err
		}
	}
	self, err := peer.IDFromPrivateKey(sk)
	if err != nil {
		return nil, err
	}
	// Before the host exists, so that the upgrader's logger resolves to it.
	installLibp2pLog.Do(func() { logging.SetDefaultHandler(newLibp2pHandler()) })

	rcmgr.MustRegisterWith(o.reg)
	str, err := rcmgr.NewStatsTraceReporter()
	if err != nil {
		return nil, err
	}
	rm, err := rcmgr.NewResourceManager(rcmgr.NewFixedLimiter(resourceLimits(&cfg)), rcmgr.WithTraceReporter(str))
	if err != nil {
		return nil, err
	}
	cm, err := connmgr.NewConnManager(cfg.ConnLow, cfg.ConnHigh, connmgr.WithGracePeriod(cfg.ConnGrace))
	if err != nil {
		return nil, err
	}
	m, err := newNodeMetrics(o.reg)
	if err != nil {
		return nil, err
	}

	lopts := []libp2p.Option{
		libp2p.Identity(sk),
		libp2p.ListenAddrStrings(cfg.listenAddrs()...),
		libp2p.Transport(tcp.NewTCPTransport),
		libp2p.ResourceManager(rm),
		libp2p.ConnectionManager(cm),
		libp2p.PrometheusRegisterer(o.reg),
		libp2p.BandwidthReporter(m.bw),
		libp2p.UserAgent("starling"),
	}
	lopts = append(lopts, muxers(&cfg)...)
	if cfg.Insecure {
		lopts = append(lopts, libp2p.NoSecurity)
	} else {
		lopts = append(lopts, libp2p.Security(string(recordsID), newRecordsTLS),
			libp2p.Security(libp2ptls.ID, newGatheredTLS), libp2p.Security(noise.ID, noise.New))
	}
	switch {
	case psk != nil:
		lopts = append(lopts, libp2p.PrivateNetwork(psk))
	case !cfg.Insecure: // QUIC always encrypts
		lopts = append(lopts, libp2p.Transport(quic.NewTransport))
	}
	if len(cfg.Allowlist) > 0 {
		lopts = append(lopts, libp2p.ConnectionGater(newAllowlist(self, cfg.Allowlist, o.ref)))
	}
	if cfg.NATPortMap {
		lopts = append(lopts, libp2p.NATPortMap())
	}
	if cfg.HolePunching {
		lopts = append(lopts, libp2p.EnableHolePunching())
	}
	if cfg.NATService {
		lopts = append(lopts, libp2p.EnableNATService(), libp2p.EnableAutoNATv2())
	}
	if cfg.RelayService {
		// The relay service starts only on a node that believes itself
		// publicly reachable; a node configured as a relay is.
		lopts = append(lopts, libp2p.EnableRelayService(), libp2p.ForceReachabilityPublic())
	}
	// Relays for a node behind a NAT: the static ones, else the connected
	// peers that offer the relay service.
	var hostRef atomic.Pointer[host.Host]
	if relays, _ := relayInfos(cfg.Relays); len(relays) > 0 {
		lopts = append(lopts, libp2p.EnableAutoRelayWithStaticRelays(relays))
		if !cfg.RelayService && !o.private {
			// A static relay says this node is behind a NAT: book the
			// slot at once. Autorelay waits for AutoNAT's verdict
			// otherwise, which came too late or never behind a
			// masquerading router (TestNATHolePunch's bed: no
			// reservation within a 20 s run). Direct addresses stay
			// advertised.
			lopts = append(lopts, libp2p.ForceReachabilityPrivate())
		}
	} else if cfg.AutoRelay {
		lopts = append(lopts, libp2p.EnableAutoRelayWithPeerSource(func(ctx context.Context, num int) <-chan peer.AddrInfo {
			return relayCandidates(hostRef.Load(), num)
		}, autorelay.WithMinCandidates(1), autorelay.WithMinInterval(autoRelayInterval)))
	}
	if o.private {
		lopts = append(lopts, libp2p.ForceReachabilityPrivate())
	}
	h, err := libp2p.New(lopts...)
	if err == nil {
		hostRef.Store(&h)
	}
	if err != nil {
		rm.Close()
		return nil, fmt.Errorf("node: building libp2p host: %w", err)
	}
	n := newNode(h, cfg, o, m)
	n.ownHost = true
	listeners.Store(n, struct{}{})
	if err := n.start(ctx); err != nil {
		n.Close()
		return nil, err
	}
	return n, nil
}

// Attach runs the tensor service on an existing host — a mocknet host in
// tests, or the simulator's — with no discovery, metrics endpoint or host
// ownership: Close stops the service and leaves h open. cfg's host fields
// (keys, listen addresses, PSK, discovery) are ignored.
func Attach(h host.Host, cfg Config, opts ...Option) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	o := buildOptions(opts)
	m, err := newNodeMetrics(o.reg)
	if err != nil {
		return nil, err
	}
	return newNode(h, cfg, o, m), nil
}

func newNode(h host.Host, cfg Config, o options, m *nodeMetrics) *Node {
	n := &Node{cfg: cfg, host: h, log: o.log, reg: o.reg, m: m, onPeer: o.onPeer}
	n.ts = newTensors(h, &n.cfg, m, o.ref, o.hooks)
	n.stop = func() {}
	return n
}

// start brings up the metrics endpoint and discovery.
func (n *Node) start(ctx context.Context) error {
	if n.cfg.MetricsAddr != "" {
		ln, err := net.Listen("tcp", n.cfg.MetricsAddr)
		if err != nil {
			return fmt.Errorf("node: metrics endpoint: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(n.reg, promhttp.HandlerOpts{}))
		n.metLn = ln
		n.metrics = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		srv := n.metrics
		n.wg.Go(func() { srv.Serve(ln) })
	}
	bg, stop := context.WithCancel(context.Background())
	n.stop = stop
	return n.startDiscovery(ctx, bg)
}

// Host returns the underlying libp2p host (for GossipSub and the like).
func (n *Node) Host() host.Host { return n.host }

// ID returns this node's peer ID.
func (n *Node) ID() peer.ID { return n.host.ID() }

// Registry returns the Prometheus registry holding this node's metrics.
func (n *Node) Registry() *prometheus.Registry { return n.reg }

// MetricsAddr returns the address the metrics endpoint listens on, or "".
func (n *Node) MetricsAddr() string {
	if n.metLn == nil {
		return ""
	}
	return n.metLn.Addr().String()
}

// Addrs returns this node's listen addresses with its /p2p/ID appended,
// ready to hand to another node's Connect or Bootstrap.
func (n *Node) Addrs() []ma.Multiaddr {
	addrs, _ := peer.AddrInfoToP2pAddrs(&peer.AddrInfo{ID: n.host.ID(), Addrs: n.host.Addrs()})
	return addrs
}

// AddrInfo returns this node's ID and listen addresses.
func (n *Node) AddrInfo() peer.AddrInfo {
	return peer.AddrInfo{ID: n.host.ID(), Addrs: n.host.Addrs()}
}

// Connect dials p (a no-op if already connected). A peer that fails the
// PSK handshake or the allowlist gets an error and no connection. A
// handshake that fails on garbled bytes is reported as ErrSwarmKey in one
// sentence (libp2p's own words, such as "message did not have trailing
// newline", stay in the error chain); one that stalls on an address that
// accepts TCP connections says so.
//
// Two peers that dial each other at the same moment over TCP can meet in
// one connection that both opened (a TCP simultaneous open: each dials
// from its listening port), where both act as the handshake's initiator
// and it fails on both ends. Connect then dials again, up to simOpenTries
// times in all: the peer with the lower ID at once, the other after
// simOpenWait, by when it usually finds the first one's connection.
func (n *Node) Connect(ctx context.Context, p peer.AddrInfo) error {
	if err := n.live(); err != nil {
		return err
	}
	simOpen := func(err error) bool {
		if !errors.Is(err, errSimultaneousOpen) {
			return false
		}
		n.log.Debug("TCP simultaneous open; dialling again", "peer", p.ID)
		return true
	}
	return redialSimOpen(ctx, n.host.ID(), p.ID, simOpen, func(ctx context.Context) error { return n.connectOnce(ctx, p) })
}

// redialSimOpen calls dial, and again after each failure that simOpen
// says was a TCP simultaneous open, up to simOpenTries calls in all,
// waiting simOpenDelay before each; it returns the last call's error.
// Every call after the first skips libp2p's dial backoff, which the
// failed dial set.
func redialSimOpen(ctx context.Context, self, remote peer.ID, simOpen func(error) bool, dial func(context.Context) error) error {
	for try := 1; ; try++ {
		err := dial(ctx)
		if err == nil || try == simOpenTries || !simOpen(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(simOpenDelay(self, remote, try)):
		}
		ctx = network.WithForceDirectDial(ctx, "dial again after a TCP simultaneous open")
	}
}

// Dialling again after a TCP simultaneous open (see Connect).
const (
	simOpenTries = 4
	simOpenWait  = 200 * time.Millisecond
)

// errSimultaneousOpen marks a dial that failed in a TCP simultaneous open.
var errSimultaneousOpen = errors.New("node: the connection failed as a TCP simultaneous open does (the peer dialling this one at the same moment)")

// simOpenDelay is how long self waits before dialling remote again after
// its try-th simultaneous open: the lower peer ID not at all, the higher
// one try × simOpenWait, so that their dials do not meet again.
func simOpenDelay(self, remote peer.ID, try int) time.Duration {
	if self < remote {
		return 0
	}
	return time.Duration(try) * simOpenWait
}

// simultaneousOpen reports whether a dial failed the way a TCP
// simultaneous open makes TLS fail: each end sent a ClientHello and got
// the other's instead of a ServerHello.
func simultaneousOpen(err error) bool {
	return strings.Contains(err.Error(), "received unexpected handshake message of type *tls.clientHelloMsg")
}

// connectOnce is one dial of Connect.
func (n *Node) connectOnce(ctx context.Context, p peer.AddrInfo) error {
	err := n.host.Connect(ctx, p)
	switch {
	case err == nil:
		return n.admitted(ctx, p.ID)
	case simultaneousOpen(err):
		return fmt.Errorf("%w: %w", errSimultaneousOpen, err)
	case errors.Is(err, lswarm.ErrGaterDisallowedConnection):
		return fmt.Errorf("%w: %s is not on this peer's --allow list", ErrNotAllowed, p.ID)
	case securityMismatch(err):
		return fmt.Errorf("%w: %w", ErrSecurityMismatch, err)
	case strings.Contains(err.Error(), "failed to negotiate security protocol"):
		return &handshakeError{peer: p.ID, cause: err}
	case ctx.Err() != nil && tcpAnswers(p.Addrs):
		return fmt.Errorf("%s accepts TCP connections but the libp2p handshake did not complete in time: a wrong or missing swarm key (--psk), or a stopped peer: %w", p.ID, err)
	}
	return err
}

// admitted checks, after a dial that succeeded, that p kept the
// connection: a peer whose --allow list does not name this one closes it
// right after the security handshake, which libp2p's dialler takes for
// success. It waits for identify on p's connections (which the closing
// peer never answers), at most a second, and reports ErrNotAllowed if no
// connection is left (errSimultaneousOpen with Insecure).
func (n *Node) admitted(ctx context.Context, p peer.ID) error {
	ids, ok := n.host.(interface{ IDService() identify.IDService })
	if ok {
		wctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		for _, c := range n.host.Network().ConnsToPeer(p) {
			select {
			case <-ids.IDService().IdentifyWait(c):
			case <-wctx.Done():
			}
		}
	}
	// Connectedness skips connections being closed; ConnsToPeer does not.
	if c := n.host.Network().Connectedness(p); c == network.Connected || c == network.Limited {
		return nil
	}
	if n.cfg.Insecure {
		// An Insecure peer has no allowlist (Config.Validate), and
		// without TLS a simultaneous open gets through the handshake,
		// both ends as initiator, and fails in the muxer.
		return fmt.Errorf("%w: %s closed the connection right after the handshake", errSimultaneousOpen, p)
	}
	return fmt.Errorf("%w: %s closed the connection right after the handshake, before identify: its --allow list most likely does not name this peer (%s)", ErrNotAllowed, p, n.host.ID())
}

// handshakeError is ErrSwarmKey for one peer, with libp2p's error behind.
type handshakeError struct {
	peer  peer.ID
	cause error
}

func (e *handshakeError) Error() string {
	return fmt.Sprintf("%v (peer %s)", ErrSwarmKey, e.peer)
}

func (e *handshakeError) Unwrap() []error { return []error{ErrSwarmKey, e.cause} }

// tcpAnswers reports whether one of addrs (TCP ones only) accepts a TCP
// connection within a second: then a dial that timed out was stuck in the
// handshake, not on the way.
func tcpAnswers(addrs []ma.Multiaddr) bool {
	for _, a := range addrs {
		if _, err := a.ValueForProtocol(ma.P_TCP); err != nil {
			continue
		}
		na, err := manet.ToNetAddr(a)
		if err != nil {
			continue
		}
		c, err := net.DialTimeout("tcp", na.String(), time.Second)
		if err == nil {
			c.Close()
			return true
		}
	}
	return false
}

// ConnectRetry dials p every 200 ms until it answers or ctx ends: a peer
// started at the same moment may not listen yet. A peer with other
// transport security (ErrSecurityMismatch) or swarm key (ErrSwarmKey) is
// not retried. A failed dial
// puts the address in libp2p's dial backoff and the retries then fail
// with "dial backoff" alone, so on failure ConnectRetry returns the last
// error that was not a backoff.
func (n *Node) ConnectRetry(ctx context.Context, p peer.AddrInfo) error {
	var cause error
	for {
		err := n.Connect(ctx, p)
		if err == nil || errors.Is(err, ErrSecurityMismatch) || errors.Is(err, ErrSwarmKey) || errors.Is(err, ErrClosed) {
			return err
		}
		if cause == nil || !errors.Is(err, lswarm.ErrDialBackoff) {
			cause = err
		}
		select {
		case <-ctx.Done():
			return cause
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// securityMismatch reports whether a dial failed because the peer refused
// every security protocol we offered (libp2p's plaintext, or TLS and Noise).
func securityMismatch(err error) bool {
	var ns mss.ErrNotSupported[protocol.ID]
	if !errors.As(err, &ns) {
		return false
	}
	for _, p := range ns.Protos {
		if p == insecure.ID || p == recordsID || p == libp2ptls.ID || p == noise.ID {
			return true
		}
	}
	return false
}

// Peers returns the peers this node is connected to.
func (n *Node) Peers() []peer.ID { return n.host.Network().Peers() }

// Protect keeps the connection manager from trimming p's connections until
// Unprotect(p, tag). Tags nest: p stays protected while any tag is held.
// Protect the partners of the current round; tensor transfers protect their
// peer by themselves while they run.
func (n *Node) Protect(p peer.ID, tag string) { n.host.ConnManager().Protect(p, tag) }

// Unprotect drops tag from p and reports whether p is still protected.
func (n *Node) Unprotect(p peer.ID, tag string) bool {
	return n.host.ConnManager().Unprotect(p, tag)
}

// Send transmits t to p on /starling/tensor, striped over up to
// Config.Stripes streams drawn from a per-peer pool of reused streams.
// It returns once every byte is written to the transport (delivery is
// confirmed by the protocol above, e.g. the all-reduce's reply) or with
// the first error; cancelling ctx resets the streams, so the receiver's
// Recv fails promptly too. t.Payload is not retained. Send never uses a
// limited (relayed) connection: it fails with ErrLimitedConn instead.
func (n *Node) Send(ctx context.Context, p peer.ID, t Tensor) error {
	pool, err := n.ts.poolFor(p)
	if err != nil {
		return err
	}
	return n.ts.send(ctx, pool, &t)
}

// OpenStream opens a stream to p on h, waiting no longer than ctx even
// when h's dial ignores it: mocknet's does (its DialPeer takes no
// context), and with hundreds of simulated peers dialling each other its
// dials queue on its locks and event bus for minutes. A dial given up on
// finishes on its own goroutine, and the stream it brings is reset. A
// dial that fails in a TCP simultaneous open with TLS is made again, as
// Connect does.
func OpenStream(ctx context.Context, h host.Host, p peer.ID, pids ...protocol.ID) (network.Stream, error) {
	type opened struct {
		s   network.Stream
		err error
	}
	ch := make(chan opened) // unbuffered: a stream is handed over or reset, never both
	go func() {
		var s network.Stream
		err := redialSimOpen(ctx, h.ID(), p, simultaneousOpen, func(ctx context.Context) (err error) {
			s, err = h.NewStream(ctx, p, pids...)
			return err
		})
		select {
		case ch <- opened{s, err}:
		case <-ctx.Done():
			if s != nil {
				s.Reset()
			}
		}
	}()
	select {
	case o := <-ch:
		return o.s, o.err
	case <-ctx.Done():
		return nil, fmt.Errorf("node: opening a stream to %s: %w", p, ctx.Err())
	}
}

// Recv returns the tensor with tag from peer from (from any peer if from
// is "": the first such tensor to arrive whole), waiting until it arrives, ctx ends, or — if ctx has no deadline —
// Config.RecvTimeout passes. The payload goes into dst as it arrives when
// Recv is waiting before the tensor does, or is copied into it from the
// parked buffer otherwise; the returned Payload aliases dst. With a nil
// dst, Recv allocates (or hands over the parked buffer). A dst shorter
// than the payload fails with ErrShortBuffer and the tensor is drained.
// When Recv returns, nothing writes to dst any more; if it gave up while
// its tensor arrived, the rest of the tensor is drained (the stream stays
// up for the frames behind it). One Recv at a time per (from, tag).
func (n *Node) Recv(ctx context.Context, from peer.ID, tag Tag, dst []byte) (Tensor, error) {
	return n.ts.recv(ctx, from, tag, dst, nil)
}

// Axpy is what RecvAxpy adds to a received float32 tensor: Alpha·X.
type Axpy struct {
	Alpha float32
	X     []float32
}

// RecvAxpy is Recv from a peer into dst (not nil) of a raw float32 tensor
// that node may combine with ax as it arrives: dst = ax.Alpha·ax.X +
// received, value by value (device.AxpyTo, which is device.AxpyFinite's
// kernel), saving a copy and a pass over dst. The returned Tensor's Summed
// says whether it did; then SumFinite reports whether every sum is finite
// and Finite (always checked then) whether every received value was.
// Otherwise dst holds the received tensor, as after Recv. len(ax.X) must
// be len(dst)/4.
func (n *Node) RecvAxpy(ctx context.Context, from peer.ID, tag Tag, dst []byte, ax Axpy) (Tensor, error) {
	if from == "" || dst == nil || 4*len(ax.X) != len(dst) {
		return Tensor{}, errors.New("node: RecvAxpy needs a peer, a buffer and 4 bytes of it per value of X")
	}
	return n.ts.recv(ctx, from, tag, dst, &ax)
}

// SetMayPark decides which peers are members, whose tensors may be parked
// (held in a buffer of the node's until the Recv that claims them is
// posted; see the package doc) up to MaxParkedPerPeer each. The peers f
// refuses, strangers, share MaxStrangerParked; past it, a stranger's
// tensor waits for a Recv (back-pressure, up to IOTimeout) with nothing
// allocated for it, and a Recv from any peer with no buffer does not take
// it. So strangers' announcements cost the node at most MaxStrangerParked
// in all, however large the tensors they announce. f runs on
// stream-handler goroutines: it must be safe for concurrent use, must not
// block and must not call the Node. A nil f (the default) admits every
// peer.
func (n *Node) SetMayPark(f func(from peer.ID) bool) {
	if f == nil {
		n.ts.mayPark.Store(nil)
		return
	}
	n.ts.mayPark.Store(&f)
}

// ParkedBytes returns the bytes held now in parked buffers (tensors that
// arrived before their Recv), all senders together.
func (n *Node) ParkedBytes() int64 {
	n.ts.mu.Lock()
	defer n.ts.mu.Unlock()
	return n.ts.parked
}

// AddAdmit installs f as an admission hook and returns a function that
// removes it. The stream handler calls every hook with each arriving
// tensor's sender and metadata (Tag, Codec, DType, Shape, Version, Step;
// no payload) after the header is validated and before any payload byte
// is read or buffer allocated. A tensor any hook refuses (a non-nil error)
// is read to its end and dropped, never parked nor handed to a Recv, and
// counted in starling_node_frames_rejected_total{reason="refused"}; the
// stream stays usable for the frames behind it. Hooks run on stream-handler
// goroutines, concurrently: they must be safe for concurrent use, must not
// block, and should pass tensors that are not theirs to judge (several
// protocols share the node). A striped tensor is judged once per stripe;
// decide alike for all.
func (n *Node) AddAdmit(f func(from peer.ID, t *Tensor) error) (remove func()) {
	h := &admitHook{f: f}
	n.ts.mu.Lock()
	n.ts.admit = append(slices.Clone(n.ts.admit), h)
	n.ts.mu.Unlock()
	return func() {
		n.ts.mu.Lock()
		n.ts.admit = slices.DeleteFunc(slices.Clone(n.ts.admit), func(o *admitHook) bool { return o == h })
		n.ts.mu.Unlock()
	}
}

type admitHook struct {
	f func(from peer.ID, t *Tensor) error
}

// Link is a long-lived tensor channel to one peer: its own pool of open
// streams and a connection-manager protection held until Close. Fixed
// pairs that exchange many chunks (all-reduce neighbours) use a Link so
// that frames go back to back on warm streams. Safe for concurrent use;
// concurrent Sends go out on different streams.
type Link struct {
	n    *Node
	p    peer.ID
	pool *streamPool
	tag  string
}

// Link opens streams streams to p (at least 1) and protects p until the
// Link is closed. Sends on the Link stripe over at most streams streams.
func (n *Node) Link(ctx context.Context, p peer.ID, streams int) (*Link, error) {
	if err := n.live(); err != nil {
		return nil, err
	}
	streams = max(streams, 1)
	pool := &streamPool{ts: n.ts, p: p, maxIdle: streams, maxStripes: streams}
	opened := make([]*idleStream, 0, streams)
	for range streams {
		s, _, err := pool.get(ctx)
		if err != nil {
			for _, is := range opened {
				is.s.Reset()
			}
			return nil, fmt.Errorf("node: link to %s: %w", p, err)
		}
		opened = append(opened, &idleStream{s: s})
	}
	for _, is := range opened {
		pool.put(is.s)
	}
	l := &Link{n: n, p: p, pool: pool, tag: fmt.Sprintf("starling-link-%p", pool)}
	n.ts.mu.Lock()
	n.ts.links[pool] = struct{}{}
	n.ts.mu.Unlock()
	n.Protect(p, l.tag)
	return l, nil
}

// Peer returns the remote peer.
func (l *Link) Peer() peer.ID { return l.p }

// Send is Node.Send on the Link's streams.
func (l *Link) Send(ctx context.Context, t Tensor) error { return l.n.ts.send(ctx, l.pool, &t) }

// Recv is Node.Recv from the Link's peer.
func (l *Link) Recv(ctx context.Context, tag Tag, dst []byte) (Tensor, error) {
	return l.n.ts.recv(ctx, l.p, tag, dst, nil)
}

// Close closes the Link's streams and drops its protection.
func (l *Link) Close() error {
	l.pool.close()
	l.n.ts.mu.Lock()
	delete(l.n.ts.links, l.pool)
	l.n.ts.mu.Unlock()
	l.n.Unprotect(l.p, l.tag)
	return nil
}

func (n *Node) live() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return ErrClosed
	}
	return nil
}

// goTracked runs f on a goroutine that Close waits for; it does nothing
// once the node is closing.
func (n *Node) goTracked(f func()) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return
	}
	n.wg.Go(f)
}

// Close stops discovery, fails pending Recvs with ErrClosed, resets open
// tensor streams, shuts the metrics endpoint, closes the host (if New made
// it) and waits for every goroutine the node started.
func (n *Node) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	n.mu.Unlock()
	listeners.Delete(n)

	n.stop()
	var errs []error
	if n.mdns != nil {
		errs = append(errs, n.mdns.Close())
	}
	n.ts.close()
	if n.dht != nil {
		errs = append(errs, n.dht.Close())
	}
	if n.metrics != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		errs = append(errs, n.metrics.Shutdown(ctx))
		cancel()
	}
	if n.ownHost {
		errs = append(errs, n.host.Close())
	}
	n.wg.Wait()
	return errors.Join(errs...)
}

// autoRelayInterval is how often an unreachable node looks again among
// its connected peers for relays (a variable for tests).
var autoRelayInterval = 10 * time.Second

// hopProto is circuit v2's relay (hop) protocol, which a relay offers.
const hopProto = "/libp2p/circuit/relay/0.2.0/hop"

// relayCandidates returns up to num of the peers h is connected to that
// offer the relay service, on a closed channel.
func relayCandidates(hp *host.Host, num int) <-chan peer.AddrInfo {
	ch := make(chan peer.AddrInfo, max(num, 0))
	defer close(ch)
	if hp == nil {
		return ch
	}
	h := *hp
	for _, p := range h.Network().Peers() {
		if len(ch) >= num {
			break
		}
		if ok, err := h.Peerstore().SupportsProtocols(p, hopProto); err != nil || len(ok) == 0 {
			continue
		}
		ch <- peer.AddrInfo{ID: p, Addrs: h.Peerstore().Addrs(p)}
	}
	return ch
}
