package average

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/starling-ml/starling/peerid"
)

// Share is a push-sum share in flight.
type Share struct {
	From    peerid.ID
	Step    uint64    // the sender's gossip step (which exponential-graph offset)
	Version uint64    // the sender's model version when it split
	X       []float32 // numerator share
	W       float64   // weight share, > 0
}

// Exchanger moves gossip-averaging vectors between peers.
// gossip.NodeTransport implements it over node/'s tensor streams;
// MemNetwork is an in-memory fake. Each peer's
// Exchanger delivers what arrives for it to the Handler it was built with.
//
// Implementations are safe for concurrent use, honour ctx's deadline on
// every call, and do not retain the slices passed in after returning.
type Exchanger interface {
	// Push delivers a push-sum share to peer to and returns once the
	// remote Handler's HandleShare returned. An error wrapping
	// ErrNotDelivered means the share certainly was not absorbed.
	Push(ctx context.Context, to peerid.ID, s Share) error
	// Swap is the active side of an AD-PSGD exchange: it sends mine to the
	// passive peer with, whose Handler atomically replies with its model
	// before averaging and averages; the reply is written into theirs
	// (len(theirs) == len(mine)). The caller then averages its own model
	// with theirs. On error theirs is undefined and the caller must not
	// average.
	Swap(ctx context.Context, with peerid.ID, mine, theirs []float32) error
}

// Handler is the receiving side of an Exchanger, implemented by the
// averaging driver (PushSumPeer, PairwisePeer). Exchangers call it from
// their own goroutines, possibly concurrently.
type Handler interface {
	// HandleShare absorbs a push-sum share. s.X is owned by the handler
	// once called. It must not block on the network.
	HandleShare(s Share) error
	// HandleSwap is the passive side of an AD-PSGD exchange: atomically
	// copy the local model into mine and set the local model to the mean of
	// itself and theirs. It must not block on the network.
	HandleSwap(from peerid.ID, theirs, mine []float32) error
}

// MemNetwork is an in-memory Exchanger fabric for tests and simulations:
// Push and Swap call the remote Handler directly in the caller's
// goroutine, on copies of the vectors. Faults are injected with SetFault.
// It is safe for concurrent use.
type MemNetwork struct {
	mu    sync.RWMutex
	peers map[peerid.ID]Handler
	fault func(from, to peerid.ID) error
}

// NewMemNetwork returns an empty network.
func NewMemNetwork() *MemNetwork { return &MemNetwork{peers: make(map[peerid.ID]Handler)} }

// Join attaches peer id with its handler and returns its Exchanger.
func (n *MemNetwork) Join(id peerid.ID, h Handler) Exchanger {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.peers[id] = h
	return &memExchanger{net: n, self: id}
}

// Leave detaches peer id; exchanges with it fail with ErrUnknownPeer and
// ErrNotDelivered.
func (n *MemNetwork) Leave(id peerid.ID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.peers, id)
}

// SetFault installs f, called before every exchange; a non-nil result
// fails the exchange before delivery (it is wrapped with ErrNotDelivered).
func (n *MemNetwork) SetFault(f func(from, to peerid.ID) error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.fault = f
}

func (n *MemNetwork) route(from, to peerid.ID) (Handler, error) {
	n.mu.RLock()
	h, ok := n.peers[to]
	fault := n.fault
	n.mu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("%w: %w: %s", ErrNotDelivered, ErrUnknownPeer, to)
	}
	if fault != nil {
		if err := fault(from, to); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrNotDelivered, err)
		}
	}
	return h, nil
}

type memExchanger struct {
	net  *MemNetwork
	self peerid.ID
}

var _ Exchanger = (*memExchanger)(nil)

func (e *memExchanger) Push(ctx context.Context, to peerid.ID, s Share) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrNotDelivered, err)
	}
	h, err := e.net.route(e.self, to)
	if err != nil {
		return err
	}
	s.From = e.self
	s.X = slices.Clone(s.X)
	if err := h.HandleShare(s); err != nil {
		return fmt.Errorf("%w: %s refused the share: %w", ErrNotDelivered, to, err)
	}
	return nil
}

func (e *memExchanger) Swap(ctx context.Context, with peerid.ID, mine, theirs []float32) error {
	if len(theirs) != len(mine) {
		return fmt.Errorf("%w: mine %d, theirs %d", ErrShape, len(mine), len(theirs))
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrNotDelivered, err)
	}
	h, err := e.net.route(e.self, with)
	if err != nil {
		return err
	}
	reply := make([]float32, len(mine))
	if err := h.HandleSwap(e.self, slices.Clone(mine), reply); err != nil {
		return fmt.Errorf("%w: %s refused the swap: %w", ErrNotDelivered, with, err)
	}
	copy(theirs, reply)
	return nil
}
