package gossip

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/starling-ml/starling/gossip/wire"
	"github.com/starling-ml/starling/peerid"
)

// Clock tells the time. The control plane reads it for heartbeat arrival
// times, membership expiry and its first sequence number; tests inject a
// fake one.
type Clock interface{ Now() time.Time }

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// Config configures a ControlPlane. All peers of one swarm must agree on
// Namespace, Model and MaxMessageSize.
type Config struct {
	// Namespace names the swarm: topics are /starling/<Namespace>/members/1
	// and /starling/<Namespace>/deltas/1. No '/' allowed.
	Namespace string
	// Model is the model id this peer trains; messages for another model are
	// dropped (DropModel). At most MaxModelIDLen bytes.
	Model string
	// HeartbeatInterval is the period of automatic heartbeats, and of
	// membership expiry. 1 s: membership changes show within a couple of
	// seconds at ~100 bytes/s per peer. 0 disables the loop: the caller
	// calls Beat and Expire itself (simulations with virtual time).
	HeartbeatInterval time.Duration
	// PeerTTL is how long a peer stays live without a heartbeat. 5 s
	// tolerates four lost heartbeats at the default interval.
	PeerTTL time.Duration
	// MaxMessageSize caps an encoded control message in bytes; larger ones
	// are dropped (DropOversized). 4 KiB holds a heartbeat with 16 long
	// addresses; GossipSub's own cap (1 MiB) stays untouched.
	MaxMessageSize int
	// AnnounceQueue is how many received announcements wait for Next before
	// the oldest is dropped (DropOverflow). 256 covers a burst from 256 peers.
	AnnounceQueue int
	// ReplayRetention is how long a silent sender's replay state is kept.
	// 10 min outlasts GossipSub's 2 min seen-message cache, so a replay the
	// cache has forgotten is still caught.
	ReplayRetention time.Duration
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{
		Namespace:         "default",
		Model:             "default",
		HeartbeatInterval: time.Second,
		PeerTTL:           5 * time.Second,
		MaxMessageSize:    4 << 10,
		AnnounceQueue:     256,
		ReplayRetention:   10 * time.Minute,
	}
}

// Validate reports whether c is usable. It does not modify c.
func (c Config) Validate() error {
	switch {
	case c.Namespace == "" || strings.ContainsRune(c.Namespace, '/'):
		return fmt.Errorf("%w: namespace %q must be non-empty without '/'", ErrBadConfig, c.Namespace)
	case c.Model == "" || len(c.Model) > wire.MaxModelIDLen:
		return fmt.Errorf("%w: model id %q must have 1..%d bytes", ErrBadConfig, c.Model, wire.MaxModelIDLen)
	case c.HeartbeatInterval < 0:
		return fmt.Errorf("%w: heartbeat interval %v < 0", ErrBadConfig, c.HeartbeatInterval)
	case c.PeerTTL <= c.HeartbeatInterval:
		return fmt.Errorf("%w: peer TTL %v must exceed the heartbeat interval %v", ErrBadConfig, c.PeerTTL, c.HeartbeatInterval)
	case c.MaxMessageSize < 256 || c.MaxMessageSize > 64<<10:
		return fmt.Errorf("%w: max message size %d not in [256, 65536]", ErrBadConfig, c.MaxMessageSize)
	case c.AnnounceQueue < 1:
		return fmt.Errorf("%w: announce queue %d < 1", ErrBadConfig, c.AnnounceQueue)
	case c.ReplayRetention < c.PeerTTL:
		return fmt.Errorf("%w: replay retention %v shorter than peer TTL %v", ErrBadConfig, c.ReplayRetention, c.PeerTTL)
	}
	return nil
}

// Option sets an extra of New.
type Option func(*options)

type options struct {
	clock  Clock
	log    *slog.Logger
	psOpts []pubsub.Option
	status *wire.Status
}

// WithStatus sets the status the first heartbeats carry, before any
// SetStatus (default: the zero status). A federated peer says there that
// it has not joined any round yet.
func WithStatus(st wire.Status) Option { return func(o *options) { o.status = &st } }

// WithClock injects the clock (default: the wall clock).
func WithClock(c Clock) Option { return func(o *options) { o.clock = c } }

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// WithPubSubOptions adds GossipSub options (router parameters, scoring).
// Signing is always strict and cannot be overridden.
func WithPubSubOptions(opts ...pubsub.Option) Option {
	return func(o *options) { o.psOpts = append(o.psOpts, opts...) }
}

// ControlPlane runs the GossipSub control plane of one peer: it publishes
// heartbeats and delta announcements, validates what arrives, keeps the
// membership view and queues announcements for the caller. Its methods are
// safe for concurrent use. It owns a reader goroutine per topic and, when
// HeartbeatInterval > 0, a heartbeat goroutine; Close stops and waits for
// them.
type ControlPlane struct {
	cfg   Config
	h     host.Host
	self  peerid.ID // h's ID as messages name it
	clock Clock
	log   *slog.Logger

	ps                *pubsub.PubSub
	hbTopic, annTopic *pubsub.Topic
	hbSub, annSub     *pubsub.Subscription
	hbName, annName   string
	cancel            context.CancelFunc
	wg                sync.WaitGroup
	closeOnce         sync.Once
	done              chan struct{}
	seq               atomic.Uint64
	status            atomic.Pointer[wire.Status]
	ann               chan *wire.Announcement
	stats             counters

	mu         sync.Mutex    // guards members, hbReplay, annReplay, changed
	changed    chan struct{} // closed and replaced when a heartbeat is applied
	members    *Membership
	hbReplay   *replayGuard
	annReplay  *replayGuard
	lastExpire time.Time

	// warnedVersion is set once a peer on another wire version was logged.
	warnedVersion atomic.Bool

	notify *network.NotifyBundle
}

// DisconnectGrace is how long after its last connection to this peer
// closed a member is forgotten, unless it reconnected meanwhile. A killed
// process is so out of the view within moments instead of PeerTTL, and
// when it restarts under the same identity the others know it only by its
// new heartbeats (a restarted federated peer says there that it has not
// joined yet), never by the status its previous life last sent.
const DisconnectGrace = 500 * time.Millisecond

// New starts a GossipSub router on h with strict message signing, joins the
// swarm's two topics with their validators and, if configured, starts
// heartbeats. h may be a real host or a mocknet one. The router is this
// control plane's; other packages may join further topics on it through
// PubSub.
// validateQueue, outboundQueue and subBuffer size pubsub's validation
// queue, each peer's outbound queue and our subscriptions' buffers (32
// each by default; see New).
const (
	validateQueue = 4096
	outboundQueue = 1024
	subBuffer     = 1024
)

func New(h host.Host, cfg Config, opts ...Option) (*ControlPlane, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	o := options{clock: realClock{}, log: slog.New(slog.DiscardHandler)}
	for _, opt := range opts {
		opt(&o)
	}
	c := &ControlPlane{
		cfg:       cfg,
		h:         h,
		self:      idOf(h.ID()),
		clock:     o.clock,
		log:       o.log,
		hbName:    "/starling/" + cfg.Namespace + "/members/1",
		annName:   "/starling/" + cfg.Namespace + "/deltas/1",
		done:      make(chan struct{}),
		ann:       make(chan *wire.Announcement, cfg.AnnounceQueue),
		members:   NewMembership(cfg.PeerTTL),
		changed:   make(chan struct{}),
		hbReplay:  newReplayGuard(),
		annReplay: newReplayGuard(),
	}
	// Start sequence numbers at the clock's nanoseconds so that a restarted
	// peer does not reuse numbers its old incarnation published.
	start := c.clock.Now().UnixNano()
	if start < 1 {
		start = 1
	}
	c.seq.Store(uint64(start))
	if o.status != nil {
		c.SetStatus(*o.status)
	}

	// The router lives until Close; its context is not a caller's.
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	// Flood-publish our own messages to every topic peer, not only the
	// mesh: control messages are small, and GossipSub (v0.19 defaults to
	// mesh-only) would otherwise silently drop what is published before
	// the first mesh heartbeat. Callers may override it.
	//
	// pubsub's queues hold 32 messages by default: the validation queue
	// (signatures are checked by runtime.NumCPU() workers) and each peer's
	// outbound queue. Heartbeats of a swarm whose peers start or beat
	// together overflow them on a busy machine, and what overflows is lost
	// unless another peer happens to forward a copy. Control messages are
	// small: room for many more costs little.
	psOpts := append([]pubsub.Option{
		pubsub.WithFloodPublish(true),
		pubsub.WithValidateQueueSize(validateQueue),
		pubsub.WithPeerOutboundQueueSize(outboundQueue),
	}, o.psOpts...)
	psOpts = append(psOpts,
		pubsub.WithMessageSignaturePolicy(pubsub.StrictSign),
		pubsub.WithRawTracer(&dropTracer{c: c}),
	)
	ps, err := pubsub.NewGossipSub(ctx, h, psOpts...)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("gossip: start GossipSub: %w", err)
	}
	c.ps = ps
	if err := c.join(); err != nil {
		cancel()
		return nil, err
	}
	c.notify = &network.NotifyBundle{
		DisconnectedF: func(nw network.Network, conn network.Conn) {
			p := conn.RemotePeer()
			if nw.Connectedness(p) == network.Connected {
				return
			}
			time.AfterFunc(DisconnectGrace, func() {
				if ctx.Err() != nil || nw.Connectedness(p) == network.Connected {
					return
				}
				c.forget(idOf(p))
			})
		},
	}
	h.Network().Notify(c.notify)
	c.wg.Add(3)
	go c.readHeartbeats(ctx)
	go c.readAnnouncements(ctx)
	go c.repairLoop(ctx)
	if cfg.HeartbeatInterval > 0 {
		c.wg.Add(1)
		go c.heartbeatLoop(ctx)
	}
	return c, nil
}

func (c *ControlPlane) join() error {
	if err := c.ps.RegisterTopicValidator(c.hbName, c.validateHeartbeat); err != nil {
		return fmt.Errorf("gossip: heartbeat validator: %w", err)
	}
	if err := c.ps.RegisterTopicValidator(c.annName, c.validateAnnouncement); err != nil {
		return fmt.Errorf("gossip: announcement validator: %w", err)
	}
	var err error
	if c.hbTopic, err = c.ps.Join(c.hbName); err != nil {
		return fmt.Errorf("gossip: join %s: %w", c.hbName, err)
	}
	if c.annTopic, err = c.ps.Join(c.annName); err != nil {
		return fmt.Errorf("gossip: join %s: %w", c.annName, err)
	}
	if c.hbSub, err = c.hbTopic.Subscribe(pubsub.WithBufferSize(subBuffer)); err != nil {
		return fmt.Errorf("gossip: subscribe %s: %w", c.hbName, err)
	}
	if c.annSub, err = c.annTopic.Subscribe(pubsub.WithBufferSize(subBuffer)); err != nil {
		return fmt.Errorf("gossip: subscribe %s: %w", c.annName, err)
	}
	return nil
}

// Close stops the heartbeats and readers, leaves the topics and stops the
// router. It waits for the goroutines it owns and is idempotent.
func (c *ControlPlane) Close() error {
	c.closeOnce.Do(func() {
		c.h.Network().StopNotify(c.notify)
		close(c.done)
		c.hbSub.Cancel()
		c.annSub.Cancel()
		c.cancel()
		c.wg.Wait()
		_ = c.hbTopic.Close()
		_ = c.annTopic.Close()
	})
	return nil
}

// PubSub returns the router, for joining other topics on the same host.
func (c *ControlPlane) PubSub() *pubsub.PubSub { return c.ps }

// Topics returns the names of the heartbeat and announcement topics.
func (c *ControlPlane) Topics() (heartbeats, announcements string) { return c.hbName, c.annName }

// Stats returns a snapshot of the counters.
func (c *ControlPlane) Stats() Stats { return c.stats.snapshot() }

// SetStatus sets the status the next heartbeats carry. A non-finite or
// negative throughput is sent as 0.
func (c *ControlPlane) SetStatus(st wire.Status) {
	if !(st.SamplesPerSec >= 0) || math.IsInf(float64(st.SamplesPerSec), 0) {
		st.SamplesPerSec = 0
	}
	c.status.Store(&st)
}

// Peers returns the live peers other than this one, sorted by ID.
func (c *ControlPlane) Peers() []PeerInfo {
	now := c.clock.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.members.Live(now)
}

// Peer returns one live peer's info.
func (c *ControlPlane) Peer(id peerid.ID) (PeerInfo, bool) {
	now := c.clock.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.members.Get(id, now)
}

// WaitPeers blocks until at least n peers other than this one are live,
// and returns them. It returns early with ctx's error or ErrClosed. It only
// waits: heartbeats must flow (the loop, or the caller's Beat calls).
func (c *ControlPlane) WaitPeers(ctx context.Context, n int) ([]PeerInfo, error) {
	for {
		now := c.clock.Now()
		c.mu.Lock()
		live := c.members.Live(now)
		changed := c.changed
		c.mu.Unlock()
		if len(live) >= n {
			return live, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return live, ctx.Err()
		case <-c.done:
			return nil, ErrClosed
		}
	}
}

// Expire removes peers whose heartbeats stopped and forgets replay state
// older than ReplayRetention. It returns the expired peers. The heartbeat
// loop calls it every interval; call it yourself when the loop is off.
func (c *ControlPlane) Expire() []peerid.ID {
	now := c.clock.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lastExpire = now
	c.hbReplay.Prune(now, c.cfg.ReplayRetention)
	c.annReplay.Prune(now, c.cfg.ReplayRetention)
	return c.members.Expire(now)
}

// forget removes p from the view (its connections closed).
func (c *ControlPlane) forget(p peerid.ID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.members.Get(p, c.clock.Now()); !ok {
		return
	}
	c.members.Remove(p)
	close(c.changed)
	c.changed = make(chan struct{})
	c.log.Debug("gossip: peer disconnected", "peer", p)
}

func (c *ControlPlane) nextSeq() uint64 { return c.seq.Add(1) }

func (c *ControlPlane) addrs() []ma.Multiaddr {
	var out []ma.Multiaddr
	for _, a := range c.h.Addrs() {
		if len(out) == wire.MaxAddrs {
			break
		}
		if len(a.Bytes()) <= wire.MaxAddrLen {
			out = append(out, a)
		}
	}
	return out
}

// Beat publishes one heartbeat now.
func (c *ControlPlane) Beat(ctx context.Context) error {
	_, err := c.BeatSeq(ctx)
	return err
}

// BeatSeq publishes one heartbeat now and returns its sequence number:
// another peer has received it once its view of this peer (Peer) has that
// Seq or a later one.
func (c *ControlPlane) BeatSeq(ctx context.Context) (uint64, error) {
	hb := &wire.Heartbeat{
		Peer:  c.self,
		Seq:   c.nextSeq(),
		Model: c.cfg.Model,
		Addrs: c.addrs(),
	}
	if st := c.status.Load(); st != nil {
		hb.Status = *st
	}
	return hb.Seq, c.publish(ctx, c.hbTopic, wire.AppendHeartbeat(nil, hb))
}

// Announce publishes a; it fills in Peer, Seq and Model. The vector must be
// ready to serve under a.Key before Announce is called.
func (c *ControlPlane) Announce(ctx context.Context, a wire.Announcement) error {
	a.Peer = c.self
	a.Seq = c.nextSeq()
	a.Model = c.cfg.Model
	b := wire.AppendAnnouncement(nil, &a)
	// Check locally what every receiver will check, to return a clear error
	// instead of a silent drop.
	if _, err := wire.DecodeAnnouncement(b); err != nil {
		return fmt.Errorf("gossip: announce: %w", err)
	}
	return c.publish(ctx, c.annTopic, b)
}

func (c *ControlPlane) publish(ctx context.Context, t *pubsub.Topic, b []byte) error {
	select {
	case <-c.done:
		return ErrClosed
	default:
	}
	if len(b) > c.cfg.MaxMessageSize {
		return fmt.Errorf("gossip: publish: %w: %d bytes, cap %d", wire.ErrTooLarge, len(b), c.cfg.MaxMessageSize)
	}
	if err := t.Publish(ctx, b); err != nil {
		return fmt.Errorf("gossip: publish on %s: %w", t.String(), err)
	}
	return nil
}

// Next returns the next announcement from another peer, in arrival order.
// It blocks until one arrives, ctx ends or the control plane closes
// (ErrClosed). The returned value is owned by the caller.
func (c *ControlPlane) Next(ctx context.Context) (*wire.Announcement, error) {
	select {
	case a := <-c.ann:
		return a, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-c.done:
		return nil, ErrClosed
	}
}

func (c *ControlPlane) heartbeatLoop(ctx context.Context) {
	defer c.wg.Done()
	t := time.NewTicker(c.cfg.HeartbeatInterval)
	defer t.Stop()
	beat := func() {
		bctx, cancel := context.WithTimeout(ctx, c.cfg.HeartbeatInterval)
		defer cancel()
		if err := c.Beat(bctx); err != nil && ctx.Err() == nil {
			c.log.Warn("gossip: heartbeat", "err", err)
		}
	}
	beat()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			beat()
			for _, p := range c.Expire() {
				c.log.Debug("gossip: peer expired", "peer", p)
			}
		}
	}
}

func (c *ControlPlane) readHeartbeats(ctx context.Context) {
	defer c.wg.Done()
	for {
		msg, err := c.hbSub.Next(ctx)
		if err != nil {
			return
		}
		hb, ok := msg.ValidatorData.(*wire.Heartbeat)
		if !ok || hb.Peer == c.self {
			continue
		}
		now := c.clock.Now()
		c.mu.Lock()
		joined := c.members.Observe(hb, now)
		close(c.changed)
		c.changed = make(chan struct{})
		c.mu.Unlock()
		c.stats.heartbeats.Add(1)
		if len(hb.Addrs) > 0 {
			// The validator checked that hb.Peer is the signer.
			c.h.Peerstore().AddAddrs(msg.GetFrom(), hb.Addrs, c.cfg.PeerTTL)
		}
		if joined {
			c.log.Debug("gossip: peer joined", "peer", hb.Peer, "version", hb.Version)
		}
	}
}

func (c *ControlPlane) readAnnouncements(ctx context.Context) {
	defer c.wg.Done()
	for {
		msg, err := c.annSub.Next(ctx)
		if err != nil {
			return
		}
		a, ok := msg.ValidatorData.(*wire.Announcement)
		if !ok || a.Peer == c.self {
			continue
		}
		c.stats.announcements.Add(1)
		select {
		case c.ann <- a:
			continue
		default:
		}
		// Full: drop the oldest (this goroutine is the only sender, so the
		// second send cannot block for long; the reader may race us to it).
		select {
		case <-c.ann:
			c.stats.drop(DropOverflow)
		default:
		}
		select {
		case c.ann <- a:
		default:
			c.stats.drop(DropOverflow)
		}
	}
}

// validateHeartbeat is the heartbeat topic's validator (see validate).
func (c *ControlPlane) validateHeartbeat(_ context.Context, _ peer.ID, msg *pubsub.Message) pubsub.ValidationResult {
	return validate(c, msg, c.hbReplay, wire.DecodeHeartbeat, func(hb *wire.Heartbeat) (peerid.ID, string, uint64) { return hb.Peer, hb.Model, hb.Seq })
}

// validateAnnouncement is the announcement topic's validator (see
// validate).
func (c *ControlPlane) validateAnnouncement(_ context.Context, _ peer.ID, msg *pubsub.Message) pubsub.ValidationResult {
	return validate(c, msg, c.annReplay, wire.DecodeAnnouncement, func(a *wire.Announcement) (peerid.ID, string, uint64) { return a.Peer, a.Model, a.Seq })
}

// validate checks a control message of one topic: decoded by decode, whose
// sender, model and sequence number fields returns. Structural faults
// (size, encoding, NaN, a sender that is not the signer) are Reject, which
// also lowers the forwarder's GossipSub score; a foreign model or a replay
// (against replay) is Ignore, since an honest forwarder may relay those.
// A message of another wire version is logged once (its sender runs
// another release). An accepted message carries its decoded form in
// msg.ValidatorData.
func validate[M any](c *ControlPlane, msg *pubsub.Message, replay *replayGuard, decode func([]byte) (M, error), fields func(M) (from peerid.ID, model string, seq uint64)) pubsub.ValidationResult {
	data := msg.GetData()
	if len(data) > c.cfg.MaxMessageSize {
		c.stats.drop(DropOversized)
		return pubsub.ValidationReject
	}
	m, err := decode(data)
	if err != nil {
		r := reasonOf(err)
		if r == DropVersion && !c.warnedVersion.Swap(true) {
			c.log.Warn("gossip: dropping the messages of a peer on another Starling release", "peer", msg.GetFrom(), "err", err)
		}
		c.stats.drop(r)
		return pubsub.ValidationReject
	}
	// Both sides are canonical texts (the decoder checks the claimed one),
	// so equal texts are equal IDs.
	from, model, seq := fields(m)
	if from != idOf(msg.GetFrom()) {
		c.stats.drop(DropOrigin)
		return pubsub.ValidationReject
	}
	if model != c.cfg.Model {
		c.stats.drop(DropModel)
		return pubsub.ValidationIgnore
	}
	c.mu.Lock()
	fresh := replay.Check(from, seq, c.clock.Now())
	c.mu.Unlock()
	if !fresh {
		c.stats.drop(DropReplay)
		return pubsub.ValidationIgnore
	}
	msg.ValidatorData = m
	return pubsub.ValidationAccept
}

// idOf names a libp2p peer as Starling's messages and APIs do: the text
// form of its ID.
func idOf(p peer.ID) peerid.ID { return peerid.ID(p.String()) }
