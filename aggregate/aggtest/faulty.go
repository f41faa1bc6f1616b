package aggtest

import (
	"context"
	"slices"
	"sync"

	"github.com/starling-ml/starling/aggregate"
	"github.com/starling-ml/starling/peerid"
)

// Faulty wraps any aggregate.Transport (node/ streams on mocknet or on
// loopback) with a Hook, to inject the same failures as the in-memory
// Network does: Kill calls the kill function (close the node) and fails
// this and every later call; Stall blocks this and every later Send until
// its ctx ends or Resume. The hook sees a copy of the data. Safe for
// concurrent use.
type Faulty struct {
	t    aggregate.Transport
	self peerid.ID
	hook Hook
	kill func()

	mu      sync.Mutex
	dead    bool
	stalled chan struct{}
}

var (
	_ aggregate.Transport      = (*Faulty)(nil)
	_ aggregate.FiniteReceiver = (*Faulty)(nil)
	_ aggregate.AxpyReceiver   = (*Faulty)(nil)
)

// NewFaulty wraps t, the transport of peer self.
func NewFaulty(t aggregate.Transport, self peerid.ID, hook Hook, kill func()) *Faulty {
	return &Faulty{t: t, self: self, hook: hook, kill: kill}
}

// Send implements aggregate.Transport.
func (f *Faulty) Send(ctx context.Context, to peerid.ID, tag aggregate.Tag, data []float32) error {
	return f.SendReceived(ctx, to, tag, data, nil)
}

// SendReceived implements aggregate.AxpyReceiver: the wrapped transport's
// where it has one, with sums, unless the hook saw (and may have changed)
// the data; else Send.
func (f *Faulty) SendReceived(ctx context.Context, to peerid.ID, tag aggregate.Tag, data []float32, sums aggregate.Checksums) error {
	if err := f.thawed(ctx); err != nil {
		return err
	}
	if f.hook != nil {
		data = slices.Clone(data)
		switch f.hook(f.self, to, tag, data) {
		case Drop:
			return nil
		case Kill:
			f.Kill()
			return aggregate.ErrClosed
		case Stall:
			f.mu.Lock()
			if f.stalled == nil {
				f.stalled = make(chan struct{})
			}
			f.mu.Unlock()
			if err := f.thawed(ctx); err != nil {
				return err
			}
		}
	}
	if ar, ok := f.t.(aggregate.AxpyReceiver); ok && sums != nil && f.hook == nil {
		return ar.SendReceived(ctx, to, tag, data, sums)
	}
	return f.t.Send(ctx, to, tag, data)
}

// Recv implements aggregate.Transport.
func (f *Faulty) Recv(ctx context.Context, from peerid.ID, tag aggregate.Tag, dst []float32) error {
	_, err := f.RecvFinite(ctx, from, tag, dst)
	return err
}

// RecvFinite implements aggregate.FiniteReceiver: the wrapped transport's
// RecvFinite where it has one (so that tests over node/ streams take the
// driver's path that trusts it), else its Recv.
func (f *Faulty) RecvFinite(ctx context.Context, from peerid.ID, tag aggregate.Tag, dst []float32) (bool, error) {
	f.mu.Lock()
	dead := f.dead
	f.mu.Unlock()
	if dead {
		return false, aggregate.ErrClosed
	}
	if fr, ok := f.t.(aggregate.FiniteReceiver); ok {
		return fr.RecvFinite(ctx, from, tag, dst)
	}
	return false, f.t.Recv(ctx, from, tag, dst)
}

// RecvAxpy implements aggregate.AxpyReceiver: the wrapped transport's
// where it has one, else RecvFinite (nothing summed).
func (f *Faulty) RecvAxpy(ctx context.Context, from peerid.ID, tag aggregate.Tag, dst []float32, alpha float32, x []float32) (aggregate.Received, error) {
	ar, ok := f.t.(aggregate.AxpyReceiver)
	if !ok {
		fin, err := f.RecvFinite(ctx, from, tag, dst)
		return aggregate.Received{In: fin}, err
	}
	f.mu.Lock()
	dead := f.dead
	f.mu.Unlock()
	if dead {
		return aggregate.Received{}, aggregate.ErrClosed
	}
	return ar.RecvAxpy(ctx, from, tag, dst, alpha, x)
}

// Kill runs the kill function once and fails every later call.
func (f *Faulty) Kill() {
	f.mu.Lock()
	if f.dead {
		f.mu.Unlock()
		return
	}
	f.dead = true
	if f.stalled != nil {
		close(f.stalled)
		f.stalled = nil
	}
	f.mu.Unlock()
	if f.kill != nil {
		f.kill()
	}
}

// Resume unfreezes a stalled peer.
func (f *Faulty) Resume() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stalled != nil {
		close(f.stalled)
		f.stalled = nil
	}
}

func (f *Faulty) thawed(ctx context.Context) error {
	for {
		f.mu.Lock()
		dead, ch := f.dead, f.stalled
		f.mu.Unlock()
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
