package average

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/starling-ml/starling/aggregate/rule"
	"github.com/starling-ml/starling/peerid"
)

// errWrongAlgorithm: a peer got an exchange of the other averaging
// algorithm, or of the wrong role.
var errWrongAlgorithm = errors.New("average: exchange not served by this peer")

// PushSumPeer is one push-sum participant, safe for concurrent use: it is
// the Handler for its Exchanger and steps by pushing shares through it.
type PushSumPeer struct {
	stepMu sync.Mutex // serialises Step (owns share)
	share  []float32

	mu   sync.Mutex // guards st, clip and the rest
	st   PushSum
	clip *rule.DistanceClip
	maxW float64
	// z and e are scratch for clipping: a share's X/W and our own.
	z, e []float32
}

var _ Handler = (*PushSumPeer)(nil)

// NewPushSumPeer returns a peer whose numerator is x (not copied; the peer
// owns it from now on) with weight 1.
func NewPushSumPeer(x []float32) *PushSumPeer { return &PushSumPeer{st: PushSum{X: x, W: 1}} }

// SetClip makes the peer bound what one share can do before absorbing it
// (ClippedGossip for push-sum): a share whose weight exceeds maxWeight is
// refused (the weights of all peers add up to the group's size, so an
// honest share never carries more), and the share's value X/W is moved
// towards the peer's own X/W with c, its weight kept. A lying or diverged
// sender then pulls the estimate by at most c's radius per share. Mass is
// no longer conserved when c clips. Call before the first share.
func (p *PushSumPeer) SetClip(c *rule.DistanceClip, maxWeight float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clip, p.maxW = c, maxWeight
}

// Clipped returns how many shares SetClip's clipper has moved.
func (p *PushSumPeer) Clipped() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.clip == nil {
		return 0
	}
	return p.clip.Clipped()
}

// HandleShare absorbs a share (Handler).
func (p *PushSumPeer) HandleShare(s Share) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.clip == nil {
		return p.st.Absorb(s.X, s.W)
	}
	if err := p.st.checkShare(s.X, s.W, p.maxW); err != nil {
		return err
	}
	inv := 1 / s.W
	p.z = growF32(p.z, len(s.X))
	for i, v := range s.X {
		p.z[i] = float32(float64(v) * inv)
	}
	p.e = p.st.Estimate(p.e)
	x := s.X
	if p.clip.Clip(p.z, p.e, string(s.From)) != 1 {
		for i, v := range p.z {
			p.z[i] = float32(float64(v) * s.W)
		}
		x = p.z
	}
	p.st.add(x, s.W)
	return nil
}

// HandleSwap refuses: push-sum peers do not swap (Handler).
func (p *PushSumPeer) HandleSwap(peerid.ID, []float32, []float32) error {
	return fmt.Errorf("%w: push-sum peer got a swap", errWrongAlgorithm)
}

// Step gives half of the peer's mass to peer to. If the push certainly
// failed (ErrNotDelivered) the share is absorbed back, so mass is
// conserved; the error is still returned.
func (p *PushSumPeer) Step(ctx context.Context, ex Exchanger, to peerid.ID, step, version uint64) error {
	p.stepMu.Lock()
	defer p.stepMu.Unlock()
	p.mu.Lock()
	var w float64
	p.share, w = p.st.Share(p.share, 1)
	p.mu.Unlock()
	err := ex.Push(ctx, to, Share{Step: step, Version: version, X: p.share, W: w})
	if errors.Is(err, ErrNotDelivered) {
		p.mu.Lock()
		if aerr := p.st.Absorb(p.share, w); aerr != nil {
			err = errors.Join(err, aerr)
		}
		p.mu.Unlock()
	}
	return err
}

// Estimate writes the de-biased model X/W into dst[:0] and returns it.
func (p *PushSumPeer) Estimate(dst []float32) []float32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.st.Estimate(dst)
}

// Weight returns the current push-sum weight.
func (p *PushSumPeer) Weight() float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.st.W
}

// Update runs f on the numerator and weight under the peer's lock, e.g.
// SGP's local step X ← X − lr·∇f(X/W). f must not retain x or block.
func (p *PushSumPeer) Update(f func(x []float32, w float64)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f(p.st.X, p.st.W)
}

// PairwisePeer is one AD-PSGD participant, safe for concurrent use. An
// active peer starts exchanges (Exchange) and serves none; a passive peer
// serves them (HandleSwap) and starts none. That split is what makes the
// protocol deadlock-free: an active peer holds its model's lock while it
// waits for one passive peer (bounded by ctx), and a passive peer never
// waits on anyone while holding its lock.
type PairwisePeer struct {
	role Role

	exMu   sync.Mutex // serialises Exchange (owns mine, theirs)
	mine   []float32
	theirs []float32

	mu   sync.Mutex // guards x and clip
	x    []float32
	clip *rule.DistanceClip
}

var _ Handler = (*PairwisePeer)(nil)

// NewPairwisePeer returns a peer with role r whose model is x (not copied).
func NewPairwisePeer(x []float32, r Role) *PairwisePeer {
	return &PairwisePeer{role: r, x: x}
}

// SetClip makes the peer move each partner's model towards its own with c
// before averaging (ClippedGossip): a lying or diverged partner then pulls
// the model by at most c's radius per exchange. The pair no longer ends
// equal when c clips. Call before the first exchange.
func (p *PairwisePeer) SetClip(c *rule.DistanceClip) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clip = c
}

// Clipped returns how many partners' models SetClip's clipper has moved.
func (p *PairwisePeer) Clipped() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.clip == nil {
		return 0
	}
	return p.clip.Clipped()
}

// average averages the model with theirs (from partner from), clipping
// theirs first if SetClip was called; p.mu is held.
func (p *PairwisePeer) average(from peerid.ID, theirs []float32) error {
	if p.clip != nil && len(theirs) == len(p.x) {
		p.clip.Clip(theirs, p.x, string(from))
	}
	return PairwiseAverage(p.x, theirs)
}

// Role returns the peer's role.
func (p *PairwisePeer) Role() Role { return p.role }

// HandleShare refuses: AD-PSGD peers do not take push-sum shares.
func (p *PairwisePeer) HandleShare(Share) error {
	return fmt.Errorf("%w: pairwise peer got a push-sum share", errWrongAlgorithm)
}

// HandleSwap is the passive side (Handler): it copies the local model into
// mine and averages the local model with theirs, atomically.
func (p *PairwisePeer) HandleSwap(from peerid.ID, theirs, mine []float32) error {
	if p.role != Passive {
		return fmt.Errorf("%w: active peer got a swap from %s", errWrongAlgorithm, from)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(mine) != len(p.x) {
		return fmt.Errorf("%w: reply buffer %d, model %d", ErrShape, len(mine), len(p.x))
	}
	copy(mine, p.x)
	return p.average(from, theirs)
}

// Exchange runs one AD-PSGD exchange with passive peer with: both models
// become their mean. Only active peers may call it.
func (p *PairwisePeer) Exchange(ctx context.Context, ex Exchanger, with peerid.ID) error {
	if p.role != Active {
		return fmt.Errorf("%w: passive peers do not start exchanges", errWrongAlgorithm)
	}
	p.exMu.Lock()
	defer p.exMu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mine = growF32(p.mine, len(p.x))
	p.theirs = growF32(p.theirs, len(p.x))
	copy(p.mine, p.x)
	if err := ex.Swap(ctx, with, p.mine, p.theirs); err != nil {
		return err
	}
	return p.average(with, p.theirs)
}

// Model copies the local model into dst[:0] and returns it.
func (p *PairwisePeer) Model(dst []float32) []float32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	dst = growF32(dst, len(p.x))
	copy(dst, p.x)
	return dst
}

// Update runs f on the model under the peer's lock (a local SGD step). f
// must not retain x or block.
func (p *PairwisePeer) Update(f func(x []float32)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f(p.x)
}
