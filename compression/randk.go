package compression

import (
	"fmt"
	"math/bits"
)

// RandK keeps k = round(Frac·n) values chosen at random and sends them with
// the seed that chose them instead of their indices: 4 bytes per kept value.
//
// The choice is stratified: the vector is cut into k strata of ⌊n/k⌋ or
// ⌈n/k⌉ consecutive entries and one uniformly random entry of each stratum is
// kept, so every entry is kept with probability 1/len(stratum) ≈ k/n, the
// indices come out sorted, and the decoder regenerates them in O(k). Values
// are sent unscaled: use RandK with error feedback (the biased, "memory"
// variant of Stich et al., 2018); multiply by n/k yourself for an unbiased
// estimate.
//
// Each Encode uses the seed mix(Seed, step) and then advances step, so a run
// is reproducible from Seed. Peers that encode with the same Seed and step
// choose the same indices: their encodings sum exactly and stay k-sparse
// (see MergeSparse), which is how RandK composes with all-reduce.
//
// Wire: header, uvarint k, uint64 seed, k float32 values. RandK is not safe
// for concurrent Encode (it advances step); Decode is safe for concurrent use.
type RandK struct {
	// Frac is the fraction of values kept, in (0, 1]; 0 means DefaultFrac.
	Frac float64
	// Seed is the base of every per-step seed.
	Seed uint64

	step uint64
}

var _ Codec = (*RandK)(nil)

// ID implements Codec.
func (*RandK) ID() ID { return IDRandK }

// Name implements Codec.
func (c *RandK) Name() string { return nameOf(c) }

func (c *RandK) spec() string {
	return "randk:" + formatFrac(c.frac()) + ",seed=" + formatUint(c.Seed)
}

func (c *RandK) frac() float64 {
	if c.Frac <= 0 {
		return DefaultFrac
	}
	return c.Frac
}

// K returns the number of values RandK keeps of a vector of n.
func (c *RandK) K(n int) int { return kFor(n, c.frac()) }

// Step returns the number of the next Encode.
func (c *RandK) Step() uint64 { return c.step }

// SetStep sets the number of the next Encode, e.g. to the training step so
// that every peer of a round draws the same indices.
func (c *RandK) SetStep(step uint64) { c.step = step }

// Encode implements Codec.
func (c *RandK) Encode(dst []byte, src []float32) []byte {
	return c.encode(dst, src, nil)
}

func (c *RandK) encode(dst []byte, src []float32, residual []float32) []byte {
	n := len(src)
	k := c.K(n)
	seed := splitmix64(c.Seed ^ splitmix64(c.step))
	c.step++
	h := headerLen(n) + uvarintLen(uint64(k)) + 8
	out := resize(dst, h+4*k)
	off := putHeader(out, IDRandK, n)
	off += putUvarint(out[off:], uint64(k))
	putU64(out[off:], seed)
	vals := out[h:]
	st := newRandkStrata(n, k, seed)
	for j := 0; j < k; j++ {
		i := st.index(j)
		putFloat(vals, j, src[i])
		if residual != nil {
			residual[i] = 0
		}
	}
	return out
}

// Decode implements Codec.
func (*RandK) Decode(dst []float32, src []byte) error { return decodeSparse(dst, src, false) }

func (*RandK) decodeAdd(acc []float32, src []byte) error { return decodeSparse(acc, src, true) }

// randkStrata computes the index kept in each stratum. Strata are walked in
// order, so index(j) must be called with j = 0, 1, 2, …
type randkStrata struct {
	n, k     int
	seed     uint64
	lo, rem  int // start of stratum j and the running remainder of j·n mod k
	step, rs int // n / k and n % k
	j        int
}

func newRandkStrata(n, k int, seed uint64) randkStrata {
	if k == 0 {
		return randkStrata{}
	}
	return randkStrata{n: n, k: k, seed: seed, step: n / k, rs: n % k}
}

// index returns the kept index of stratum j (the next stratum in order).
func (s *randkStrata) index(j int) int {
	if j != s.j {
		s.seek(j)
	}
	// Stratum j is [⌊j·n/k⌋, ⌊(j+1)·n/k⌋).
	lo := s.lo
	s.lo += s.step
	s.rem += s.rs
	if s.rem >= s.k {
		s.lo++
		s.rem -= s.k
	}
	s.j++
	width := uint64(s.lo - lo)
	hi, _ := bits.Mul64(splitmix64(s.seed+uint64(j)*0x9e3779b97f4a7c15), width)
	return lo + int(hi)
}

// seek positions the walk at stratum j.
func (s *randkStrata) seek(j int) {
	hi, lo := bits.Mul64(uint64(j), uint64(s.n))
	q, r := bits.Div64(hi, lo, uint64(s.k))
	s.lo, s.rem, s.j = int(q), int(r), j
}

// splitmix64 is a strong 64-bit mixer (Steele, Lea, Flood 2014).
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

var _ Stateful = (*RandK)(nil)

// AppendState implements Stateful: the step counter.
func (c *RandK) AppendState(dst []byte) []byte {
	dst = append(dst, stateRandK)
	return appendUvarint(dst, c.step)
}

// LoadState implements Stateful.
func (c *RandK) LoadState(b []byte) error {
	r := reader{b: b}
	if r.byte() != stateRandK && r.err == nil {
		return fmt.Errorf("%w: not a random-k state", ErrState)
	}
	step := r.uvarint()
	if err := r.end(); err != nil {
		return fmt.Errorf("%w: %v", ErrState, err)
	}
	c.step = step
	return nil
}
