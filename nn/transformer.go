package nn

import (
	"fmt"
	"math"

	"github.com/starling-ml/starling/device"
)

// maxExactID is the largest integer every smaller one of which a float32
// holds exactly: token ids travel in the float32 input batch.
const maxExactID = 1 << 24

// Embedding maps integer token ids to rows of a [Num, Dim] table
// (torch.nn.Embedding: weight [num_embeddings, embedding_dim], initialised
// N(0, 1)). Ids arrive as float32 values, exact up to 2^24; an input of
// shape S becomes [S..., Dim]. Forward panics on an id that is not an
// integer in [0, Num). The ids have no gradient: with needDx, Backward
// returns zeros.
type Embedding struct {
	Num, Dim int

	pos       int
	w, dw     []float32
	ids       []int32
	y, dzeros []float32
}

// Kind implements Layer.
func (l *Embedding) Kind() string { return "Embedding" }

// Setup implements Layer.
func (l *Embedding) Setup(in Shape) (Shape, error) {
	if l.Num <= 0 || l.Num > maxExactID || l.Dim <= 0 {
		return nil, fmt.Errorf("%w: Embedding(%d, %d): want 0 < num ≤ 2^24 and dim > 0", ErrShape, l.Num, l.Dim)
	}
	l.pos = in.Size()
	return append(append(Shape(nil), in...), l.Dim), nil
}

// Params implements Layer.
func (l *Embedding) Params() []ParamSpec {
	return []ParamSpec{{Suffix: "weight", Shape: []int{l.Num, l.Dim}, FanIn: l.Dim, Init: InitNormal(1)}}
}

// Bind implements Layer.
func (l *Embedding) Bind(p, g [][]float32) { l.w, l.dw = p[0], g[0] }

// Forward implements Layer.
func (l *Embedding) Forward(be device.Backend, x []float32, n int) []float32 {
	rows, d := n*l.pos, l.Dim
	if cap(l.ids) < rows {
		l.ids = make([]int32, rows)
	}
	l.ids = l.ids[:rows]
	l.y = grow(be, l.y, rows*d)
	for i, v := range x[:rows] {
		id := int32(v)
		if float32(id) != v || id < 0 || int(id) >= l.Num {
			panic(fmt.Sprintf("nn: Embedding(%d, %d): input %v at position %d is not a token id in [0, %d)", l.Num, d, v, i, l.Num))
		}
		l.ids[i] = id
		copy(l.y[i*d:(i+1)*d], l.w[int(id)*d:(int(id)+1)*d])
	}
	return l.y
}

// Backward implements Layer: the rows of dy are added to the rows of the
// table gradient their ids selected.
func (l *Embedding) Backward(be device.Backend, dy []float32, n int, needDx bool) []float32 {
	d := l.Dim
	clear(l.dw)
	for i, id := range l.ids[:n*l.pos] {
		be.Axpy(1, dy[i*d:(i+1)*d], l.dw[int(id)*d:(int(id)+1)*d])
	}
	if !needDx {
		return nil
	}
	l.dzeros = grow(be, l.dzeros, n*l.pos)
	clear(l.dzeros)
	return l.dzeros
}

// PositionEmbedding adds a learned [T, Dim] table to a sequence of t ≤ T
// positions of Dim values (the first t rows of the table), as minGPT's wpe
// (an nn.Embedding(block_size, n_embd) indexed by position) does.
type PositionEmbedding struct {
	T, Dim int

	t     int
	w, dw []float32
	y     []float32
}

// Kind implements Layer.
func (l *PositionEmbedding) Kind() string { return "PositionEmbedding" }

// Setup implements Layer.
func (l *PositionEmbedding) Setup(in Shape) (Shape, error) {
	if len(in) != 2 || in[0] > l.T || in[1] != l.Dim {
		return nil, fmt.Errorf("%w: PositionEmbedding(%d, %d) needs [t ≤ %d, %d] input, got %v", ErrShape, l.T, l.Dim, l.T, l.Dim, in)
	}
	l.t = in[0]
	return in, nil
}

// Params implements Layer.
func (l *PositionEmbedding) Params() []ParamSpec {
	return []ParamSpec{{Suffix: "weight", Shape: []int{l.T, l.Dim}, FanIn: l.Dim, Init: InitNormal(1)}}
}

// Bind implements Layer.
func (l *PositionEmbedding) Bind(p, g [][]float32) { l.w, l.dw = p[0], g[0] }

// Forward implements Layer.
func (l *PositionEmbedding) Forward(be device.Backend, x []float32, n int) []float32 {
	size := l.t * l.Dim
	l.y = grow(be, l.y, n*size)
	copy(l.y, x[:n*size])
	be.AddRowVector(l.y, l.w[:size], n, size)
	return l.y
}

// Backward implements Layer: dL/dx is dy itself.
func (l *PositionEmbedding) Backward(be device.Backend, dy []float32, n int, needDx bool) []float32 {
	size := l.t * l.Dim
	clear(l.dw)
	be.SumRows(l.dw[:size], dy, n, size)
	if !needDx {
		return nil
	}
	return dy[:n*size]
}

// LayerNorm normalises the last axis (Dim values) of its input and applies
// a learned scale and shift (torch.nn.LayerNorm(Dim): weight initialised
// to ones, bias to zeros, eps 1e-5 when Eps is zero).
type LayerNorm struct {
	Dim int
	Eps float32

	pos              int
	w, b, dw, db     []float32
	x, y, mean, rstd []float32
}

// Kind implements Layer.
func (l *LayerNorm) Kind() string { return "LayerNorm" }

// Setup implements Layer.
func (l *LayerNorm) Setup(in Shape) (Shape, error) {
	pos, err := lastAxis(fmt.Sprintf("LayerNorm(%d)", l.Dim), l.Dim, in)
	if err != nil {
		return nil, err
	}
	if l.Eps == 0 {
		l.Eps = 1e-5
	}
	l.pos = pos
	return in, nil
}

// Params implements Layer.
func (l *LayerNorm) Params() []ParamSpec {
	return []ParamSpec{
		{Suffix: "weight", Shape: []int{l.Dim}, FanIn: l.Dim, Init: InitConst(1)},
		{Suffix: "bias", Shape: []int{l.Dim}, FanIn: l.Dim, Init: InitConst(0)},
	}
}

// Bind implements Layer.
func (l *LayerNorm) Bind(p, g [][]float32) { l.w, l.b, l.dw, l.db = p[0], p[1], g[0], g[1] }

// Forward implements Layer.
func (l *LayerNorm) Forward(be device.Backend, x []float32, n int) []float32 {
	rows := n * l.pos
	l.x = x
	l.y = grow(be, l.y, rows*l.Dim)
	l.mean, l.rstd = grow(be, l.mean, rows), grow(be, l.rstd, rows)
	be.LayerNorm(l.y, l.mean, l.rstd, x, l.w, l.b, rows, l.Dim, l.Eps)
	return l.y
}

// Backward implements Layer; dL/dx overwrites dy.
func (l *LayerNorm) Backward(be device.Backend, dy []float32, n int, needDx bool) []float32 {
	rows := n * l.pos
	clear(l.dw)
	clear(l.db)
	dy = dy[:rows*l.Dim]
	be.LayerNormBackward(dy, l.dw, l.db, dy, l.x, l.mean, l.rstd, l.w, rows, l.Dim)
	if !needDx {
		return nil
	}
	return dy
}

// GELU is the Gaussian error linear unit in its tanh approximation,
// 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))): torch's
// nn.GELU(approximate='tanh'), minGPT's NewGELU. Forward also stores the
// derivative, so Backward is one multiplication.
type GELU struct {
	noParams
	size    int
	y, grad []float32 // output and GELU'(x)
	bf16    bool      // keep GELU'(x) in gradh as bfloat16 (BF16 mode)
	gradh   []uint16
}

func (l *GELU) useBF16([][]uint16) { l.bf16 = true }

// geluChunk is how many values GELU computes at a time in BF16 mode,
// through a float32 derivative buffer of that size.
const geluChunk = 1 << 17

// Kind implements Layer.
func (l *GELU) Kind() string { return "GELU" }

// Setup implements Layer.
func (l *GELU) Setup(in Shape) (Shape, error) { l.size = in.Size(); return in, nil }

// Forward implements Layer.
func (l *GELU) Forward(be device.Backend, x []float32, n int) []float32 {
	l.y = grow(be, l.y, n*l.size)
	if !l.bf16 {
		l.grad = grow(be, l.grad, n*l.size)
		be.GELU(l.y, l.grad, x[:n*l.size])
		return l.y
	}
	l.gradh = growHalf(l.gradh, n*l.size)
	l.grad = grow(be, l.grad, min(geluChunk, n*l.size))
	for s := 0; s < n*l.size; s += geluChunk {
		e := min(s+geluChunk, n*l.size)
		be.GELU(l.y[s:e], l.grad[:e-s], x[s:e])
		device.EncodeBF16(l.gradh[s:e], l.grad[:e-s])
	}
	return l.y
}

// Backward implements Layer; dL/dx overwrites dy.
func (l *GELU) Backward(be device.Backend, dy []float32, n int, needDx bool) []float32 {
	if !needDx {
		return nil
	}
	dy = dy[:n*l.size]
	if !l.bf16 {
		be.Mul(dy, dy, l.grad)
		return dy
	}
	for s := 0; s < len(dy); s += geluChunk {
		e := min(s+geluChunk, len(dy))
		device.DecodeBF16(l.grad[:e-s], l.gradh[s:e])
		be.Mul(dy[s:e], dy[s:e], l.grad[:e-s])
	}
	return dy
}

// Dropout zeroes each value with probability P while training and scales
// the others by 1/(1−P) (torch.nn.Dropout); at evaluation it is the
// identity. Whether a value is dropped depends only on the seed the model
// passes to SetTraining (its own seed, the layer's position and the step)
// and the value's index in the batch, never on the backend.
type Dropout struct {
	P float32

	noParams
	size     int
	training bool
	seed     uint64
	mask, y  []float32
}

var _ Stochastic = (*Dropout)(nil)

// Kind implements Layer.
func (l *Dropout) Kind() string { return "Dropout" }

// Setup implements Layer.
func (l *Dropout) Setup(in Shape) (Shape, error) {
	if !(l.P >= 0 && l.P < 1) {
		return nil, fmt.Errorf("%w: Dropout(p=%v): want 0 ≤ p < 1", ErrShape, l.P)
	}
	l.size = in.Size()
	return in, nil
}

// SetTraining implements Stochastic.
func (l *Dropout) SetTraining(training bool, seed uint64) { l.training, l.seed = training, seed }

func (l *Dropout) active() bool { return l.training && l.P > 0 }

// Forward implements Layer.
func (l *Dropout) Forward(be device.Backend, x []float32, n int) []float32 {
	x = x[:n*l.size]
	if !l.active() {
		return x
	}
	l.mask, l.y = grow(be, l.mask, len(x)), grow(be, l.y, len(x))
	keep := float32(1 / (1 - float64(l.P)))
	for i, v := range x {
		m := keep
		if device.UniformAt(l.seed, uint64(i)) < float64(l.P) {
			m = 0
		}
		l.mask[i], l.y[i] = m, v*m
	}
	return l.y
}

// Backward implements Layer; dL/dx overwrites dy.
func (l *Dropout) Backward(be device.Backend, dy []float32, n int, needDx bool) []float32 {
	if !needDx {
		return nil
	}
	dy = dy[:n*l.size]
	if l.active() {
		be.Mul(dy, dy, l.mask)
	}
	return dy
}

// CausalSelfAttention is multi-head self-attention over a sequence [T, Dim]
// in which position i attends to positions ≤ i. Its parameters follow
// minGPT's CausalSelfAttention: "c_attn" is the fused QKV projection,
// Linear(Dim, 3·Dim), whose output rows are q, then k, then v, each split
// into Heads heads of Dim/Heads consecutive values; "c_proj" is the output
// projection Linear(Dim, Dim). That is also torch.nn.MultiheadAttention's
// layout: its in_proj_weight, in_proj_bias, out_proj.weight and
// out_proj.bias are c_attn.weight, c_attn.bias, c_proj.weight and
// c_proj.bias under other names. Scores are scaled by 1/√(Dim/Heads); the
// attention probabilities are not dropped out.
type CausalSelfAttention struct {
	Dim, Heads int

	noParams  // the projections are children
	qkv, proj Dense
	t         int
	children  []Child
	o, att    []float32 // head outputs [n, T, Dim]; probabilities [n, Heads, T, T]
	dqkv, dp  []float32
}

var _ Container = (*CausalSelfAttention)(nil)

// Kind implements Layer.
func (l *CausalSelfAttention) Kind() string { return "CausalSelfAttention" }

// Children implements Container.
func (l *CausalSelfAttention) Children() []Child {
	if l.children == nil {
		l.children = []Child{{"c_attn", &l.qkv}, {"c_proj", &l.proj}}
	}
	return l.children
}

// Setup implements Layer.
func (l *CausalSelfAttention) Setup(in Shape) (Shape, error) {
	if l.Heads <= 0 || l.Dim <= 0 || l.Dim%l.Heads != 0 {
		return nil, fmt.Errorf("%w: CausalSelfAttention(dim %d, heads %d): heads must divide dim", ErrShape, l.Dim, l.Heads)
	}
	if len(in) != 2 || in[1] != l.Dim {
		return nil, fmt.Errorf("%w: CausalSelfAttention(dim %d) needs [T, %d] input, got %v", ErrShape, l.Dim, l.Dim, in)
	}
	l.t = in[0]
	l.qkv = Dense{In: l.Dim, Out: 3 * l.Dim}
	l.proj = Dense{In: l.Dim, Out: l.Dim}
	if _, err := l.qkv.Setup(in); err != nil {
		return nil, err
	}
	return l.proj.Setup(in)
}

// flops counts the score and weighted-sum products (the full T×T blocks
// the GEMMs compute, masked half included); the projections count as
// children.
func (l *CausalSelfAttention) flops() float64 { return 4 * float64(l.t*l.t) * float64(l.Dim) }

// strided is one operand of a GemmStrided over the samples of a batch: a
// matrix starting in s with leading dimension ld, the next sample's
// stride values further on.
type strided struct {
	s          []float32
	ld, stride int
}

// gemmSamples runs C = alpha·op(A)·op(B) for every sample of the batch.
func gemmSamples(be device.Backend, tA, tB bool, m, n, k int, alpha float32, a, b, c strided, samples int) {
	be.GemmStrided(tA, tB, m, n, k, alpha, a.s, a.ld, a.stride, b.s, b.ld, b.stride, 0, c.s, c.ld, c.stride, samples)
}

// head returns the operands of head h: its q, k and v in the [n·T, 3·Dim]
// projection p, its output (or output gradient) in the [n·T, Dim] matrix
// o, and its T×T block in the [n, Heads, T, T] scores s.
func (l *CausalSelfAttention) head(h int, p, o, s []float32) (q, k, v, oh, sh strided) {
	d, t, hs := l.Dim, l.t, l.Dim/l.Heads
	q = strided{p[h*hs:], 3 * d, t * 3 * d}
	k = strided{p[d+h*hs:], 3 * d, t * 3 * d}
	v = strided{p[2*d+h*hs:], 3 * d, t * 3 * d}
	return q, k, v, strided{o[h*hs:], d, t * d}, strided{s[h*t*t:], t, l.Heads * t * t}
}

// Forward implements Layer.
func (l *CausalSelfAttention) Forward(be device.Backend, x []float32, n int) []float32 {
	t, hs := l.t, l.Dim/l.Heads
	scale := float32(1 / math.Sqrt(float64(hs)))
	qkv := l.qkv.Forward(be, x, n)
	l.att = grow(be, l.att, n*l.Heads*t*t)
	l.o = grow(be, l.o, n*t*l.Dim)
	for h := 0; h < l.Heads; h++ {
		q, k, _, _, s := l.head(h, qkv, l.o, l.att)
		gemmSamples(be, false, true, t, t, hs, scale, q, k, s, n) // S = Q·Kᵀ/√hs
	}
	be.SoftmaxRows(l.att, l.att, n*l.Heads*t, t, true)
	for h := 0; h < l.Heads; h++ {
		_, _, v, o, p := l.head(h, qkv, l.o, l.att)
		gemmSamples(be, false, false, t, hs, t, 1, p, v, o, n) // O = P·V
	}
	return l.proj.Forward(be, l.o, n)
}

// Backward implements Layer.
func (l *CausalSelfAttention) Backward(be device.Backend, dy []float32, n int, needDx bool) []float32 {
	t, hs := l.t, l.Dim/l.Heads
	scale := float32(1 / math.Sqrt(float64(hs)))
	do := l.proj.Backward(be, dy, n, true)
	l.dqkv = grow(be, l.dqkv, n*t*3*l.Dim)
	l.dp = grow(be, l.dp, len(l.att))
	for h := 0; h < l.Heads; h++ {
		_, _, v, dO, p := l.head(h, l.qkv.y, do, l.att)
		_, _, dv, _, dp := l.head(h, l.dqkv, do, l.dp)
		gemmSamples(be, false, true, t, t, hs, 1, dO, v, dp, n) // dP = dO·Vᵀ
		gemmSamples(be, true, false, t, hs, t, 1, p, dO, dv, n) // dV = Pᵀ·dO
	}
	be.SoftmaxRowsBackward(l.dp, l.dp, l.att, n*l.Heads*t, t)
	for h := 0; h < l.Heads; h++ {
		q, k, _, _, ds := l.head(h, l.qkv.y, do, l.dp)
		dq, dk, _, _, _ := l.head(h, l.dqkv, do, l.dp)
		gemmSamples(be, false, false, t, hs, t, scale, ds, k, dq, n) // dQ = dS·K/√hs
		gemmSamples(be, true, false, t, hs, t, scale, ds, q, dk, n)  // dK = dSᵀ·Q/√hs
	}
	return l.qkv.Backward(be, l.dqkv, n, needDx)
}
