package traintest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/starling-ml/starling/train"
)

var errStageDown = errors.New("traintest: pipeline stage is down")

// MemPipe is an in-memory pipeline of stages for train.Pipeline: Link(s)
// is stage s's train.PipeLink. Messages are copied on Send and wait in a
// mailbox until their Recv. Kill(s) takes stage s down: its calls fail
// and nothing reaches it, so its neighbours wait until their deadline, as
// over a network. Safe for concurrent use.
type MemPipe struct {
	mu     sync.Mutex
	stages int
	boxes  map[pipeKey]chan *train.PipeMsg
	down   []bool
}

type pipeKey struct {
	to   int
	kind train.PipeKind
	step uint64
	mb   int
}

// NewMemPipe returns a pipeline of k stages.
func NewMemPipe(k int) *MemPipe {
	return &MemPipe{stages: k, boxes: map[pipeKey]chan *train.PipeMsg{}, down: make([]bool, k)}
}

// Link returns stage s's link.
func (p *MemPipe) Link(s int) train.PipeLink { return memLink{p, s} }

// Kill takes stage s down.
func (p *MemPipe) Kill(s int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down[s] = true
}

// Revive brings stage s back with an empty mailbox (a restarted peer).
func (p *MemPipe) Revive(s int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down[s] = false
	for k := range p.boxes {
		if k.to == s {
			delete(p.boxes, k)
		}
	}
}

func (p *MemPipe) box(k pipeKey) (chan *train.PipeMsg, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c, ok := p.boxes[k]
	if !ok {
		c = make(chan *train.PipeMsg, 1)
		p.boxes[k] = c
	}
	return c, p.down[k.to]
}

type memLink struct {
	p *MemPipe
	s int
}

var _ train.PipeLink = memLink{}

func (l memLink) isDown() bool {
	l.p.mu.Lock()
	defer l.p.mu.Unlock()
	return l.p.down[l.s]
}

// Send implements train.PipeLink.
func (l memLink) Send(ctx context.Context, m *train.PipeMsg) error {
	if l.isDown() {
		return errStageDown
	}
	to := l.s + 1
	if m.Kind.Backward() {
		to = l.s - 1
	}
	if to < 0 || to >= l.p.stages {
		return fmt.Errorf("traintest: stage %d has no neighbour %d", l.s, to)
	}
	c, down := l.p.box(pipeKey{to, m.Kind, m.Step, m.MB})
	if down {
		return nil // lost on the way, as to a dead peer that the network has not noticed
	}
	cp := *m
	cp.Data, cp.Y = slices.Clone(m.Data), slices.Clone(m.Y)
	select {
	case c <- &cp:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Recv implements train.PipeLink.
func (l memLink) Recv(ctx context.Context, kind train.PipeKind, step uint64, mb int) (*train.PipeMsg, error) {
	if l.isDown() {
		return nil, errStageDown
	}
	k := pipeKey{l.s, kind, step, mb}
	c, _ := l.p.box(k)
	select {
	case m := <-c:
		l.p.mu.Lock()
		delete(l.p.boxes, k)
		l.p.mu.Unlock()
		return m, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
