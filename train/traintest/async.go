package traintest

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/starling-ml/starling/gossip/average"
	"github.com/starling-ml/starling/gossip/wire"
	"github.com/starling-ml/starling/peerid"
	"github.com/starling-ml/starling/train"
)

// Errors of the fakes' calls that fail.
var (
	errLeft      = errors.New("traintest: the peer left the bus")
	errNotServed = errors.New("traintest: not served")
	errDigest    = errors.New("traintest: fetched bytes do not match the announcement")
)

// MemBus is an in-memory train.AsyncNet fabric for tests and simulations: a
// Publish is queued for every other member at once and its bytes are
// fetchable by (holder, key). Inject delivers hand-made announcements (for
// bad-input tests). Safe for concurrent use.
type MemBus struct {
	mu    sync.Mutex
	subs  map[peerid.ID]chan *wire.Announcement
	blobs map[string][]byte
	seq   uint64
	lost  uint64
}

// NewMemBus returns an empty bus.
func NewMemBus() *MemBus {
	return &MemBus{subs: make(map[peerid.ID]chan *wire.Announcement), blobs: make(map[string][]byte)}
}

// Join attaches peer id training model; up to queue announcements wait for
// its Next (further ones are lost, as a full control-plane queue loses
// them).
func (b *MemBus) Join(id peerid.ID, model string, queue int) train.AsyncNet {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.subs[id] = make(chan *wire.Announcement, queue)
	return &memAsyncNet{bus: b, self: id, model: model}
}

// Leave detaches id: it gets no more announcements and its bytes are gone.
func (b *MemBus) Leave(id peerid.ID) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.subs, id)
	for k := range b.blobs {
		if len(k) > len(id) && k[:len(id)] == string(id) && k[len(id)] == '\x00' {
			delete(b.blobs, k)
		}
	}
}

// Lost returns the number of announcements dropped on full queues.
func (b *MemBus) Lost() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.lost
}

func blobKey(holder peerid.ID, key string) string { return string(holder) + "\x00" + key }

// Inject serves payload under (a.Source(), a.Key) and queues a, unchanged,
// for every member but a.Peer.
func (b *MemBus) Inject(a wire.Announcement, payload []byte) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.blobs[blobKey(a.Source(), a.Key)] = append([]byte(nil), payload...)
	for id, ch := range b.subs {
		if id == a.Peer {
			continue
		}
		c := a
		select {
		case ch <- &c:
		default:
			b.lost++
		}
	}
}

type memAsyncNet struct {
	bus   *MemBus
	self  peerid.ID
	model string
}

func (n *memAsyncNet) Self() peerid.ID { return n.self }

func (n *memAsyncNet) Publish(ctx context.Context, a wire.Announcement, payload []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	n.bus.mu.Lock()
	n.bus.seq++
	a.Peer, a.Seq, a.Model = n.self, n.bus.seq, n.model
	n.bus.mu.Unlock()
	a.Size = uint64(len(payload))
	a.Digest = wire.Digest(payload)
	n.bus.Inject(a, payload)
	return nil
}

func (n *memAsyncNet) Next(ctx context.Context) (*wire.Announcement, error) {
	n.bus.mu.Lock()
	ch := n.bus.subs[n.self]
	n.bus.mu.Unlock()
	if ch == nil {
		return nil, errLeft
	}
	select {
	case a := <-ch:
		return a, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (n *memAsyncNet) Fetch(ctx context.Context, a *wire.Announcement, dst []byte) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return dst[:0], err
	}
	n.bus.mu.Lock()
	b, ok := n.bus.blobs[blobKey(a.Source(), a.Key)]
	n.bus.mu.Unlock()
	if !ok {
		return dst[:0], fmt.Errorf("%w: %q by %s", errNotServed, a.Key, a.Source())
	}
	if uint64(len(b)) != a.Size || wire.Digest(b) != a.Digest {
		return dst[:0], fmt.Errorf("%w: %q", errDigest, a.Key)
	}
	return append(dst[:0], b...), nil
}

func (n *memAsyncNet) SetStatus(uint64, float32) {}

// MemGossipNet is a train.GossipNet over an average.MemNetwork, for tests
// and simulations. Dead, if set, reports peers to treat as not alive.
type MemGossipNet struct {
	Net  *average.MemNetwork
	ID   peerid.ID
	Dead func(peerid.ID) bool
	// Board, if set, carries the peers' step counts (train.GossipProgress);
	// the peers of one network share it.
	Board *StepBoard
}

var (
	_ train.AsyncNet       = (*memAsyncNet)(nil)
	_ train.GossipNet      = (*MemGossipNet)(nil)
	_ train.GossipProgress = (*MemGossipNet)(nil)
)

// StepBoard holds the step counts of the peers of a MemGossipNet.
type StepBoard struct {
	mu    sync.Mutex
	steps map[peerid.ID]int
}

// SetSteps implements train.GossipProgress (a no-op without a Board).
func (n *MemGossipNet) SetSteps(steps int) {
	if n.Board == nil {
		return
	}
	n.Board.set(n.ID, steps, false)
}

// set records p's steps; with first, only if p has none yet.
func (b *StepBoard) set(p peerid.ID, steps int, first bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.steps == nil {
		b.steps = map[peerid.ID]int{}
	}
	if _, ok := b.steps[p]; !first || !ok {
		b.steps[p] = steps
	}
}

// Steps implements train.GossipProgress: what p last set, if p is alive.
func (n *MemGossipNet) Steps(p peerid.ID) (int, bool) {
	if n.Board == nil || !n.Alive(p) {
		return 0, false
	}
	n.Board.mu.Lock()
	defer n.Board.mu.Unlock()
	s, ok := n.Board.steps[p]
	return s, ok
}

// Self implements train.GossipNet.
func (n *MemGossipNet) Self() peerid.ID { return n.ID }

// Alive implements train.GossipNet.
func (n *MemGossipNet) Alive(p peerid.ID) bool { return n.Dead == nil || !n.Dead(p) }

// Bind implements train.GossipNet. With a Board, the peer counts from
// then on at step 0 until it sets its steps, as swarm.StreamNet's peers do
// from their first heartbeat: a passive peer done before an active one's
// first step waits for it.
func (n *MemGossipNet) Bind(h average.Handler, _ int) average.Exchanger {
	ex := n.Net.Join(n.ID, h)
	if n.Board != nil {
		n.Board.set(n.ID, 0, true)
	}
	return ex
}

// Links is a table of connections between the members of a MemBus, for
// tests of what a peer pulls from: Wrap gives a member's net Connected
// (train.AsyncLinks), and a fetch from a peer it had no connection with
// opens one, both ways, as a libp2p dial does. Safe for concurrent use.
type Links struct {
	mu    sync.Mutex
	conn  map[[2]peerid.ID]bool
	pulls map[[2]peerid.ID]int // (puller, source) → fetches
}

// NewLinks returns a table with a connection between each pair given.
func NewLinks(pairs ...[2]peerid.ID) *Links {
	l := &Links{conn: map[[2]peerid.ID]bool{}, pulls: map[[2]peerid.ID]int{}}
	for _, p := range pairs {
		l.connect(p[0], p[1])
	}
	return l
}

func (l *Links) connect(a, b peerid.ID) {
	l.conn[[2]peerid.ID{a, b}], l.conn[[2]peerid.ID{b, a}] = true, true
}

// Connected reports whether a and b have a connection.
func (l *Links) Connected(a, b peerid.ID) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.conn[[2]peerid.ID{a, b}]
}

// Pairs returns the number of connected pairs.
func (l *Links) Pairs() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conn) / 2
}

// Sources returns how many fetches puller made from each source.
func (l *Links) Sources(puller peerid.ID) map[peerid.ID]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := map[peerid.ID]int{}
	for k, n := range l.pulls {
		if k[0] == puller {
			m[k[1]] = n
		}
	}
	return m
}

// Wrap returns n with Connected from the table; its fetches connect.
func (l *Links) Wrap(n train.AsyncNet) train.AsyncNet { return &linkedNet{AsyncNet: n, l: l} }

type linkedNet struct {
	train.AsyncNet
	l *Links
}

var _ train.AsyncLinks = (*linkedNet)(nil)

func (n *linkedNet) Connected(p peerid.ID) bool { return n.l.Connected(n.Self(), p) }

func (n *linkedNet) Fetch(ctx context.Context, a *wire.Announcement, dst []byte) ([]byte, error) {
	n.l.mu.Lock()
	n.l.connect(n.Self(), a.Source())
	n.l.pulls[[2]peerid.ID{n.Self(), a.Source()}]++
	n.l.mu.Unlock()
	return n.AsyncNet.Fetch(ctx, a, dst)
}
