// Package aggtest is an in-memory network for aggregate.Transport: peers in
// one process, with per-message latency, per-peer link bandwidth, and
// failure injection (a peer that dies, freezes, drops or corrupts chunks at
// a chosen point of the protocol). Tests of aggregate/ and of packages above
// it, and the simulator, use it in place of node/.
//
// Time is read from the time package, so under testing/synctest the latency
// and bandwidth model runs in virtual time: a 1 Gbit/s all-reduce of 64 MB
// "takes" its seconds without taking them.
//
//	net := aggtest.NewNetwork(aggtest.Config{Latency: 100 * time.Microsecond, Bandwidth: 125e6})
//	a, b := net.Join("a"), net.Join("b")
//	net.SetHook(aggtest.KillAt("b", aggregate.StepGather, 1)) // b dies before its first gather chunk
package aggtest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/starling-ml/starling/aggregate"
	"github.com/starling-ml/starling/internal/ctxtime"
	"github.com/starling-ml/starling/peerid"
)

// Config describes the links. The zero value is an ideal network: every
// Send is delivered before it returns.
type Config struct {
	// Latency is the one-way delay of every chunk.
	Latency time.Duration
	// Bandwidth is each peer's link rate in bytes per second, separately
	// for sending and for receiving (a full-duplex port on a switch). 0
	// means unlimited.
	Bandwidth float64
	// Overhead is the number of bytes each chunk costs on the link on top
	// of its 4 bytes per value (framing).
	Overhead int
	// MailboxBytes bounds each peer's undelivered chunks
	// (aggregate.DefaultMailboxBytes when 0).
	MailboxBytes int
}

// Action is what a Hook makes of one Send.
type Action uint8

const (
	// Deliver delivers the chunk (possibly modified by the hook).
	Deliver Action = iota
	// Drop loses the chunk; the sender's Send succeeds.
	Drop
	// Kill kills the sender before the chunk leaves: its Sends and Recvs
	// fail with aggregate.ErrClosed from then on, chunks to it are refused
	// (the sender sees aggregate.ErrUnreachable), chunks already on the
	// wire from it still arrive.
	Kill
	// Stall freezes the sender before the chunk leaves: this and every
	// later Send blocks until Resume or until its ctx ends; chunks to it
	// are still accepted.
	Stall
)

// Hook sees every Send before it leaves: from, to, tag, and a copy of the
// data that it may modify. It is called from the sender's goroutine and
// must be safe for concurrent use.
type Hook func(from, to peerid.ID, tag aggregate.Tag, data []float32) Action

// Network connects Endpoints. It is safe for concurrent use.
type Network struct {
	cfg Config

	mu   sync.Mutex
	eps  map[peerid.ID]*Endpoint
	hook Hook
}

// NewNetwork returns an empty network.
func NewNetwork(cfg Config) *Network {
	return &Network{cfg: cfg, eps: map[peerid.ID]*Endpoint{}}
}

// Endpoint is one peer's attachment: an aggregate.Transport and
// aggregate.Scoper.
type Endpoint struct {
	*aggregate.Mailbox
	id  peerid.ID
	net *Network

	// guarded by net.mu
	dead        bool
	stalled     chan struct{} // non-nil while frozen; closed by Resume
	egressFree  time.Time
	ingressFree time.Time

	bytes, msgs atomic.Int64
}

var (
	_ aggregate.Transport = (*Endpoint)(nil)
	_ aggregate.Scoper    = (*Endpoint)(nil)
	_ aggregate.Prober    = (*Endpoint)(nil)
)

// Join attaches a new peer (or returns the existing endpoint of id).
func (n *Network) Join(id peerid.ID) *Endpoint {
	n.mu.Lock()
	defer n.mu.Unlock()
	if e, ok := n.eps[id]; ok {
		return e
	}
	e := &Endpoint{Mailbox: aggregate.NewMailbox(n.cfg.MailboxBytes), id: id, net: n}
	n.eps[id] = e
	return e
}

// SetHook installs h (nil removes it).
func (n *Network) SetHook(h Hook) {
	n.mu.Lock()
	n.hook = h
	n.mu.Unlock()
}

// Kill kills peer id now (see the Kill action).
func (n *Network) Kill(id peerid.ID) {
	n.mu.Lock()
	e := n.eps[id]
	if e == nil || e.dead {
		n.mu.Unlock()
		return
	}
	e.dead = true
	if e.stalled != nil {
		close(e.stalled)
		e.stalled = nil
	}
	n.mu.Unlock()
	e.Mailbox.Close()
}

// Stall freezes peer id's sending now (see the Stall action).
func (n *Network) Stall(id peerid.ID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if e := n.eps[id]; e != nil && !e.dead && e.stalled == nil {
		e.stalled = make(chan struct{})
	}
}

// Resume unfreezes peer id.
func (n *Network) Resume(id peerid.ID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if e := n.eps[id]; e != nil && e.stalled != nil {
		close(e.stalled)
		e.stalled = nil
	}
}

// Sent returns the bytes (values and per-chunk overhead) and chunks that
// peer id has put on its link.
func (n *Network) Sent(id peerid.ID) (bytes, chunks int64) {
	n.mu.Lock()
	e := n.eps[id]
	n.mu.Unlock()
	if e == nil {
		return 0, 0
	}
	return e.bytes.Load(), e.msgs.Load()
}

// ID returns the endpoint's peer id.
func (e *Endpoint) ID() peerid.ID { return e.id }

// Close kills the endpoint.
func (e *Endpoint) Close() error {
	e.net.Kill(e.id)
	return nil
}

// Send implements aggregate.Transport.
func (e *Endpoint) Send(ctx context.Context, to peerid.ID, tag aggregate.Tag, data []float32) error {
	n := e.net
	if err := e.waitThawed(ctx); err != nil {
		return err
	}
	n.mu.Lock()
	dst, hook := n.eps[to], n.hook
	n.mu.Unlock()
	if dst == nil {
		return fmt.Errorf("%w: no peer %s", aggregate.ErrUnreachable, to)
	}
	buf := dst.Mailbox.Buffer(len(data))
	copy(buf, data)
	if hook != nil {
		switch hook(e.id, to, tag, buf) {
		case Drop:
			return nil
		case Kill:
			n.Kill(e.id)
			return aggregate.ErrClosed
		case Stall:
			n.Stall(e.id)
			if err := e.waitThawed(ctx); err != nil {
				return err
			}
		}
	}

	size := 4*len(data) + n.cfg.Overhead
	n.mu.Lock()
	if e.dead {
		n.mu.Unlock()
		return aggregate.ErrClosed
	}
	if dst.dead {
		n.mu.Unlock()
		return fmt.Errorf("%w: %s is down", aggregate.ErrUnreachable, to)
	}
	if err := dst.Mailbox.Admit(e.id, tag); err != nil {
		n.mu.Unlock()
		return err
	}
	e.bytes.Add(int64(size))
	e.msgs.Add(1)
	if n.cfg.Latency == 0 && n.cfg.Bandwidth == 0 {
		n.mu.Unlock()
		return deliver(dst, e.id, tag, buf)
	}
	now := time.Now()
	var tx time.Duration
	if n.cfg.Bandwidth > 0 {
		tx = time.Duration(float64(size) / n.cfg.Bandwidth * float64(time.Second))
	}
	txEnd := later(now, e.egressFree).Add(tx)
	e.egressFree = txEnd
	rxEnd := later(txEnd.Add(n.cfg.Latency), dst.ingressFree.Add(tx))
	dst.ingressFree = rxEnd
	n.mu.Unlock()

	time.AfterFunc(rxEnd.Sub(now), func() { _ = deliver(dst, e.id, tag, buf) })
	return ctxtime.Sleep(ctx, txEnd.Sub(now))
}

// Probe implements aggregate.Prober: a live peer answers after a round
// trip, a frozen one (Stall) not until it is resumed, and a dead one
// fails at once.
func (e *Endpoint) Probe(ctx context.Context, p peerid.ID) error {
	n := e.net
	n.mu.Lock()
	dst := n.eps[p]
	n.mu.Unlock()
	if dst == nil {
		return fmt.Errorf("%w: no peer %s", aggregate.ErrUnreachable, p)
	}
	if err := dst.waitThawed(ctx); err != nil {
		if ctx.Err() != nil {
			return err
		}
		return fmt.Errorf("%w: %s is down", aggregate.ErrUnreachable, p)
	}
	return ctxtime.Sleep(ctx, 2*n.cfg.Latency)
}

func deliver(dst *Endpoint, from peerid.ID, tag aggregate.Tag, buf []float32) error {
	dst.net.mu.Lock()
	dead := dst.dead
	dst.net.mu.Unlock()
	if dead {
		return fmt.Errorf("%w: %s is down", aggregate.ErrUnreachable, dst.id)
	}
	return dst.Mailbox.Deliver(from, tag, buf)
}

// waitThawed blocks while e is frozen.
func (e *Endpoint) waitThawed(ctx context.Context) error {
	for {
		e.net.mu.Lock()
		dead, ch := e.dead, e.stalled
		e.net.mu.Unlock()
		if dead {
			return aggregate.ErrClosed
		}
		if ch == nil {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
