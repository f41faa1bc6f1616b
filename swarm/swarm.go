package swarm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/starling-ml/starling/aggregate"
	"github.com/starling-ml/starling/aggregate/p2p"
	"github.com/starling-ml/starling/device"
	"github.com/starling-ml/starling/gossip"
	"github.com/starling-ml/starling/gossip/wire"
	"github.com/starling-ml/starling/node"
	"github.com/starling-ml/starling/peerid"
	"github.com/starling-ml/starling/train"
)

// Config gathers the settings of a peer's parts. Gossip.Model is the id of
// the model the peer trains; the all-reduce takes it too when
// Aggregate.Model is empty, so that peers of another model are neither
// members (the control plane ignores them) nor admitted to a round.
type Config struct {
	Node      node.Config
	Gossip    gossip.Config
	Aggregate aggregate.Config
	// StateTimeout bounds one state transfer on top of the time a server
	// may wait for the version asked for. 60 s moves 500 MB at 10 MB/s.
	StateTimeout time.Duration
	// FetchFrom is how many peers a state fetch stripes over (3).
	FetchFrom int
	// MaxStateValues bounds the state a peer accepts (default 512 Mi
	// values, 2 GiB).
	MaxStateValues int
	// Log, if not nil, receives the control plane's and the all-reduce's
	// logs (failed rounds at warn level, blame and votes at debug).
	Log *slog.Logger
}

// DefaultConfig returns defaults that work on a LAN with no configuration.
func DefaultConfig() Config {
	return Config{
		Node: node.DefaultConfig(), Gossip: gossip.DefaultConfig(), Aggregate: aggregate.DefaultConfig(),
		StateTimeout: 60 * time.Second, FetchFrom: 3, MaxStateValues: 512 << 20,
	}
}

// Validate reports settings that cannot work.
func (c *Config) Validate() error {
	if err := c.Node.Validate(); err != nil {
		return err
	}
	if err := c.Gossip.Validate(); err != nil {
		return err
	}
	if err := c.Aggregate.Validate(); err != nil {
		return err
	}
	if c.StateTimeout <= 0 || c.FetchFrom <= 0 || c.MaxStateValues <= 0 {
		return fmt.Errorf("swarm: StateTimeout, FetchFrom and MaxStateValues must be positive")
	}
	return nil
}

// Peer is one running peer: node, control plane, all-reduce and state
// service. Safe for concurrent use; Close stops everything it started.
type Peer struct {
	Node      *node.Node
	Control   *gossip.ControlPlane
	Transport *p2p.Transport
	Runner    *aggregate.Runner

	cfg   Config
	state *stateService
	own   bool
}

// Option is an extra of Start and Attach.
type Option func(*options)

type options struct {
	node    []node.Option
	wrap    func(aggregate.Transport) aggregate.Transport
	be      device.Backend
	pending bool
}

// WithJoinPending makes the peer's heartbeats say, from the first one,
// that it has not chosen the round it joins (train.JoinPending) until its
// strategy sets a status: the federated peers already running then never
// put a peer that is still starting up into a round's group.
func WithJoinPending() Option {
	return func(opts *options) { opts.pending = true }
}

// WithNodeOptions passes options to node.New or node.Attach.
func WithNodeOptions(o ...node.Option) Option {
	return func(opts *options) { opts.node = append(opts.node, o...) }
}

// WithBackend makes the all-reduce compute on be (device.Default() when
// not given): the backend the peer's model runs on.
func WithBackend(be device.Backend) Option {
	return func(opts *options) { opts.be = be }
}

// WithAllReduceTransport makes the all-reduce run over wrap(t) instead of
// the libp2p transport t (a simulation delays its sends).
func WithAllReduceTransport(wrap func(aggregate.Transport) aggregate.Transport) Option {
	return func(opts *options) { opts.wrap = wrap }
}

// Start builds a libp2p host from cfg.Node (with discovery) and the rest
// of the peer on it.
func Start(ctx context.Context, cfg Config, opts ...Option) (*Peer, error) {
	return assemble(cfg, opts, true, func(o []node.Option) (*node.Node, error) { return node.New(ctx, cfg.Node, o...) })
}

// Attach builds the peer on an existing host (mocknet, simulations). The
// host stays the caller's.
func Attach(h host.Host, cfg Config, opts ...Option) (*Peer, error) {
	return assemble(cfg, opts, false, func(o []node.Option) (*node.Node, error) { return node.Attach(h, cfg.Node, o...) })
}

// assemble checks cfg, makes the node with newNode and builds the peer on
// it; own says whether Close closes the node.
func assemble(cfg Config, opts []Option, own bool, newNode func([]node.Option) (*node.Node, error)) (*Peer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var o options
	for _, f := range opts {
		f(&o)
	}
	n, err := newNode(o.node)
	if err != nil {
		return nil, err
	}
	p, err := build(n, cfg, o)
	if err != nil {
		n.Close()
		return nil, err
	}
	p.own = own
	return p, nil
}

func build(n *node.Node, cfg Config, o options) (*Peer, error) {
	if cfg.Aggregate.Model == "" {
		cfg.Aggregate.Model = cfg.Gossip.Model
	}
	var gopts []gossip.Option
	var ropts []aggregate.Option
	if o.be != nil {
		ropts = append(ropts, aggregate.WithBackend(o.be))
	}
	if o.pending {
		gopts = append(gopts, gossip.WithStatus(wire.Status{JoinAt: train.JoinPending}))
	}
	if cfg.Log != nil {
		gopts = append(gopts, gossip.WithLogger(cfg.Log))
		ropts = append(ropts, aggregate.WithLogger(cfg.Log))
	}
	cp, err := gossip.New(n.Host(), cfg.Gossip, gopts...)
	if err != nil {
		return nil, err
	}
	// Members (peers whose heartbeats for this model arrive, and the
	// current all-reduce group) may park tensors here up to
	// node.Config.MaxParkedPerPeer each; everyone else shares
	// MaxStrangerParked.
	tr := p2p.New(n)
	n.SetMayPark(func(from peer.ID) bool {
		_, ok := cp.Peer(p2p.ID(from))
		return ok || tr.InGroup(from)
	})
	var art aggregate.Transport = tr
	if o.wrap != nil {
		art = o.wrap(tr)
	}
	r, err := aggregate.NewRunner(p2p.ID(n.ID()), art, cfg.Aggregate, ropts...)
	if err != nil {
		cp.Close()
		tr.Close()
		return nil, err
	}
	return &Peer{Node: n, Control: cp, Transport: tr, Runner: r, cfg: cfg,
		state: newStateService(n.Host(), cfg.MaxStateValues, cfg.StateTimeout)}, nil
}

// ID returns the peer's ID.
func (p *Peer) ID() peerid.ID { return peerid.ID(p.Node.ID().String()) }

// Close stops the control plane, the transport, the state service and
// (when Start built it) the node.
func (p *Peer) Close() error {
	errs := []error{p.Control.Close(), p.Transport.Close()}
	p.state.close()
	if p.own {
		errs = append(errs, p.Node.Close())
	}
	return errors.Join(errs...)
}

// Members returns the sorted IDs of the live peers training the same
// model, this one included, less those that said they stopped.
func (p *Peer) Members() []peerid.ID {
	out := []peerid.ID{p.ID()}
	for _, pi := range p.Control.Peers() {
		if !pi.Stopped {
			out = append(out, pi.ID)
		}
	}
	return peerid.Sorted(out)
}

// WaitPeers waits until at least n peers (including this one) are live.
func (p *Peer) WaitPeers(ctx context.Context, n int) error {
	if n <= 1 {
		return nil
	}
	_, err := p.Control.WaitPeers(ctx, n-1)
	return err
}

// StateIdle reports whether the peer is serving no state to anyone and
// has served none within the last d.
func (p *Peer) StateIdle(d time.Duration) bool { return p.state.idle(d) }

// Fetch fills dst with the state of version ≥ version from the given
// peers, striped over up to Config.FetchFrom of them.
func (p *Peer) Fetch(ctx context.Context, peers []peerid.ID, version uint64, dst []float32) (uint64, error) {
	ids := make([]peer.ID, 0, len(peers))
	for _, s := range peers {
		id, err := peer.Decode(string(s))
		if err != nil {
			return 0, fmt.Errorf("swarm: bad peer id %q: %w", s, err)
		}
		if id != p.Node.ID() {
			ids = append(ids, id)
		}
	}
	return p.state.fetch(ctx, ids, version, dst, p.cfg.FetchFrom)
}
