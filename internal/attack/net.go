package attack

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"

	"github.com/starling-ml/starling/compression"
	"github.com/starling-ml/starling/gossip/average"
	"github.com/starling-ml/starling/gossip/wire"
	"github.com/starling-ml/starling/peerid"
	"github.com/starling-ml/starling/train"
)

// Announcer sends an announcement on the control plane
// (gossip.ControlPlane.Announce); flood uses it.
type Announcer func(ctx context.Context, a wire.Announcement) error

// flooder sends flood's announcements: vectors of the real one's kind and
// length, claiming Size times its bytes, under keys nobody serves. It
// holds nothing per announcement.
type flooder struct {
	a   Attack
	ann Announcer
	rng *rand.Rand
	n   uint64
}

func (f *flooder) flood(ctx context.Context, like wire.Announcement, bytes int) {
	if f.a.Kind != Flood || f.ann == nil {
		return
	}
	like.Size = min(uint64(max(bytes, 1))*uint64(f.a.Size), wire.MaxPullSize)
	for range f.a.Count {
		f.n++
		x := like
		x.Key = fmt.Sprintf("flood/%d", f.n)
		x.Holder = ""
		for i := range x.Digest {
			x.Digest[i] = byte(f.rng.Uint32())
		}
		if f.ann(ctx, x) != nil {
			return
		}
	}
}

// Net is a train.Net (federated and sync rounds) whose all-reduce
// contributions are attacked. Safe for concurrent use.
type Net struct {
	train.Net
	models bool

	mu  sync.Mutex
	t   *Transformer
	f   flooder
	ref []float32 // models: the last all-reduce result (the round's start)
	buf []float32
}

var _ train.Net = (*Net)(nil)

// WrapNet returns n with every AllReduce contribution passed through t.
// models says the contributions are models (federated rounds), measured
// from the last all-reduce result, or from init before the first when
// their lengths agree (else from zero); gradients (sync) are measured
// from zero. ann, if not nil, carries flood's announcements.
func WrapNet(n train.Net, t *Transformer, models bool, init []float32, ann Announcer) *Net {
	w := &Net{Net: n, models: models, t: t, f: flooder{a: t.a, ann: ann, rng: rand.New(rand.NewPCG(2, 3))}}
	if models && init != nil {
		w.ref = append([]float32(nil), init...)
	}
	return w
}

// AllReduce implements train.Net: it sends the attacked src.
func (n *Net) AllReduce(ctx context.Context, round uint64, group []peerid.ID, dst, src []float32, weight float64) ([]peerid.ID, error) {
	n.mu.Lock()
	if cap(n.buf) < len(src) {
		n.buf = make([]float32, len(src))
	}
	send := n.buf[:len(src)]
	var ref []float32
	if n.models && len(n.ref) == len(src) {
		ref = n.ref
	}
	n.t.Apply(send, src, ref)
	n.mu.Unlock()
	n.f.flood(ctx, wire.Announcement{Version: round, Base: round - min(round, 1), Kind: kindOf(n.models), Codec: compression.IDFP32, Elems: uint32(len(src))}, 4*len(src))
	used, err := n.Net.AllReduce(ctx, round, group, dst, send, weight)
	if err == nil && n.models {
		n.mu.Lock()
		n.ref = append(n.ref[:0], dst...)
		n.mu.Unlock()
	}
	return used, err
}

func kindOf(models bool) wire.PayloadKind {
	if models {
		return wire.KindModel
	}
	return wire.KindGradient
}

// AsyncNet is a train.AsyncNet (FedAsync, FedBuff) whose published
// vectors are attacked: it decodes each payload with its codec, applies
// the attack (models and deltas alike measured from zero) and encodes it
// again with the same codec. Safe for concurrent use.
type AsyncNet struct {
	train.AsyncNet

	mu  sync.Mutex
	t   *Transformer
	f   flooder
	vec []float32
	enc []byte
}

var _ train.AsyncNet = (*AsyncNet)(nil)

// WrapAsyncNet returns n with every published vector passed through t;
// ann, if not nil, carries flood's announcements.
func WrapAsyncNet(n train.AsyncNet, t *Transformer, ann Announcer) *AsyncNet {
	return &AsyncNet{AsyncNet: n, t: t, f: flooder{a: t.a, ann: ann, rng: rand.New(rand.NewPCG(2, 3))}}
}

// Publish implements train.AsyncNet: it publishes the attacked payload.
func (n *AsyncNet) Publish(ctx context.Context, a wire.Announcement, payload []byte) error {
	n.mu.Lock()
	c, err := compression.New(a.Codec, "")
	if err != nil {
		n.mu.Unlock()
		return fmt.Errorf("attack: codec %v: %w", a.Codec, err)
	}
	if cap(n.vec) < int(a.Elems) {
		n.vec = make([]float32, a.Elems)
	}
	vec := n.vec[:a.Elems]
	if err := c.Decode(vec, payload); err != nil {
		n.mu.Unlock()
		return fmt.Errorf("attack: decoding own payload: %w", err)
	}
	n.t.Apply(vec, vec, nil)
	n.enc = c.Encode(n.enc, vec)
	out := n.enc
	err = n.AsyncNet.Publish(ctx, a, out) // the payload is not retained
	n.mu.Unlock()
	n.f.flood(ctx, a, len(payload))
	return err
}

// GossipNet is a train.GossipNet (AD-PSGD, SGP) whose outgoing models are
// attacked: the active side's Swap and Push, and the passive side's
// reply. The attacker's own model stays honest. Safe for concurrent use.
type GossipNet struct {
	train.GossipNet

	mu sync.Mutex
	t  *Transformer
}

var _ train.GossipNet = (*GossipNet)(nil)

// WrapGossipNet returns n with every model it sends passed through t
// (measured from zero). A flood sends nothing more here: gossip has no
// announcements. The result implements train.GossipProgress when n does.
func WrapGossipNet(n train.GossipNet, t *Transformer) train.GossipNet {
	g := &GossipNet{GossipNet: n, t: t}
	if p, ok := n.(train.GossipProgress); ok {
		return &gossipProgressNet{GossipNet: g, GossipProgress: p}
	}
	return g
}

// gossipProgressNet is a GossipNet whose inner network carries step
// counts.
type gossipProgressNet struct {
	*GossipNet
	train.GossipProgress
}

var _ train.GossipProgress = (*gossipProgressNet)(nil)

// Bind implements train.GossipNet.
func (n *GossipNet) Bind(h average.Handler, dim int) average.Exchanger {
	return &exchanger{n: n, inner: n.GossipNet.Bind(&handler{n: n, inner: h}, dim)}
}

func (n *GossipNet) apply(dst, src []float32) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.t.Apply(dst, src, nil)
}

type exchanger struct {
	n     *GossipNet
	inner average.Exchanger
}

func (e *exchanger) Swap(ctx context.Context, with peerid.ID, mine, theirs []float32) error {
	lie := make([]float32, len(mine))
	e.n.apply(lie, mine)
	return e.inner.Swap(ctx, with, lie, theirs)
}

func (e *exchanger) Push(ctx context.Context, to peerid.ID, s average.Share) error {
	lie := s
	lie.X = make([]float32, len(s.X))
	e.n.apply(lie.X, s.X)
	return e.inner.Push(ctx, to, lie)
}

type handler struct {
	n     *GossipNet
	inner average.Handler
}

func (h *handler) HandleShare(s average.Share) error { return h.inner.HandleShare(s) }

// HandleSwap replies with the attacked model: mine is what goes back.
func (h *handler) HandleSwap(from peerid.ID, theirs, mine []float32) error {
	if err := h.inner.HandleSwap(from, theirs, mine); err != nil {
		return err
	}
	h.n.apply(mine, mine)
	return nil
}
