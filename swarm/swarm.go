package swarm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/starling-ml/starling/aggregate"
	"github.com/starling-ml/starling/aggregate/p2p"
	"github.com/starling-ml/starling/gossip"
	"github.com/starling-ml/starling/node"
	"github.com/starling-ml/starling/train"
)

// Config gathers the settings of a peer's parts.
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
	left  sync.Map // peer ID string → struct{}: peers seen to announce that they stopped
}

// Start builds a libp2p host from cfg.Node (with discovery) and the rest
// of the peer on it.
func Start(ctx context.Context, cfg Config, opts ...node.Option) (*Peer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	n, err := node.New(ctx, cfg.Node, opts...)
	if err != nil {
		return nil, err
	}
	p, err := build(n, cfg)
	if err != nil {
		n.Close()
		return nil, err
	}
	p.own = true
	return p, nil
}

// Attach builds the peer on an existing host (mocknet, simulations). The
// host stays the caller's.
func Attach(h host.Host, cfg Config, opts ...node.Option) (*Peer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	n, err := node.Attach(h, cfg.Node, opts...)
	if err != nil {
		return nil, err
	}
	p, err := build(n, cfg)
	if err != nil {
		n.Close()
		return nil, err
	}
	return p, nil
}

func build(n *node.Node, cfg Config) (*Peer, error) {
	var gopts []gossip.Option
	var ropts []aggregate.Option
	if cfg.Log != nil {
		gopts = append(gopts, gossip.WithLogger(cfg.Log))
		ropts = append(ropts, aggregate.WithLogger(cfg.Log))
	}
	cp, err := gossip.New(n.Host(), cfg.Gossip, gopts...)
	if err != nil {
		return nil, err
	}
	tr := p2p.New(n)
	r, err := aggregate.NewRunner(p2p.ID(n.ID()), tr, cfg.Aggregate, ropts...)
	if err != nil {
		cp.Close()
		tr.Close()
		return nil, err
	}
	return &Peer{Node: n, Control: cp, Transport: tr, Runner: r, cfg: cfg,
		state: newStateService(n.Host(), cfg.MaxStateValues, cfg.StateTimeout)}, nil
}

// ID returns the peer's id as strategies name it.
func (p *Peer) ID() string { return p.Node.ID().String() }

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

// doneBit marks a heartbeat version that says "stopped training at
// version&^doneBit before the job's end" (train.Leaver, train.SyncStatus's
// Done): the peer is up but takes part in nothing.
const doneBit = 1 << 62

// stopped reports whether a heartbeat version says its peer stopped.
func stopped(version uint64) bool { return version&doneBit != 0 && version&joiningBit == 0 }

// Members returns the sorted ids of the live peers training the same
// model, including this one, less those that said they stopped.
func (p *Peer) Members() []string {
	out := []string{p.ID()}
	for _, pi := range p.Control.Peers() {
		if !stopped(pi.Version) {
			out = append(out, pi.ID.String())
			p.left.Delete(pi.ID.String()) // back (restarted)
		} else {
			p.left.Store(pi.ID.String(), struct{}{})
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// WaitPeers waits until at least n peers (including this one) are live.
func (p *Peer) WaitPeers(ctx context.Context, n int) error {
	if n <= 1 {
		return nil
	}
	_, err := p.Control.WaitPeers(ctx, n-1)
	return err
}

// Publish serves state as the global state at version.
func (p *Peer) Publish(version uint64, state []float32) {
	p.state.publish(version, state)
	p.Control.SetStatus(version, 0)
}

// StateIdle reports whether the peer is serving no state to anyone and
// has served none within the last d.
func (p *Peer) StateIdle(d time.Duration) bool { return p.state.idle(d) }

// Fetch fills dst with the state of version ≥ version from the given
// peers (ids as strings), striped over up to Config.FetchFrom of them.
func (p *Peer) Fetch(ctx context.Context, peers []string, version uint64, dst []float32) (uint64, error) {
	ids := make([]peer.ID, 0, len(peers))
	for _, s := range peers {
		id, err := peer.Decode(s)
		if err != nil {
			return 0, fmt.Errorf("swarm: bad peer id %q: %w", s, err)
		}
		if id != p.Node.ID() {
			ids = append(ids, id)
		}
	}
	return p.state.fetch(ctx, ids, version, dst, p.cfg.FetchFrom)
}

var (
	_ train.Versioned  = fedNet{}
	_ train.Leaver     = fedNet{}
	_ train.Departures = fedNet{}
)

// FedNet returns the peer as a train.FedNet.
func (p *Peer) FedNet() train.FedNet { return fedNet{p} }

type fedNet struct{ p *Peer }

func (f fedNet) Self() string { return f.p.ID() }

// Versions implements train.Versioned from the heartbeats' model versions
// (of the peers in Members).
func (f fedNet) Versions() map[string]uint64 {
	out := map[string]uint64{}
	for _, pi := range f.p.Control.Peers() {
		if !stopped(pi.Version) {
			out[pi.ID.String()] = pi.Version
		}
	}
	return out
}

// Leave implements train.Leaver: the heartbeat says the peer stopped at
// version, at once; Members leaves it out on the other peers.
func (f fedNet) Leave(ctx context.Context, version uint64) error {
	f.p.Control.SetStatus(version&^joiningBit|doneBit, 0)
	return f.p.Control.Beat(ctx)
}

// Departed implements train.Departures: id's heartbeats said it stopped,
// now or when Members last looked (a stopped peer drops out of the view
// once its heartbeats end).
func (f fedNet) Departed(id string) bool {
	if _, ok := f.p.left.Load(id); ok {
		return true
	}
	pid, err := peer.Decode(id)
	if err != nil {
		return false
	}
	pi, ok := f.p.Control.Peer(p2p.ID(pid))
	return ok && stopped(pi.Version)
}

func (f fedNet) Members(ctx context.Context, round uint64) ([]string, error) {
	return f.p.Members(), nil
}

func (f fedNet) AllReduce(ctx context.Context, round uint64, group []string, dst, src []float32, weight float64) ([]string, error) {
	return train.AllReduceGroup(ctx, f.p.Runner, round, group, dst, src, weight)
}

func (f fedNet) Publish(version uint64, state []float32) { f.p.Publish(version, state) }

func (f fedNet) Fetch(ctx context.Context, peers []string, version uint64, dst []float32) (uint64, error) {
	return f.p.Fetch(ctx, peers, version, dst)
}
