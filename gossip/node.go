package gossip

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/starling-ml/starling/compression"
	"github.com/starling-ml/starling/gossip/average"
	"github.com/starling-ml/starling/gossip/wire"
	"github.com/starling-ml/starling/node"
	"github.com/starling-ml/starling/peerid"
)

// Errors of the node/ transport; match them with errors.Is.
var (
	// ErrRefused: the remote peer read the request and refused it (a NACK:
	// wrong model, wrong length, unknown key, handler error). Its reason is
	// in the message. A refused push or swap was certainly not applied, so
	// the error also wraps average.ErrNotDelivered.
	ErrRefused = errors.New("gossip: refused by peer")
	// ErrDigest: fetched bytes do not match the announcement's Size or
	// SHA-256 Digest; they are discarded.
	ErrDigest = errors.New("gossip: fetched bytes do not match the announcement")
	// ErrBadFrame: a gossip frame on a tensor stream that does not decode.
	ErrBadFrame = errors.New("gossip: malformed gossip frame")
)

// NodeConfig configures a NodeTransport.
type NodeConfig struct {
	// Model is the model id. Pushes and swaps carry its 64-bit hash, and a
	// peer training another model refuses them.
	Model string
	// ReplyTimeout bounds how long the serving side spends sending one
	// reply (an ack, a swapped model, fetched bytes). 30 s moves 100 MB at
	// 30 Mbit/s; a requester that gave up earlier just never reads it.
	ReplyTimeout time.Duration
	// MaxServed is how many vectors Serve keeps; older keys are forgotten
	// (fetches of them are refused). 8 keeps a few rounds of history for
	// late fetchers.
	MaxServed int
	// MaxFetchBytes caps what Fetch accepts to pull, whatever an
	// announcement claims. 1 GiB; node.Config.MaxTensorBytes caps it too.
	MaxFetchBytes int64
}

// DefaultNodeConfig returns the defaults documented on NodeConfig.
func DefaultNodeConfig() NodeConfig {
	return NodeConfig{Model: "default", ReplyTimeout: 30 * time.Second, MaxServed: 8, MaxFetchBytes: 1 << 30}
}

// Validate reports whether c is usable. It does not modify c.
func (c NodeConfig) Validate() error {
	switch {
	case c.Model == "" || len(c.Model) > wire.MaxModelIDLen:
		return fmt.Errorf("%w: model id %q must have 1..%d bytes", ErrBadConfig, c.Model, wire.MaxModelIDLen)
	case c.ReplyTimeout <= 0:
		return fmt.Errorf("%w: reply timeout %v must be > 0", ErrBadConfig, c.ReplyTimeout)
	case c.MaxServed < 1:
		return fmt.Errorf("%w: max served %d < 1", ErrBadConfig, c.MaxServed)
	case c.MaxFetchBytes < 1:
		return fmt.Errorf("%w: max fetch bytes %d < 1", ErrBadConfig, c.MaxFetchBytes)
	}
	return nil
}

// Gossip requests ride node/'s tensor streams as raw byte tensors (codec
// fp32, dtype uint8, shape [len]) that start with a fixed header,
// little-endian:
//
//	off size field
//	0   2    magic "GX"
//	2   1    format version (1)
//	3   1    kind: push, swap or fetch
//	4   4    n: float32 count (push, swap) or key length (fetch)
//	8   8    seq: the request's number, echoed by the reply
//	16  8    FNV-1a 64 hash of the model id
//	24  8    step (push-sum graph step)
//	32  8    version (the sender's model version)
//	40  8    weight (float64 bits; push-sum W)
//	48  …    body: n float32s or the key
//
// Requests go to fixed node tags (one per kind) and are received from any
// peer. A reply goes back under a tag that carries the request's seq, so
// concurrent exchanges never see each other's replies; its tensor's Step
// field says what it is (ack, refusal, swapped model, served bytes), its
// Version field repeats the seq, and its payload is the bare body (a
// refusal's reason, the float32s, the served bytes), so a fetch is
// received straight into the caller's buffer.
const (
	frameHeaderLen = 48
	frameVersion   = 1

	kindPush      = 1
	kindSwap      = 2
	kindFetch     = 3
	kindAck       = 4
	kindRefuse    = 5
	kindSwapReply = 6
	kindData      = 7

	// tagPrefix marks gossip's node tags. node/ matches tags only, so the
	// top 16 bits keep gossip's frames apart from other protocols that
	// use small tags; aggregate/p2p puts round mod 2^16 there, so the two
	// must not share a node while an all-reduce reaches round 0x6758.
	tagPrefix node.Tag = 0x6758 << 48 // "gX"
	tagReplyK          = 0xff
	seqMask            = 1<<40 - 1
	maxReason          = 256
)

func requestTag(kind byte) node.Tag { return tagPrefix | node.Tag(kind)<<40 }
func replyTag(seq uint64) node.Tag  { return tagPrefix | tagReplyK<<40 | node.Tag(seq&seqMask) }

// ModelHash is the 64-bit FNV-1a hash of a model id that gossip frames
// carry.
func ModelHash(model string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(model))
	return h.Sum64()
}

type frame struct {
	kind    byte
	n       uint32
	seq     uint64
	model   uint64
	step    uint64
	version uint64
	weight  float64
	body    []byte
}

func appendFrameHeader(dst []byte, f *frame) []byte {
	dst = append(dst, 'G', 'X', frameVersion, f.kind)
	dst = binary.LittleEndian.AppendUint32(dst, f.n)
	dst = binary.LittleEndian.AppendUint64(dst, f.seq)
	dst = binary.LittleEndian.AppendUint64(dst, f.model)
	dst = binary.LittleEndian.AppendUint64(dst, f.step)
	dst = binary.LittleEndian.AppendUint64(dst, f.version)
	return binary.LittleEndian.AppendUint64(dst, math.Float64bits(f.weight))
}

// appendF32 appends x as little-endian float32s.
func appendF32(dst []byte, x []float32) []byte {
	for _, v := range x {
		dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(v))
	}
	return dst
}

// decodeFrame parses b's header and checks that the body matches its kind.
// f.body aliases b.
func decodeFrame(b []byte) (frame, error) {
	var f frame
	if len(b) < frameHeaderLen {
		return f, fmt.Errorf("%w: %d bytes, header is %d", ErrBadFrame, len(b), frameHeaderLen)
	}
	if b[0] != 'G' || b[1] != 'X' {
		return f, fmt.Errorf("%w: bad magic", ErrBadFrame)
	}
	if b[2] != frameVersion {
		return f, fmt.Errorf("%w: format version %d", ErrBadFrame, b[2])
	}
	f.kind = b[3]
	f.n = binary.LittleEndian.Uint32(b[4:])
	f.seq = binary.LittleEndian.Uint64(b[8:])
	f.model = binary.LittleEndian.Uint64(b[16:])
	f.step = binary.LittleEndian.Uint64(b[24:])
	f.version = binary.LittleEndian.Uint64(b[32:])
	f.weight = math.Float64frombits(binary.LittleEndian.Uint64(b[40:]))
	f.body = b[frameHeaderLen:]
	var want int
	switch f.kind {
	case kindPush, kindSwap:
		want = 4 * int(f.n)
	case kindFetch:
		if f.n > wire.MaxKeyLen {
			return f, fmt.Errorf("%w: key of %d bytes", ErrBadFrame, f.n)
		}
		want = int(f.n)
	default:
		return f, fmt.Errorf("%w: unknown kind %d", ErrBadFrame, f.kind)
	}
	if len(f.body) != want {
		return f, fmt.Errorf("%w: kind %d body has %d bytes, header says %d", ErrBadFrame, f.kind, len(f.body), want)
	}
	return f, nil
}

// decodeF32 decodes f's body into a new slice of f.n float32s.
func (f *frame) floats() []float32 {
	x := make([]float32, f.n)
	for i := range x {
		x[i] = math.Float32frombits(binary.LittleEndian.Uint32(f.body[4*i:]))
	}
	return x
}

// NodeStats counts what a NodeTransport did. Refusals are requests this
// peer refused; the reasons say why.
type NodeStats struct {
	PushesIn, SwapsIn, FetchesIn uint64 // requests served successfully
	RefusedModel                 uint64 // another model's hash
	RefusedShape                 uint64 // a vector of the wrong length
	RefusedHandler               uint64 // no handler bound, or it returned an error
	RefusedKey                   uint64 // fetch of a key not (or no longer) served
	BadFrames                    uint64 // requests that did not decode or fit the buffer
	ReplyFailures                uint64 // replies that could not be sent in ReplyTimeout
}

type nodeCounters struct {
	pushesIn, swapsIn, fetchesIn                         atomic.Uint64
	refModel, refShape, refHandler, refKey, bad, replies atomic.Uint64
}

// NodeTransport moves gossip's vectors over node/'s tensor streams: it is
// the average.Exchanger of push-sum and AD-PSGD, and it serves and fetches
// the vectors that delta announcements point at. Peers are named by
// peerid.ID and converted to libp2p's IDs here. Vectors are raw float32 in a
// small gossip frame (see frame header above); fetched bytes are whatever
// the holder served (a compression encoding, typically) and are checked
// against the announcement's Size and SHA-256.
//
// Every call is bounded by its ctx; every reply the transport sends is
// bounded by ReplyTimeout; the partner of an exchange is protected from the
// connection manager while it runs. Safe for concurrent use. Close stops
// the serving goroutines and waits for them; the node stays the caller's.
type NodeTransport struct {
	n     *node.Node
	cfg   NodeConfig
	model uint64

	bound atomic.Pointer[binding]
	seq   atomic.Uint64

	mu     sync.Mutex
	served map[string][]byte
	order  []string

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	stats  nodeCounters
}

type binding struct {
	h   average.Handler
	dim int
}

var _ average.Exchanger = (*NodeTransport)(nil)

// NewNodeTransport starts serving gossip requests on n. Pushes and swaps
// are refused until Bind installs a handler; fetches are served from what
// Serve stored.
func NewNodeTransport(n *node.Node, cfg NodeConfig) (*NodeTransport, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if n == nil {
		return nil, fmt.Errorf("%w: nil node", ErrBadConfig)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t := &NodeTransport{n: n, cfg: cfg, model: ModelHash(cfg.Model), served: make(map[string][]byte), ctx: ctx, cancel: cancel}
	// Reply tags carry the seq: start at a random point so that a restarted
	// peer does not pick up replies meant for its previous incarnation.
	t.seq.Store(rand.Uint64() & seqMask)
	for _, k := range []byte{kindPush, kindSwap, kindFetch} {
		t.wg.Add(1)
		go t.serve(k)
	}
	return t, nil
}

// Bind installs the handler of incoming pushes and swaps, for vectors of
// dim values; requests of another length are refused. It may be called
// again to replace the handler.
func (t *NodeTransport) Bind(h average.Handler, dim int) {
	if h == nil {
		t.bound.Store(nil)
		return
	}
	t.bound.Store(&binding{h: h, dim: dim})
}

// Connected reports whether this peer has a connection with p now (a
// fetch from it dials none).
func (t *NodeTransport) Connected(p peerid.ID) bool {
	id, err := libp2pID(p)
	return err == nil && t.n.Host().Network().Connectedness(id) == network.Connected
}

// Self returns the node's peer ID.
func (t *NodeTransport) Self() peerid.ID { return idOf(t.n.ID()) }

// Stats returns a snapshot of the counters.
func (t *NodeTransport) Stats() NodeStats {
	c := &t.stats
	return NodeStats{
		PushesIn: c.pushesIn.Load(), SwapsIn: c.swapsIn.Load(), FetchesIn: c.fetchesIn.Load(),
		RefusedModel: c.refModel.Load(), RefusedShape: c.refShape.Load(), RefusedHandler: c.refHandler.Load(),
		RefusedKey: c.refKey.Load(), BadFrames: c.bad.Load(), ReplyFailures: c.replies.Load(),
	}
}

// Close stops serving and waits for the goroutines it owns. Calls in flight
// fail with their ctx or the node's errors. Idempotent.
func (t *NodeTransport) Close() error {
	t.cancel()
	t.wg.Wait()
	return nil
}

func (t *NodeTransport) nextSeq() uint64 { return t.seq.Add(1) & seqMask }

// protect keeps p's connections from the connection manager until the
// returned func runs. Each exchange has its own tag, so overlapping ones
// with one peer do not unprotect each other.
func (t *NodeTransport) protect(p peer.ID, seq uint64) func() {
	tag := fmt.Sprintf("starling-gossip-%d", seq)
	t.n.Protect(p, tag)
	return func() { t.n.Unprotect(p, tag) }
}

func rawTensor(tag node.Tag, f *frame, payload []byte) node.Tensor {
	return node.Tensor{Tag: tag, Codec: compression.IDFP32, DType: node.Uint8, Shape: []int{len(payload)},
		Version: f.version, Step: f.step, Payload: payload}
}

// request sends a request frame to p and waits for the reply, received
// into rbuf (grown to at least maxReply bytes). It returns the reply's kind
// and body (aliasing rbuf). A failed send means the remote cannot have read
// the whole frame (node/ hands a tensor over only after its trailing
// checksum), so it is reported as average.ErrNotDelivered; so is a refusal.
func (t *NodeTransport) request(ctx context.Context, p peer.ID, kind byte, f *frame, body []float32, key []byte, rbuf []byte, maxReply int) (byte, []byte, error) {
	f.kind, f.seq, f.model = kind, t.nextSeq(), t.model
	defer t.protect(p, f.seq)()
	buf := make([]byte, 0, frameHeaderLen+4*len(body)+len(key))
	buf = appendFrameHeader(buf, f)
	buf = appendF32(buf, body)
	buf = append(buf, key...)
	if err := t.n.Send(ctx, p, rawTensor(requestTag(kind), f, buf)); err != nil {
		return 0, nil, fmt.Errorf("%w: %w", average.ErrNotDelivered, err)
	}
	if cap(rbuf) < maxReply {
		rbuf = make([]byte, maxReply)
	}
	r, err := t.n.Recv(ctx, p, replyTag(f.seq), rbuf[:cap(rbuf)])
	if err != nil {
		return 0, nil, fmt.Errorf("gossip: waiting for %s's reply: %w", p, err)
	}
	if r.Version != f.seq {
		return 0, nil, fmt.Errorf("gossip: reply from %s: %w: seq %d, want %d", p, ErrBadFrame, r.Version, f.seq)
	}
	rk := byte(r.Step)
	if r.Step == kindRefuse {
		msg := r.Payload[:min(len(r.Payload), maxReason)]
		return rk, nil, fmt.Errorf("%w: %w: %s: %s", average.ErrNotDelivered, ErrRefused, p, string(msg))
	}
	return rk, r.Payload, nil
}

// libp2pID converts id at the transport's edge. An ID that is not a
// libp2p peer ID names no peer the node can reach: nothing is sent.
func libp2pID(id peerid.ID) (peer.ID, error) {
	p, err := peer.Decode(string(id))
	if err != nil {
		return "", fmt.Errorf("%w: %w: %q is not a libp2p peer ID: %v", average.ErrNotDelivered, average.ErrUnknownPeer, id, err)
	}
	return p, nil
}

// Push implements average.Exchanger: the share goes in one frame; the
// remote absorbs it only once the whole frame is verified, then acks.
func (t *NodeTransport) Push(ctx context.Context, to peerid.ID, s average.Share) error {
	p, err := libp2pID(to)
	if err != nil {
		return err
	}
	f := frame{n: uint32(len(s.X)), step: s.Step, version: s.Version, weight: s.W}
	rk, _, err := t.request(ctx, p, kindPush, &f, s.X, nil, nil, maxReason)
	if err != nil {
		return err
	}
	if rk != kindAck {
		return fmt.Errorf("gossip: push to %s: %w: reply kind %d", to, ErrBadFrame, rk)
	}
	return nil
}

// Swap implements average.Exchanger: mine goes to with in one frame; with
// runs HandleSwap and replies with its model from before the averaging. If
// the reply is lost after with averaged, Swap fails and the caller does not
// average: the pair ends half-mixed, which AD-PSGD tolerates.
func (t *NodeTransport) Swap(ctx context.Context, with peerid.ID, mine, theirs []float32) error {
	if len(theirs) != len(mine) {
		return fmt.Errorf("%w: mine %d, theirs %d", average.ErrShape, len(mine), len(theirs))
	}
	p, err := libp2pID(with)
	if err != nil {
		return err
	}
	f := frame{n: uint32(len(mine))}
	rk, body, err := t.request(ctx, p, kindSwap, &f, mine, nil, nil, max(4*len(mine), maxReason))
	if err != nil {
		return err
	}
	if rk != kindSwapReply || len(body) != 4*len(theirs) {
		return fmt.Errorf("gossip: swap with %s: %w: reply kind %d with %d bytes", with, ErrBadFrame, rk, len(body))
	}
	for i := range theirs {
		theirs[i] = math.Float32frombits(binary.LittleEndian.Uint32(body[4*i:]))
	}
	return nil
}

// Serve makes b fetchable under key (copied; the caller keeps b). The
// oldest of more than MaxServed keys is forgotten. Announce after Serve.
func (t *NodeTransport) Serve(key string, b []byte) error {
	if len(key) == 0 || len(key) > wire.MaxKeyLen {
		return fmt.Errorf("%w: key of %d bytes, want 1..%d", ErrBadConfig, len(key), wire.MaxKeyLen)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.served[key]; !ok {
		t.order = append(t.order, key)
	}
	t.served[key] = slices.Clone(b)
	for len(t.order) > t.cfg.MaxServed {
		delete(t.served, t.order[0])
		t.order = t.order[1:]
	}
	return nil
}

// Unserve forgets key.
func (t *NodeTransport) Unserve(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.served, key)
	t.order = slices.DeleteFunc(t.order, func(k string) bool { return k == key })
}

// Fetch pulls the vector a announces from a.Source() and checks it: at
// most a.Size bytes are received (a larger reply fails in node/ before it
// is read), and the bytes must have exactly a.Size length and a.Digest
// SHA-256 (ErrDigest). The result is written to dst[:0] (grown if short)
// and returned.
func (t *NodeTransport) Fetch(ctx context.Context, a *wire.Announcement, dst []byte) ([]byte, error) {
	if int64(a.Size) > t.cfg.MaxFetchBytes {
		return dst[:0], fmt.Errorf("gossip: fetch %q: %w: %d bytes announced, cap %d", a.Key, wire.ErrTooLarge, a.Size, t.cfg.MaxFetchBytes)
	}
	src := a.Source()
	p, err := libp2pID(src)
	if err != nil {
		return dst[:0], fmt.Errorf("gossip: fetch %q: %w", a.Key, err)
	}
	f := frame{n: uint32(len(a.Key))}
	rk, body, err := t.request(ctx, p, kindFetch, &f, nil, []byte(a.Key), dst, max(int(a.Size), maxReason))
	if err != nil {
		return dst[:0], fmt.Errorf("gossip: fetch %q: %w", a.Key, err)
	}
	if rk != kindData {
		return dst[:0], fmt.Errorf("gossip: fetch %q from %s: %w: reply kind %d", a.Key, src, ErrBadFrame, rk)
	}
	if uint64(len(body)) != a.Size {
		return dst[:0], fmt.Errorf("gossip: fetch %q from %s: %w: %d bytes, announced %d", a.Key, src, ErrDigest, len(body), a.Size)
	}
	if wire.Digest(body) != a.Digest {
		return dst[:0], fmt.Errorf("gossip: fetch %q from %s: %w: SHA-256 mismatch", a.Key, src, ErrDigest)
	}
	return body, nil
}

// serve receives requests of one kind from any peer until Close. Fetch
// requests are small and land in a fixed buffer; pushes and swaps are
// received whole (node/ bounds them by MaxTensorBytes) so that a vector of
// the wrong length is refused with a reply rather than reset unread.
func (t *NodeTransport) serve(kind byte) {
	defer t.wg.Done()
	var buf []byte
	if kind == kindFetch {
		buf = make([]byte, frameHeaderLen+wire.MaxKeyLen)
	}
	for {
		r, err := t.n.Recv(t.ctx, "", requestTag(kind), buf)
		switch {
		case err == nil:
		case t.ctx.Err() != nil || errors.Is(err, node.ErrClosed):
			return
		case errors.Is(err, context.DeadlineExceeded):
			continue // node's RecvTimeout: nobody asked for a while
		default:
			// A request that does not fit (node.ErrShortBuffer) or broke
			// mid-transfer: its sender sees a reset or times out.
			t.stats.bad.Add(1)
			continue
		}
		f, err := decodeFrame(r.Payload)
		if err != nil || f.kind != kind {
			t.stats.bad.Add(1)
			continue
		}
		t.handle(r.From, &f)
	}
}

// handle serves one decoded request and sends its reply in the background.
func (t *NodeTransport) handle(from peer.ID, f *frame) {
	kind := byte(kindAck)
	var body []byte
	refuse := func(c *atomic.Uint64, format string, args ...any) {
		c.Add(1)
		kind = kindRefuse
		msg := fmt.Sprintf(format, args...)
		body = []byte(msg[:min(len(msg), maxReason)])
	}
	b := t.bound.Load()
	switch {
	case f.kind != kindFetch && f.model != t.model:
		refuse(&t.stats.refModel, "model hash %#x, this peer trains %q", f.model, t.cfg.Model)
	case f.kind != kindFetch && b == nil:
		refuse(&t.stats.refHandler, "no handler bound")
	case f.kind != kindFetch && int(f.n) != b.dim:
		refuse(&t.stats.refShape, "%d values, model has %d", f.n, b.dim)
	case f.kind == kindPush:
		if err := b.h.HandleShare(average.Share{From: idOf(from), Step: f.step, Version: f.version, X: f.floats(), W: f.weight}); err != nil {
			refuse(&t.stats.refHandler, "%v", err)
			break
		}
		t.stats.pushesIn.Add(1)
	case f.kind == kindSwap:
		mine := make([]float32, b.dim)
		if err := b.h.HandleSwap(idOf(from), f.floats(), mine); err != nil {
			refuse(&t.stats.refHandler, "%v", err)
			break
		}
		t.stats.swapsIn.Add(1)
		kind = kindSwapReply
		body = appendF32(make([]byte, 0, 4*len(mine)), mine)
	case f.kind == kindFetch:
		t.mu.Lock()
		v, ok := t.served[string(f.body)]
		t.mu.Unlock()
		if !ok {
			refuse(&t.stats.refKey, "key %q not served", string(f.body))
			break
		}
		t.stats.fetchesIn.Add(1)
		kind = kindData
		body = v // served values are never modified, only replaced; Send only reads
	}
	seq := f.seq
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		ctx, cancel := context.WithTimeout(t.ctx, t.cfg.ReplyTimeout)
		defer cancel()
		r := node.Tensor{Tag: replyTag(seq), Codec: compression.IDFP32, DType: node.Uint8, Shape: []int{len(body)},
			Version: seq, Step: uint64(kind), Payload: body}
		if err := t.n.Send(ctx, from, r); err != nil {
			t.stats.replies.Add(1)
		}
	}()
}
