// Package p2p runs aggregate's all-reduce over node/'s libp2p tensor
// streams: Transport adapts a *node.Node to aggregate.Transport.
//
// Each chunk is one node.Tensor: raw little-endian float32 (codec fp32,
// dtype float32, shape [len]), received straight into the driver's buffer
// when its Recv is posted first. node/ matches tensors by (peer, 64-bit
// tag) only, so the tag packs what must match and the frame's other fields
// carry what must be compared:
//
//	node.Tag      = round mod 2^16 <<48 | attempt mod 2^8 <<40 | step <<32 | chunk
//	node.Version  = round (checked on receipt)
//	node.Step     = group digest (a mismatch is an *aggregate.MismatchError)
//
// Peers are named by the string form of their libp2p peer ID (ID).
//
//	n, _ := node.New(ctx, node.DefaultConfig())
//	r, _ := aggregate.NewRunner(p2p.ID(n.ID()), p2p.New(n), aggregate.DefaultConfig())
//
// Transport implements aggregate.Scoper through node's admission hook:
// chunks of the current round and attempt from peers outside its group,
// and chunks of earlier rounds and attempts, are drained unread as they
// arrive (never parked), and the outsiders are reported in
// Result.Rejected. Tensors that are not all-reduce chunks (another dtype,
// codec or step) pass untouched.
//
// A Recv from a peer whose last connection closed and did not come back
// within DisconnectGrace fails with aggregate.ErrDisconnected instead of
// waiting out the driver's stall timeout: a killed process is known to be
// gone within half a second. A tensor that had fully arrived is still
// delivered.
package p2p

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/protocol/ping"

	"github.com/starling-ml/starling/aggregate"
	"github.com/starling-ml/starling/compression"
	"github.com/starling-ml/starling/node"
	"github.com/starling-ml/starling/peerid"
)

// Transport is an aggregate.Transport over a node. Safe for concurrent use.
//
// Votes travel on a Link of their own per peer, apart from the data, so
// that a vote never waits behind data chunks on a pooled stream.
type Transport struct {
	n      *node.Node
	ids    sync.Map           // peerid.ID → peer.ID
	scope  *aggregate.Mailbox // scope decisions only; nothing is delivered to it
	unhook func()

	mu     sync.Mutex
	closed bool
	links  map[peer.ID]*node.Link
	life   map[peer.ID]*peerLife
	notify *network.NotifyBundle
}

// peerLife ends, with cause errGone, DisconnectGrace after the last
// connection to a peer closed, unless a new one opened meanwhile.
type peerLife struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	ending *time.Timer // running during the grace
}

// DisconnectGrace is how long after a peer's last connection closed its
// Recvs fail with aggregate.ErrDisconnected. What it sent before closing
// (a peer that finished the job and exits) may still be on its way
// through the node's stream handlers when the connection's close is
// reported.
const DisconnectGrace = 500 * time.Millisecond

var errGone = errors.New("p2p: the peer's last connection closed")

var (
	_ aggregate.Transport = (*Transport)(nil)
	_ aggregate.Scoper    = (*Transport)(nil)
)

// New returns a Transport over n. The node stays the caller's to close;
// Close the Transport first.
func New(n *node.Node) *Transport {
	t := &Transport{n: n, links: map[peer.ID]*node.Link{}, life: map[peer.ID]*peerLife{}, scope: aggregate.NewMailbox(0)}
	t.unhook = n.AddAdmit(t.admit)
	t.notify = &network.NotifyBundle{
		ConnectedF: func(_ network.Network, c network.Conn) { t.connected(c.RemotePeer()) },
		DisconnectedF: func(nw network.Network, c network.Conn) {
			if p := c.RemotePeer(); nw.Connectedness(p) != network.Connected {
				t.disconnected(p)
			}
		},
	}
	nw := n.Host().Network()
	nw.Notify(t.notify)
	for _, p := range nw.Peers() { // connected before New
		t.connected(p)
	}
	return t
}

// connected starts a new life for p unless one is running.
func (t *Transport) connected(p peer.ID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	l := t.life[p]
	switch {
	case t.life == nil:
	case l != nil && l.ctx.Err() == nil:
		if l.ending != nil && l.ending.Stop() {
			l.ending = nil // back within the grace: the same life goes on
		}
	default:
		ctx, cancel := context.WithCancelCause(context.Background())
		t.life[p] = &peerLife{ctx: ctx, cancel: cancel}
	}
}

// disconnected ends p's life after DisconnectGrace.
func (t *Transport) disconnected(p peer.ID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if l := t.life[p]; l != nil && l.ending == nil {
		l.ending = time.AfterFunc(DisconnectGrace, func() { l.cancel(errGone) })
	}
}

// lifeOf returns the context of p's current life, or nil if p was not
// seen connected since New.
func (t *Transport) lifeOf(p peer.ID) context.Context {
	t.mu.Lock()
	defer t.mu.Unlock()
	if l := t.life[p]; l != nil {
		return l.ctx
	}
	return nil
}

// Close closes the control links and removes the admission hook. Later
// Sends fail with ErrClosed.
func (t *Transport) Close() error {
	t.n.Host().Network().StopNotify(t.notify)
	t.mu.Lock()
	links := t.links
	t.links, t.closed = nil, true
	for _, l := range t.life {
		l.cancel(context.Canceled)
	}
	t.life = nil
	t.mu.Unlock()
	for _, l := range links {
		l.Close()
	}
	t.unhook()
	return nil
}

// Scope implements aggregate.Scoper.
func (t *Transport) Scope(g aggregate.Group) { t.scope.Scope(g) }

// LatestAttempt reports the latest attempt of round that a member of the
// scoped group sent chunks for, if later than the scope's (see
// aggregate.Mailbox.LatestAttempt).
func (t *Transport) LatestAttempt(round uint64) (uint16, bool) { return t.scope.LatestAttempt(round) }

// InGroup reports whether p is a member of the scoped group (the current
// round's).
func (t *Transport) InGroup(p peer.ID) bool { return t.scope.InGroup(ID(p)) }

// Rejected implements aggregate.Scoper.
func (t *Transport) Rejected(round uint64) []*aggregate.PeerError { return t.scope.Rejected(round) }

// admit is node's admission hook: it refuses all-reduce chunks that the
// current scope refuses (see aggregate.Mailbox.Admit).
func (t *Transport) admit(from peer.ID, tn *node.Tensor) error {
	tag, ok := chunkTag(tn)
	if !ok {
		return nil
	}
	return t.scope.Admit(ID(from), tag)
}

// chunkTag recovers a chunk's aggregate.Tag from a tensor's metadata, or
// reports that the tensor is not an all-reduce chunk. The attempt is known
// modulo 256 (MaxAttempts is at most 255).
func chunkTag(tn *node.Tensor) (aggregate.Tag, bool) {
	step := aggregate.Step(tn.Tag >> 32 & 0xff)
	if tn.Codec != compression.IDFP32 || tn.DType != node.Float32 || len(tn.Shape) != 1 ||
		step == 0 || uint64(tn.Tag>>48) != tn.Version&0xffff {
		return aggregate.Tag{}, false
	}
	return aggregate.Tag{Round: tn.Version, Digest: tn.Step, Attempt: uint16(tn.Tag >> 40 & 0xff), Step: step, Chunk: uint32(tn.Tag)}, true
}

// link returns the control link to p, opening it if needed.
func (t *Transport) link(ctx context.Context, p peer.ID) (*node.Link, error) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, aggregate.ErrClosed
	}
	if l := t.links[p]; l != nil {
		t.mu.Unlock()
		return l, nil
	}
	t.mu.Unlock()
	l, err := t.n.Link(ctx, p, 1)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		l.Close()
		return nil, aggregate.ErrClosed
	}
	if old := t.links[p]; old != nil {
		l.Close()
		return old, nil
	}
	t.links[p] = l
	return l, nil
}

// dropLink forgets a link whose stream failed.
func (t *Transport) dropLink(p peer.ID, l *node.Link) {
	t.mu.Lock()
	if t.links[p] == l {
		delete(t.links, p)
	}
	t.mu.Unlock()
	l.Close()
}

// ID returns the peerid.ID of a libp2p peer. It is asked for every
// stripe received (who may park it), and base58 costs a microsecond or
// more, so the first maxIDs peers' IDs are kept.
func ID(p peer.ID) peerid.ID {
	if v, ok := encoded.Load(p); ok {
		return v.(peerid.ID)
	}
	id := peerid.ID(p.String())
	if encodedN.Add(1) <= maxIDs {
		encoded.Store(p, id)
	}
	return id
}

var (
	encoded  sync.Map // peer.ID → peerid.ID
	encodedN atomic.Int64
)

const maxIDs = 1 << 14

// Self returns the node's own peerid.ID.
func (t *Transport) Self() peerid.ID { return ID(t.n.ID()) }

func (t *Transport) peerID(p peerid.ID) (peer.ID, error) {
	if v, ok := t.ids.Load(p); ok {
		return v.(peer.ID), nil
	}
	id, err := peer.Decode(string(p))
	if err != nil {
		return "", fmt.Errorf("%w: %q is not a libp2p peer id: %v", aggregate.ErrUnreachable, p, err)
	}
	t.ids.Store(p, id)
	return id, nil
}

// nodeTag packs the matched fields of tag into node/'s 64-bit tag.
func nodeTag(tag aggregate.Tag) node.Tag {
	return node.Tag(tag.Round&0xffff)<<48 | node.Tag(tag.Attempt&0xff)<<40 | node.Tag(tag.Step&0xff)<<32 | node.Tag(tag.Chunk)
}

// Send implements aggregate.Transport.
func (t *Transport) Send(ctx context.Context, to peerid.ID, tag aggregate.Tag, data []float32) error {
	return t.send(ctx, to, tag, data, nil)
}

// send is Send, with node's checksums of data if known.
func (t *Transport) send(ctx context.Context, to peerid.ID, tag aggregate.Tag, data []float32, sums []uint32) error {
	pid, err := t.peerID(to)
	if err != nil {
		return err
	}
	payload, release := asBytes(data, true)
	defer release()
	tn := node.Tensor{
		Tag: nodeTag(tag), Codec: compression.IDFP32, DType: node.Float32, Shape: []int{len(data)},
		Version: tag.Round, Step: tag.Digest, Payload: payload, Checksums: sums,
	}
	if tag.Step != aggregate.StepVote {
		return sendErr(to, t.n.Send(ctx, pid, tn))
	}
	for try := 0; ; try++ {
		l, err := t.link(ctx, pid)
		if err != nil {
			return sendErr(to, err)
		}
		err = l.Send(ctx, tn)
		if err == nil || try == 1 || ctx.Err() != nil {
			return sendErr(to, err)
		}
		t.dropLink(pid, l) // its stream broke: one more try on a fresh one
	}
}

// Recv implements aggregate.Transport.
func (t *Transport) Recv(ctx context.Context, from peerid.ID, tag aggregate.Tag, dst []float32) error {
	_, err := t.RecvFinite(ctx, from, tag, dst)
	return err
}

// RecvFinite implements aggregate.FiniteReceiver: Recv, and whether node
// checked the chunk free of NaN and ±Inf (node.Tensor.Finite).
func (t *Transport) RecvFinite(ctx context.Context, from peerid.ID, tag aggregate.Tag, dst []float32) (bool, error) {
	tn, err := t.recv(ctx, from, tag, dst, nil)
	return tn.Finite, err
}

// RecvAxpy implements aggregate.AxpyReceiver with node.RecvAxpy, and
// keeps node's checksums (Tensor.Checksums), on little-endian machines;
// elsewhere it is RecvFinite.
func (t *Transport) RecvAxpy(ctx context.Context, from peerid.ID, tag aggregate.Tag, dst []float32, alpha float32, x []float32) (aggregate.Received, error) {
	var ax *node.Axpy
	if littleEndian && x != nil {
		ax = &node.Axpy{Alpha: alpha, X: x}
	}
	tn, err := t.recv(ctx, from, tag, dst, ax)
	r := aggregate.Received{Summed: tn.Summed, In: tn.Finite, Out: tn.SumFinite}
	if littleEndian && err == nil {
		r.Sums = tn.Checksums
	}
	return r, err
}

// SendReceived implements aggregate.AxpyReceiver: Send with node's
// checksums of data (Tensor.Checksums).
func (t *Transport) SendReceived(ctx context.Context, to peerid.ID, tag aggregate.Tag, data []float32, sums aggregate.Checksums) error {
	if !littleEndian {
		sums = nil // of the wire's bytes, not of data's
	}
	return t.send(ctx, to, tag, data, sums)
}

// recv is RecvFinite, and RecvAxpy's node.RecvAxpy with ax.
func (t *Transport) recv(ctx context.Context, from peerid.ID, tag aggregate.Tag, dst []float32, ax *node.Axpy) (node.Tensor, error) {
	pid, err := t.peerID(from)
	if err != nil {
		return node.Tensor{}, err
	}
	if life := t.lifeOf(pid); life != nil {
		rctx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		defer context.AfterFunc(life, func() { cancel(errGone) })()
		ctx = rctx
	}
	buf, release := asBytes(dst, false)
	var tn node.Tensor
	if ax != nil {
		tn, err = t.n.RecvAxpy(ctx, pid, nodeTag(tag), buf, *ax)
	} else {
		tn, err = t.n.Recv(ctx, pid, nodeTag(tag), buf)
	}
	if err != nil && context.Cause(ctx) == errGone {
		release()
		return node.Tensor{}, &aggregate.PeerError{Peer: from, Err: fmt.Errorf("%w: chunk %v", aggregate.ErrDisconnected, tag)}
	}
	if err == nil && !littleEndian {
		fromLE(dst, tn.Payload)
	}
	release()
	if err != nil {
		return node.Tensor{}, recvErr(from, tag, err)
	}
	switch {
	case tn.Codec != compression.IDFP32 || tn.DType != node.Float32:
		return node.Tensor{}, &aggregate.PeerError{Peer: from, Err: fmt.Errorf("%w: chunk %v has codec %d dtype %v, want raw float32", aggregate.ErrBadValue, tag, tn.Codec, tn.DType)}
	case len(tn.Payload) != 4*len(dst):
		return node.Tensor{}, &aggregate.PeerError{Peer: from, Err: fmt.Errorf("%w: chunk %v has %d bytes, want %d", aggregate.ErrBadLength, tag, len(tn.Payload), 4*len(dst))}
	case tn.Version != tag.Round:
		return node.Tensor{}, fmt.Errorf("%w: chunk %v from %s carries round %d", aggregate.ErrStale, tag, from, tn.Version)
	case tn.Step != tag.Digest:
		return node.Tensor{}, &aggregate.MismatchError{Peer: from, Got: tn.Step, Want: tag.Digest}
	}
	return tn, nil
}

// Probe implements aggregate.Prober with a libp2p ping, which the peer's
// host answers whatever its all-reduce waits for; a frozen or cut-off
// process does not. A dial that fails is ErrUnreachable.
func (t *Transport) Probe(ctx context.Context, p peerid.ID) error {
	pid, err := t.peerID(p)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	select {
	case res, ok := <-ping.Ping(ctx, t.n.Host(), pid):
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case !ok:
			return fmt.Errorf("aggregate/p2p: ping %s ended without an answer", pid)
		case res.Error != nil && t.n.Host().Network().Connectedness(pid) != network.Connected:
			return &aggregate.PeerError{Peer: p, Err: fmt.Errorf("%w: ping: %w", aggregate.ErrUnreachable, res.Error)}
		}
		return res.Error
	case <-ctx.Done():
		return ctx.Err()
	}
}

func sendErr(to peerid.ID, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, node.ErrClosed), errors.Is(err, aggregate.ErrClosed):
		return fmt.Errorf("%w: %w", aggregate.ErrClosed, err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	}
	return &aggregate.PeerError{Peer: to, Err: fmt.Errorf("%w: %w", aggregate.ErrUnreachable, err)}
}

func recvErr(from peerid.ID, tag aggregate.Tag, err error) error {
	switch {
	case errors.Is(err, node.ErrClosed):
		return fmt.Errorf("%w: %w", aggregate.ErrClosed, err)
	case errors.Is(err, node.ErrReset), errors.Is(err, node.ErrTimeout), errors.Is(err, node.ErrTruncated):
		// The sender gave up or vanished mid-transfer. (When our own ctx
		// ends, node/ returns ctx's error instead.)
		return &aggregate.PeerError{Peer: from, Err: fmt.Errorf("%w: chunk %v: %w", aggregate.ErrUnreachable, tag, err)}
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	case errors.Is(err, node.ErrShortBuffer), errors.Is(err, node.ErrShapeMismatch):
		return &aggregate.PeerError{Peer: from, Err: fmt.Errorf("%w: chunk %v: %w", aggregate.ErrBadLength, tag, err)}
	}
	// Frame errors: bad checksum, header, codec, a truncated frame.
	return &aggregate.PeerError{Peer: from, Err: fmt.Errorf("%w: chunk %v: %w", aggregate.ErrBadValue, tag, err)}
}

var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// asBytes views x as little-endian bytes: the same memory on little-endian
// machines, a converted copy (filled when fill is set) elsewhere.
func asBytes(x []float32, fill bool) ([]byte, func()) {
	if len(x) == 0 {
		return []byte{}, func() {}
	}
	if littleEndian {
		return unsafe.Slice((*byte)(unsafe.Pointer(&x[0])), 4*len(x)), func() {}
	}
	b := make([]byte, 4*len(x))
	if fill {
		for i, v := range x {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
		}
	}
	return b, func() {}
}

func fromLE(dst []float32, b []byte) {
	for i := range min(len(dst), len(b)/4) {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
}
