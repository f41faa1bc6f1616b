package traintest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/starling-ml/starling/aggregate"
	"github.com/starling-ml/starling/peerid"
	"github.com/starling-ml/starling/train"
)

// Board is the in-memory control plane and state service of a group of
// Nets: who is live, each peer's last status, and the states peers
// published. Safe for concurrent use.
type Board struct {
	mu      sync.Mutex
	changed chan struct{}
	live    map[peerid.ID]bool
	status  map[peerid.ID]train.Status
	states  map[peerid.ID]*published
}

type published struct {
	version uint64
	state   []float32
}

// NewBoard returns an empty board.
func NewBoard() *Board {
	return &Board{changed: make(chan struct{}), live: map[peerid.ID]bool{},
		status: map[peerid.ID]train.Status{}, states: map[peerid.ID]*published{}}
}

// Join makes p a live member with a zero status, as its first heartbeat
// would.
func (b *Board) Join(p peerid.ID) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.live[p] = true
	if _, ok := b.status[p]; !ok {
		b.status[p] = train.Status{}
	}
}

// Leave removes p, as a membership expiry would: its status goes with it.
func (b *Board) Leave(p peerid.ID) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.live, p)
	delete(b.status, p)
}

// Live returns the live members, sorted, Done ones included.
func (b *Board) Live() []peerid.ID {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]peerid.ID, 0, len(b.live))
	for p := range b.live {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// SetStatus records p's status.
func (b *Board) SetStatus(p peerid.ID, st train.Status) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.status[p] = st
}

// Status returns p's last status.
func (b *Board) Status(p peerid.ID) (train.Status, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	st, ok := b.status[p]
	return st, ok
}

// Publish records p's state at version (copying it).
func (b *Board) Publish(p peerid.ID, version uint64, state []float32) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.states[p]
	if e == nil {
		e = &published{}
		b.states[p] = e
	}
	e.version = version
	e.state = append(e.state[:0], state...)
	close(b.changed)
	b.changed = make(chan struct{})
}

// Fetch copies the state of the first of peers at version ≥ version into
// dst, waiting for one until ctx ends.
func (b *Board) Fetch(ctx context.Context, peers []peerid.ID, version uint64, dst []float32) (uint64, error) {
	for {
		b.mu.Lock()
		for _, p := range peers {
			if e := b.states[p]; e != nil && e.version >= version {
				if len(e.state) != len(dst) {
					b.mu.Unlock()
					return 0, fmt.Errorf("%w: %s published %d values, want %d", train.ErrNoState, p, len(e.state), len(dst))
				}
				copy(dst, e.state)
				v := e.version
				b.mu.Unlock()
				return v, nil
			}
		}
		ch := b.changed
		b.mu.Unlock()
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("%w: none of %v reached version %d: %w", train.ErrNoState, peers, version, ctx.Err())
		case <-ch:
		}
	}
}

// Net is a train.Net in one process: the all-reduce runs on Runner (over
// any aggregate.Transport: aggtest's in-memory network in tests), and
// membership, statuses and states go through Board.
type Net struct {
	ID     peerid.ID
	Runner *aggregate.Runner
	Board  *Board
	// Fixed, if not nil, is the live membership (sorted, Self included)
	// instead of the Board's joined peers: a federation whose peers never
	// come or go.
	Fixed []peerid.ID
	// StatusDelay, if set, is how long a status takes to reach the
	// others, as swarm's heartbeat gossip takes up to a second.
	StatusDelay time.Duration
}

var _ train.Net = (*Net)(nil)

// Self implements train.Net.
func (n *Net) Self() peerid.ID { return n.ID }

func (n *Net) live() []peerid.ID {
	if n.Fixed != nil {
		return slices.Clone(n.Fixed)
	}
	return n.Board.Live()
}

// Members implements train.Net: the live peers less those whose status
// says Done.
func (n *Net) Members() []peerid.ID {
	return slices.DeleteFunc(n.live(), func(p peerid.ID) bool {
		st, _ := n.Board.Status(p)
		return st.Done && p != n.ID
	})
}

// AllReduce implements train.Net.
func (n *Net) AllReduce(ctx context.Context, round uint64, group []peerid.ID, dst, src []float32, weight float64) ([]peerid.ID, error) {
	res, err := n.Runner.AllReduceAmong(ctx, round, group, dst, src, weight)
	if err != nil {
		return nil, err
	}
	return res.Group.Sorted(), nil
}

// Publish implements train.Net.
func (n *Net) Publish(version uint64, state []float32) { n.Board.Publish(n.ID, version, state) }

// Fetch implements train.Net.
func (n *Net) Fetch(ctx context.Context, peers []peerid.ID, version uint64, dst []float32) (uint64, error) {
	return n.Board.Fetch(ctx, peers, version, dst)
}

// SetStatus implements train.Net.
func (n *Net) SetStatus(_ context.Context, st train.Status) error {
	if n.StatusDelay > 0 {
		time.AfterFunc(n.StatusDelay, func() { n.Board.SetStatus(n.ID, st) })
		return nil
	}
	n.Board.SetStatus(n.ID, st)
	return nil
}

// Statuses implements train.Net: the statuses of the other live peers.
func (n *Net) Statuses() map[peerid.ID]train.Status {
	out := map[peerid.ID]train.Status{}
	for _, p := range n.live() {
		if st, ok := n.Board.Status(p); ok && p != n.ID {
			out[p] = st
		}
	}
	return out
}
