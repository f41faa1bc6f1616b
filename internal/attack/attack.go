// Package attack makes a peer lie, for experiments on robust aggregation:
// `peer run --attack SPEC --allow-attack`. An Attack is a pure transform
// of what this peer contributes (a model, a delta or a gradient) before it
// goes to the network; the wrappers in net.go apply it at the seams the
// strategies hand their contributions to (train.Net's AllReduce,
// train.AsyncNet's Publish, the gossip Exchanger's Swap and Push and the
// handler's reply), so no strategy knows it is lying.
//
//	a, err := attack.Parse("scale:-10")
//	t := attack.NewTransformer(a, seed)
//	t.Apply(dst, src, ref) // dst: what is sent instead of src
//
// ref is what the contribution is measured from: the model the round
// started from when src is a model (the last all-reduce result in
// federated rounds), nil when src is already a difference (a gradient or
// a delta) or no such model is known, in which case it is measured from
// zero. The attacks:
//
//	scale:s     ref + s·(src − ref)            (default s = −10)
//	signflip    ref − (src − ref)
//	noise:σ     src + N(0, σ²) per coordinate  (default σ = 1)
//	nan         every value NaN
//	stale:k     the contribution of k calls ago (the oldest held until
//	            there are k); holds k+1 copies (k ≤ MaxStale)
//	flood       src unchanged; the wrappers also announce count=N vectors
//	            (default 64) claiming size=X times src's bytes (default 16)
//	            that nobody serves, per contribution
//
// Nothing here starts a goroutine, does I/O or reads a clock; a
// Transformer is not safe for concurrent use (the wrappers lock).
package attack

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/starling-ml/starling/internal/spec"
)

// ErrBadSpec is wrapped by Parse's errors.
var ErrBadSpec = errors.New("attack")

// Kind names an attack.
type Kind uint8

// The attacks.
const (
	None Kind = iota
	Scale
	SignFlip
	Noise
	NaN
	Stale
	Flood
)

// MaxStale bounds stale:k (the attacker holds k+1 copies of its
// contribution); MaxFloodCount and MaxFloodSize bound flood's count and
// claimed size factor.
const (
	MaxStale      = 64
	MaxFloodCount = 10000
	MaxFloodSize  = 1 << 20
)

// Attack is a parsed --attack spec. The zero Attack is no attack.
type Attack struct {
	Kind   Kind
	Factor float64 // Scale: s
	Sigma  float64 // Noise: σ
	K      int     // Stale: k
	Count  int     // Flood: announcements per contribution
	Size   int     // Flood: claimed size, in multiples of the contribution's bytes
}

// IsZero reports whether a is no attack.
func (a Attack) IsZero() bool { return a.Kind == None }

// String returns the attack's spec in normal form ("" for none).
func (a Attack) String() string {
	switch a.Kind {
	case Scale:
		return fmt.Sprintf("scale:%g", a.Factor)
	case SignFlip:
		return "signflip"
	case Noise:
		return fmt.Sprintf("noise:%g", a.Sigma)
	case NaN:
		return "nan"
	case Stale:
		return fmt.Sprintf("stale:%d", a.K)
	case Flood:
		return fmt.Sprintf("flood:count=%d,size=%d", a.Count, a.Size)
	}
	return ""
}

// Parse reads an --attack spec: scale:s, signflip, noise:σ, nan, stale:k
// or flood[:count=N,size=X]. Errors are one line and wrap ErrBadSpec.
func Parse(s string) (Attack, error) {
	t, err := spec.One(s)
	if err != nil {
		return Attack{}, fmt.Errorf("%w: %w", ErrBadSpec, err)
	}
	r := t.Reader()
	var a Attack
	switch t.Name {
	case "scale":
		a = Attack{Kind: Scale, Factor: r.Float("s", -10)}
	case "signflip":
		a = Attack{Kind: SignFlip}
	case "noise":
		a = Attack{Kind: Noise, Sigma: r.Float("sigma", 1, spec.Positive())}
	case "nan":
		a = Attack{Kind: NaN}
	case "stale":
		r.Require("k")
		a = Attack{Kind: Stale, K: r.Int("k", 1, 1, MaxStale)}
	case "flood":
		a = Attack{Kind: Flood, Count: r.Int("count", 64, 1, MaxFloodCount), Size: r.Int("size", 16, 1, MaxFloodSize)}
	default:
		return Attack{}, fmt.Errorf("%w: %w", ErrBadSpec, t.Errorf("unknown attack %q (want scale, signflip, noise, nan, stale or flood)", t.Name))
	}
	if err := r.Done(); err != nil {
		return Attack{}, fmt.Errorf("%w: %w", ErrBadSpec, err)
	}
	return a, nil
}

// MarshalText implements encoding.TextMarshaler.
func (a Attack) MarshalText() ([]byte, error) { return []byte(a.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler (a flag.TextVar):
// "" or "none" is no attack.
func (a *Attack) UnmarshalText(b []byte) error {
	if s := string(b); s == "" || s == "none" {
		*a = Attack{}
		return nil
	}
	x, err := Parse(string(b))
	if err != nil {
		return err
	}
	*a = x
	return nil
}

// Transformer applies an attack to a sequence of contributions of one
// seam: it holds the noise's random stream and stale's history.
type Transformer struct {
	a    Attack
	rng  *rand.Rand
	hist [][]float32 // Stale: ring of the last K+1 contributions
	next int         // Stale: calls so far
}

// NewTransformer returns a transformer of a whose noise is seeded with
// seed.
func NewTransformer(a Attack, seed uint64) *Transformer {
	return &Transformer{a: a, rng: rand.New(rand.NewPCG(seed, 0x61747461636b))}
}

// Attack returns the attack t applies.
func (t *Transformer) Attack() Attack { return t.a }

// Apply writes into dst (len(dst) == len(src)) what the attacker sends
// instead of src, measured from ref (nil: from zero; else len(ref) ==
// len(src)). dst may be src.
func (t *Transformer) Apply(dst, src, ref []float32) {
	if len(dst) != len(src) || ref != nil && len(ref) != len(src) {
		panic("attack: Apply: lengths differ")
	}
	switch t.a.Kind {
	case Scale, SignFlip:
		s := float32(t.a.Factor)
		if t.a.Kind == SignFlip {
			s = -1
		}
		if ref == nil {
			for i, x := range src {
				dst[i] = s * x
			}
			return
		}
		for i, x := range src {
			dst[i] = ref[i] + s*(x-ref[i])
		}
	case Noise:
		for i, x := range src {
			dst[i] = x + float32(t.a.Sigma*t.rng.NormFloat64())
		}
	case NaN:
		nan := float32(math.NaN())
		for i := range dst {
			dst[i] = nan
		}
	case Stale:
		t.stale(dst, src)
	default: // None, Flood: the vector itself is honest
		copy(dst, src)
	}
}

// stale records src and writes the contribution of K calls ago (the
// oldest held, before K calls) into dst.
func (t *Transformer) stale(dst, src []float32) {
	n := t.a.K + 1
	if t.hist == nil {
		t.hist = make([][]float32, n)
	}
	slot := t.next % n
	if len(t.hist[slot]) != len(src) {
		t.hist[slot] = make([]float32, len(src))
	}
	copy(t.hist[slot], src)
	t.next++
	old := max(0, t.next-n) % n
	if len(t.hist[old]) != len(src) {
		// The length changed (another vector on this seam): nothing older
		// of this length to send.
		old = slot
	}
	copy(dst, t.hist[old])
}
