package train

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/starling-ml/starling/aggregate"
	"github.com/starling-ml/starling/peerid"
)

// StateBoard holds the global states peers publish, for fetchers in the
// same process. It is the in-memory half of a FedNet; a libp2p FedNet
// serves the same thing over node/ streams.
type StateBoard struct {
	mu      sync.Mutex
	changed chan struct{}
	states  map[string]*boardEntry
}

type boardEntry struct {
	version uint64
	state   []float32
}

// NewStateBoard returns an empty board.
func NewStateBoard() *StateBoard {
	return &StateBoard{changed: make(chan struct{}), states: map[string]*boardEntry{}}
}

// Publish records peer's state at version (copying it).
func (b *StateBoard) Publish(peer string, version uint64, state []float32) {
	b.mu.Lock()
	e := b.states[peer]
	if e == nil {
		e = &boardEntry{}
		b.states[peer] = e
	}
	e.version = version
	e.state = append(e.state[:0], state...)
	close(b.changed)
	b.changed = make(chan struct{})
	b.mu.Unlock()
}

// Fetch copies the state of the first of peers at version ≥ version into
// dst, waiting for one until ctx ends.
func (b *StateBoard) Fetch(ctx context.Context, peers []string, version uint64, dst []float32) (uint64, error) {
	for {
		b.mu.Lock()
		for _, p := range peers {
			if e := b.states[p]; e != nil && e.version >= version {
				if len(e.state) != len(dst) {
					b.mu.Unlock()
					return 0, fmt.Errorf("%w: %s published %d values, want %d", ErrNoState, p, len(e.state), len(dst))
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
			return 0, fmt.Errorf("%w: none of %v reached version %d: %w", ErrNoState, peers, version, ctx.Err())
		case <-ch:
		}
	}
}

// RunnerNet is a FedNet over an aggregate.Runner (any Transport) for the
// all-reduce and a StateBoard for state, with a fixed or changing member
// list. The simulator and tests use it with aggtest's in-memory network.
type RunnerNet struct {
	ID     string
	Runner *aggregate.Runner
	Board  *StateBoard
	// MembersFn returns the live members (sorted); nil means Static.
	MembersFn func() []string
	// Static is the member list when MembersFn is nil.
	Static []string
}

var (
	_ FedNet    = (*RunnerNet)(nil)
	_ Versioned = (*RunnerNet)(nil)
)

// Versions implements Versioned from the board.
func (n *RunnerNet) Versions() map[string]uint64 { return n.Board.Versions() }

// Versions returns the last published version of every peer.
func (b *StateBoard) Versions() map[string]uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[string]uint64, len(b.states))
	for p, e := range b.states {
		out[p] = e.version
	}
	return out
}

// Self implements FedNet.
func (n *RunnerNet) Self() string { return n.ID }

// Members implements FedNet.
func (n *RunnerNet) Members(ctx context.Context, round uint64) ([]string, error) {
	if n.MembersFn != nil {
		return n.MembersFn(), nil
	}
	return n.Static, nil
}

// AllReduce implements FedNet.
func (n *RunnerNet) AllReduce(ctx context.Context, round uint64, group []string, dst, src []float32, weight float64) ([]string, error) {
	return AllReduceGroup(ctx, n.Runner, round, group, dst, src, weight)
}

// AllReduceGroup forms the aggregate group of the given peers for round
// and runs r's all-reduce, returning the members whose contributions the
// result holds.
func AllReduceGroup(ctx context.Context, r *aggregate.Runner, round uint64, group []string, dst, src []float32, weight float64) ([]string, error) {
	res, err := AllReduceResult(ctx, r, round, group, dst, src, weight)
	if err != nil {
		return nil, err
	}
	used := make([]string, 0, res.Group.Size())
	for _, p := range res.Group.Members() {
		used = append(used, string(p))
	}
	slices.Sort(used)
	return used, nil
}

// AllReduceResult is AllReduceGroup returning aggregate's whole Result
// (who was excluded, and why).
func AllReduceResult(ctx context.Context, r *aggregate.Runner, round uint64, group []string, dst, src []float32, weight float64) (aggregate.Result, error) {
	ids := make([]peerid.ID, len(group))
	for i, p := range group {
		ids[i] = peerid.ID(p)
	}
	g, err := aggregate.Form(round, ids)
	if err != nil {
		return aggregate.Result{}, err
	}
	return r.AllReduce(ctx, g, dst, src, weight)
}

// Publish implements FedNet.
func (n *RunnerNet) Publish(version uint64, state []float32) { n.Board.Publish(n.ID, version, state) }

// Fetch implements FedNet.
func (n *RunnerNet) Fetch(ctx context.Context, peers []string, version uint64, dst []float32) (uint64, error) {
	return n.Board.Fetch(ctx, peers, version, dst)
}
