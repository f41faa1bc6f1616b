package compression

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"testing"
)

// hopBound returns, per value, the error bound of re-encoding v with the hop
// codec (see the package documentation's all-reduce table).
func hopBound(hop Codec, v []float32) []float64 {
	if e, ok := hop.(*Entropy); ok {
		hop = e.inner
	}
	b := make([]float64, len(v))
	switch c := hop.(type) {
	case FP32:
	case FP16:
		for i, x := range v {
			b[i] = math.Abs(float64(x))*0x1p-11 + 0x1p-25
		}
	case BF16:
		for i, x := range v {
			b[i] = math.Abs(float64(x))*0x1p-8 + 0x1p-134
		}
	case Int8:
		block := c.block()
		for lo := 0; lo < len(v); lo += block {
			hi := min(lo+block, len(v))
			var absmax float64
			for _, x := range v[lo:hi] {
				absmax = math.Max(absmax, math.Abs(float64(x)))
			}
			for i := lo; i < hi; i++ {
				b[i] = absmax/254 + absmax*0x1p-20
			}
		}
	case FP4, Int4:
		div, block := 6.0, 0
		if q, ok := c.(FP4); ok {
			block = fourBitBlock(q.Block)
		} else {
			div, block = 14, fourBitBlock(c.(Int4).Block)
		}
		for lo := 0; lo < len(v); lo += block {
			hi := min(lo+block, len(v))
			var absmax float64
			for _, x := range v[lo:hi] {
				absmax = math.Max(absmax, math.Abs(float64(x)))
			}
			for i := lo; i < hi; i++ {
				b[i] = absmax/div + absmax*0x1p-20
			}
		}
	default:
		panic(fmt.Sprintf("no bound for %T", hop))
	}
	return b
}

// peerVectors returns four gradient-like vectors of n values.
func peerVectors(n int) [][]float32 {
	xs := make([][]float32, 4)
	for p := range xs {
		xs[p] = gradLike(n, uint64(50+p))
	}
	return xs
}

// simulation records, for one all-reduce, the leaves' decoded vectors, the
// bound accumulated over the reducing hops and what every peer ended with.
type simulation struct {
	target  []float64 // Σ over peers of decode(leaf encoding)
	absSum  []float64 // Σ |terms|, for the float32 summation slack
	bound   []float64 // Σ over re-encoding hops of the hop bound
	results [][]float32
	dense   bool // some hop densified
	bytes   int  // bytes sent over all hops
}

func newSimulation(n int) *simulation {
	return &simulation{target: make([]float64, n), absSum: make([]float64, n), bound: make([]float64, n), results: make([][]float32, 4)}
}

// leaf encodes x with c (a fresh codec per peer) and records its decoded
// value in the target.
func (s *simulation) leaf(c Codec, x []float32, lo int) []byte {
	b := c.Encode(nil, x)
	d := make([]float32, len(x))
	var dec Decoder
	if err := dec.Decode(d, b); err != nil {
		panic(err)
	}
	for i, v := range d {
		s.target[lo+i] += float64(v)
		s.absSum[lo+i] += math.Abs(float64(v))
	}
	s.bytes += len(b)
	return b
}

// hop combines contributions and re-encodes, adding the hop's bound.
func (s *simulation) hop(t *testing.T, cb *Combiner, n, lo int, in ...[]byte) []byte {
	t.Helper()
	cb.Reset(n)
	for _, b := range in {
		if err := cb.Add(b); err != nil {
			t.Fatal(err)
		}
	}
	sum := make([]float32, n)
	if err := cb.Sum(sum); err != nil {
		t.Fatal(err)
	}
	out := cb.Encode(nil)
	id, _ := PeekID(out)
	if !IsSparse(id) && (id&^IDEntropy) != IDFP32 || cb.Dense() {
		for i, b := range hopBound(cb.hop, sum) {
			s.bound[lo+i] += b
		}
	}
	s.dense = s.dense || cb.Dense()
	s.bytes += len(out)
	return out
}

// check compares every peer's result with the target.
func (s *simulation) check(t *testing.T) {
	t.Helper()
	for p := 1; p < 4; p++ {
		if !bitsEqual(s.results[p], s.results[0]) {
			t.Fatalf("peer %d ended with a different vector than peer 0", p)
		}
	}
	for i, v := range s.results[0] {
		slack := 4 * 0x1p-24 * (s.absSum[i] + s.bound[i])
		if e := math.Abs(float64(v) - s.target[i]); e > s.bound[i]+slack {
			t.Fatalf("value %d: %g, target %g: error %g > bound %g + %g", i, v, s.target[i], e, s.bound[i], slack)
		}
	}
}

func bitsEqual(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

var reduceSpecs = []string{
	"fp32", "fp16", "bf16", "int8", "int8:block=64", "sign", "sign:ef",
	"topk:0.01", "topk:0.01,entropy=none", "topk:0.3,entropy=none", "randk:0.05,seed=3", "randk:0.6,seed=3",
	"fp16:entropy=s2",
}

// A tree all-reduce over 4 peers: 3 → 1, then 1 and 2 → 0; 0 broadcasts its
// bytes unchanged. Two reducing hops lie on the deepest path.
func TestTreeAllReduce(t *testing.T) {
	const n = 5000
	for _, spec := range reduceSpecs {
		t.Run(spec, func(t *testing.T) {
			xs := peerVectors(n)
			s := newSimulation(n)
			leaves := make([][]byte, 4)
			var leafCodec Codec
			for p := range xs {
				c, err := Parse(spec)
				if err != nil {
					t.Fatal(err)
				}
				leafCodec = c
				leaves[p] = s.leaf(c, xs[p], 0)
			}
			cb := NewCombiner(leafCodec)
			up1 := s.hop(t, cb, n, 0, leaves[1], leaves[3])
			root := s.hop(t, cb, n, 0, leaves[0], up1, leaves[2])
			for p := range s.results {
				s.results[p] = make([]float32, n)
				var d Decoder
				if err := d.Decode(s.results[p], root); err != nil {
					t.Fatal(err)
				}
			}
			s.check(t)
			t.Logf("densified=%v, %d bytes over the reduce (6 messages)", s.dense, s.bytes)
		})
	}
}

// A butterfly all-reduce over 4 peers: peer j owns chunk j, every peer sends
// it its encoded chunk (reduce-scatter, one reducing hop), the owner forwards
// the re-encoded sum to all (all-gather).
func TestButterflyAllReduce(t *testing.T) {
	const n = 5003 // chunks of unequal length
	for _, spec := range reduceSpecs {
		t.Run(spec, func(t *testing.T) {
			xs := peerVectors(n)
			s := newSimulation(n)
			bounds := []int{0, n / 4, n / 2, 3 * n / 4, n}
			for p := range s.results {
				s.results[p] = make([]float32, n)
			}
			for j := 0; j < 4; j++ {
				lo, hi := bounds[j], bounds[j+1]
				var in [][]byte
				var leafCodec Codec
				for p := range xs {
					c, err := Parse(spec)
					if err != nil {
						t.Fatal(err)
					}
					leafCodec = c
					in = append(in, s.leaf(c, xs[p][lo:hi], lo))
				}
				out := s.hop(t, NewCombiner(leafCodec), hi-lo, lo, in...)
				for p := range s.results {
					var d Decoder
					if err := d.Decode(s.results[p][lo:hi], out); err != nil {
						t.Fatal(err)
					}
				}
			}
			s.check(t)
		})
	}
}

// Sparse merges are exact, random-k with a shared seed stays k-sparse, and
// a union too large for sparse to pay is densified.
func TestMergeSparse(t *testing.T) {
	const n = 3000
	xs := peerVectors(n)
	a := (&TopK{Frac: 0.02}).Encode(nil, xs[0])
	b := (&TopK{Frac: 0.02}).Encode(nil, xs[1])
	m, err := MergeSparse(nil, a, b, n)
	if err != nil {
		t.Fatal(err)
	}
	da, db, dm := make([]float32, n), make([]float32, n), make([]float32, n)
	var d Decoder
	for _, p := range []struct {
		v []float32
		b []byte
	}{{da, a}, {db, b}, {dm, m}} {
		if err := d.Decode(p.v, p.b); err != nil {
			t.Fatal(err)
		}
	}
	for i := range dm {
		if dm[i] != da[i]+db[i] {
			t.Fatalf("value %d: %g ≠ %g + %g", i, dm[i], da[i], db[i])
		}
	}
	if ID(m[0]) != IDTopK {
		t.Fatalf("small union densified")
	}

	ra := (&RandK{Frac: 0.1, Seed: 8}).Encode(nil, xs[0])
	rb := (&RandK{Frac: 0.1, Seed: 8}).Encode(nil, xs[1])
	rm, err := MergeSparse(nil, ra, rb, n)
	if err != nil || ID(rm[0]) != IDRandK || len(rm) != len(ra) {
		t.Fatalf("same-seed random-k merge: id %d, %d bytes (leaf %d), %v", rm[0], len(rm), len(ra), err)
	}
	rc := (&RandK{Frac: 0.1, Seed: 9}).Encode(nil, xs[1])
	if rm, err := MergeSparse(nil, ra, rc, n); err != nil || ID(rm[0]) != IDTopK {
		t.Fatalf("different-seed random-k merge: id %d, %v", rm[0], err)
	}

	big1 := (&TopK{Frac: 0.5}).Encode(nil, xs[0])
	big2 := (&TopK{Frac: 0.5}).Encode(nil, xs[1])
	if dm, err := MergeSparse(nil, big1, big2, n); err != nil || ID(dm[0]) != IDFP32 {
		t.Fatalf("large union not densified: %v", err)
	}

	if _, err := MergeSparse(nil, a, FP16{}.Encode(nil, xs[0]), n); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("dense operand: %v", err)
	}
	if _, err := MergeSparse(nil, a, b, n+1); !errors.Is(err, ErrLength) {
		t.Fatalf("wrong length: %v", err)
	}
	bad := bytes.Clone(b)
	bad[len(bad)-1] = 0xff // an unterminated varint
	if _, err := MergeSparse(nil, a, bad, n); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("corrupt operand: %v", err)
	}
}

// PowerSGD's all-reduce is two dense all-reduces; its result equals PowerSGD
// of the summed matrices with the same Q, step after step, and every peer
// ends with the same vector and the same warm start.
func TestPowerSGDAllReduce(t *testing.T) {
	layout := []Shape{{40, 30}, {1, 30}, {30, 10}, {1, 10}}
	n := 40*30 + 30 + 30*10 + 10
	ref := &PowerSGD{Rank: 3, Seed: 7}
	if err := ref.SetLayout(layout); err != nil {
		t.Fatal(err)
	}
	peers := make([]*PowerSGD, 4)
	for p := range peers {
		peers[p] = &PowerSGD{Rank: 3, Seed: 7}
		if err := peers[p].SetLayout(layout); err != nil {
			t.Fatal(err)
		}
	}
	sumVec := func(vs [][]float32) []float32 {
		s := make([]float32, len(vs[0]))
		for _, v := range vs {
			for i, x := range v {
				s[i] += x
			}
		}
		return s
	}
	for step := 0; step < 3; step++ {
		ms := make([][]float32, 4)
		for p := range ms {
			ms[p] = gradLike(n, uint64(10*step+p))
		}
		ps := make([][]float32, 4)
		for p := range ps {
			ps[p] = peers[p].Project(nil, ms[p])
		}
		pSum := sumVec(ps)
		qs := make([][]float32, 4)
		pHat := make([][]float32, 4)
		for p := range qs {
			pHat[p] = append([]float32(nil), pSum...)
			qs[p] = peers[p].Backproject(nil, ms[p], pHat[p])
		}
		qSum := sumVec(qs)
		outs := make([][]float32, 4)
		for p := range outs {
			outs[p] = make([]float32, n)
			peers[p].Reconstruct(outs[p], pHat[p], qSum)
			peers[p].SetWarmStart(qSum)
			if p > 0 && !bitsEqual(outs[p], outs[0]) {
				t.Fatalf("step %d: peer %d differs", step, p)
			}
		}
		want := make([]float32, n)
		mustDecode(t, ref, want, ref.Encode(nil, sumVec(ms)))
		d := make([]float32, n)
		for i := range d {
			d[i] = outs[0][i] - want[i]
		}
		if rel := norm2(d) / norm2(want); rel > 1e-5 {
			t.Fatalf("step %d: all-reduce differs from PowerSGD of the sum by %g (relative)", step, rel)
		}
	}
}

func TestCombinerMisuse(t *testing.T) {
	cb := NewCombiner(FP16{})
	cb.Reset(10)
	if err := cb.AddVector(make([]float32, 9)); !errors.Is(err, ErrLength) {
		t.Fatalf("AddVector of 9 into 10: %v", err)
	}
	if err := cb.Add(FP16{}.Encode(nil, make([]float32, 11))); !errors.Is(err, ErrLength) {
		t.Fatalf("Add of 11 into 10: %v", err)
	}
	if err := cb.Add([]byte{0x42}); !errors.Is(err, ErrUnknownCodec) {
		t.Fatalf("unknown id: %v", err)
	}
	// Mixed sparse and dense contributions densify and still sum.
	x := gradLike(10, 1)
	cb = NewCombiner(&TopK{Frac: 0.5})
	cb.Reset(10)
	if err := cb.Add((&TopK{Frac: 0.5}).Encode(nil, x)); err != nil {
		t.Fatal(err)
	}
	if err := cb.AddVector(x); err != nil {
		t.Fatal(err)
	}
	sum := make([]float32, 10)
	if err := cb.Sum(sum); err != nil || !cb.Dense() {
		t.Fatalf("sum: %v, dense %v", err, cb.Dense())
	}
}
