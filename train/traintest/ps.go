package traintest

import (
	"context"
	"errors"
	"slices"
	"sync"

	"github.com/starling-ml/starling/peerid"
	"github.com/starling-ml/starling/train"
)

// errDead is the error of a call to or from a peer the fabric killed.
var errDead = errors.New("traintest: peer unreachable")

// PSFabric is an in-memory train.PSNet fabric for RunPS: a Call runs the
// callee's handler on the caller's goroutine, with the caller's ctx, on
// copies of the request and reply bytes. Kill makes a peer unreachable
// (its calls and calls to it fail at once, as a reset connection does);
// Stall makes calls to it wait for their deadline, as a frozen process
// does. Safe for concurrent use.
type PSFabric struct {
	mu       sync.Mutex
	handlers map[peerid.ID]train.PSHandler
	dead     map[peerid.ID]bool
	stalled  map[peerid.ID]bool
	calls    map[peerid.ID]int
	pairs    map[[2]peerid.ID]int
}

// NewPSFabric returns an empty fabric.
func NewPSFabric() *PSFabric {
	return &PSFabric{handlers: map[peerid.ID]train.PSHandler{}, dead: map[peerid.ID]bool{}, stalled: map[peerid.ID]bool{}, calls: map[peerid.ID]int{},
		pairs: map[[2]peerid.ID]int{}}
}

// Join attaches peer id.
func (f *PSFabric) Join(id peerid.ID) train.PSNet { return &memPSNet{f: f, self: id} }

// Kill makes id unreachable for good.
func (f *PSFabric) Kill(id peerid.ID) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dead[id] = true
}

// Stall makes calls to id hang until their deadline.
func (f *PSFabric) Stall(id peerid.ID) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stalled[id] = true
}

// Calls returns how many calls reached id's handler.
func (f *PSFabric) Calls(id peerid.ID) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[id]
}

// CallsFrom returns how many calls from one peer reached to's handler.
func (f *PSFabric) CallsFrom(from, to peerid.ID) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pairs[[2]peerid.ID{from, to}]
}

type memPSNet struct {
	f    *PSFabric
	self peerid.ID
}

func (n *memPSNet) Self() peerid.ID { return n.self }

func (n *memPSNet) Serve(h train.PSHandler) {
	n.f.mu.Lock()
	defer n.f.mu.Unlock()
	if h == nil {
		delete(n.f.handlers, n.self)
		return
	}
	n.f.handlers[n.self] = h
}

func (n *memPSNet) Call(ctx context.Context, to peerid.ID, r *train.PSRequest) (*train.PSReply, error) {
	f := n.f
	f.mu.Lock()
	h, dead, stalled := f.handlers[to], f.dead[to] || f.dead[n.self], f.stalled[to]
	if !dead && !stalled && h != nil {
		f.calls[to]++
		f.pairs[[2]peerid.ID{n.self, to}]++
	}
	f.mu.Unlock()
	switch {
	case dead:
		return nil, errDead
	case stalled:
		<-ctx.Done()
		return nil, ctx.Err()
	case h == nil:
		return &train.PSReply{Status: train.PSNotReady}, nil
	}
	req := *r
	req.Payload = slices.Clone(r.Payload)
	req.Seqs = slices.Clone(r.Seqs)
	rep := h(ctx, n.self, &req)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	f.mu.Lock()
	dead = f.dead[to] || f.dead[n.self]
	f.mu.Unlock()
	if dead { // it died while answering: the reply never comes
		return nil, errDead
	}
	out := *rep
	out.Payload = slices.Clone(rep.Payload)
	return &out, nil
}
