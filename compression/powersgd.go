package compression

import (
	"encoding/binary"
	"fmt"
	"math"
)

// DefaultRank is the rank PowerSGD uses when Rank is 0.
const DefaultRank = 4

// maxTensors bounds the number of tensors in a PowerSGD layout.
const maxTensors = 1 << 16

// Shape is one tensor of the flat parameter vector viewed as a Rows×Cols
// row-major matrix (a convolution weight F×C×KH×KW is F×(C·KH·KW); a bias is
// 1×len). A layout is the list of shapes in the order the tensors sit in the
// vector.
type Shape struct{ Rows, Cols int }

// PowerSGD compresses each matrix M (rows×cols) of the vector to rank r with
// one step of subspace (power) iteration warm-started from the previous
// step's Q (Vogels et al., 2019):
//
//	P = M·Q        (rows×r)
//	P̂ = orthonormalise(P)  (Gram–Schmidt on P's columns)
//	Q = Mᵀ·P̂      (cols×r)
//	M̂ = P̂·Qᵀ, and Q is kept as the next step's start.
//
// Tensors where this does not pay, (rows+cols)·r ≥ rows·cols (biases, tiny
// matrices), are sent raw. The error has no per-value bound; use PowerSGD
// with error feedback, as the paper does.
//
// Without SetLayout a vector of n is folded into one ⌊√n⌋-column matrix (and a
// raw tail): that works but has little low-rank structure; give the model's
// real shapes.
//
// PowerSGD is linear in M for a fixed Q, so it composes with all-reduce in
// two dense rounds instead of decode–sum–re-encode; see Project, Backproject
// and Reconstruct and the package documentation.
//
// Wire: header, uvarint tensor count, per tensor uvarint rows, cols and r
// (r = 0: raw), then per tensor either rows·cols float32s or P̂ column by column
// (r×rows) then Q column by column (r×cols). A decoder reads the layout from
// the bytes. PowerSGD keeps state (the warm-start Q) and scratch: it is not
// safe for concurrent use, and Decode is stateless.
type PowerSGD struct {
	// Rank is the target rank r; 0 means DefaultRank.
	Rank int
	// Seed seeds the initial Q; peers of one all-reduce must share it.
	Seed uint64

	layout  []Shape
	ranks   []int       // effective rank per tensor, 0 = raw
	q       [][]float32 // per tensor Qᵀ (r×cols), nil for raw tensors
	layoutN int         // Σ rows·cols of layout
	fixed   bool        // layout set by SetLayout (not folded from n)
	p, qv   []float32   // Encode scratch: phase-1 and phase-2 vectors
}

var _ Codec = (*PowerSGD)(nil)

// ID implements Codec.
func (*PowerSGD) ID() ID { return IDPowerSGD }

// Name implements Codec.
func (c *PowerSGD) Name() string { return nameOf(c) }

func (c *PowerSGD) spec() string {
	return fmt.Sprintf("powersgd:rank=%d,seed=%d", c.rank(), c.Seed)
}

func (c *PowerSGD) rank() int {
	if c.Rank <= 0 {
		return DefaultRank
	}
	return c.Rank
}

// SetLayout sets the tensor shapes of the vectors to come and resets the
// warm-start state. Their sizes must sum to the vector length.
func (c *PowerSGD) SetLayout(layout []Shape) error {
	if len(layout) > maxTensors {
		return fmt.Errorf("%w: %d tensors, at most %d", ErrBadSpec, len(layout), maxTensors)
	}
	n := 0
	for i, s := range layout {
		if s.Rows <= 0 || s.Cols <= 0 {
			return fmt.Errorf("%w: tensor %d has shape %dx%d", ErrBadSpec, i, s.Rows, s.Cols)
		}
		n += s.Rows * s.Cols
	}
	c.setLayout(append([]Shape(nil), layout...), n)
	c.fixed = true
	return nil
}

// Layout returns the layout in use (nil before the first Encode without
// SetLayout). The returned slice is owned by the PowerSGD.
func (c *PowerSGD) Layout() []Shape { return c.layout }

func (c *PowerSGD) setLayout(layout []Shape, n int) {
	r := c.rank()
	c.layout, c.layoutN = layout, n
	c.ranks = make([]int, len(layout))
	c.q = make([][]float32, len(layout))
	for t, s := range layout {
		c.ranks[t] = effRank(s, r)
		if c.ranks[t] > 0 {
			c.q[t] = make([]float32, c.ranks[t]*s.Cols)
			c.initQ(t)
		}
	}
}

// effRank is the rank a tensor is sent at; 0 means raw.
func effRank(s Shape, r int) int {
	r = min(r, s.Rows, s.Cols)
	if (s.Rows+s.Cols)*r >= s.Rows*s.Cols {
		return 0
	}
	return r
}

// initQ fills tensor t's Q with deterministic N(0, 1) values from Seed.
func (c *PowerSGD) initQ(t int) {
	q := c.q[t]
	base := splitmix64(c.Seed ^ splitmix64(uint64(t)+1))
	for i := range q {
		q[i] = normal(base, uint64(i))
	}
}

// normal returns a standard normal value derived from (seed, i) alone.
func normal(seed, i uint64) float32 {
	a := splitmix64(seed + 2*i*0x9e3779b97f4a7c15)
	b := splitmix64(seed + (2*i+1)*0x9e3779b97f4a7c15)
	u1 := (float64(a>>11) + 0.5) / (1 << 53)
	u2 := float64(b>>11) / (1 << 53)
	return float32(math.Sqrt(-2*math.Log(u1)) * math.Cos(2*math.Pi*u2))
}

// ensure makes the layout cover a vector of n, folding it when no layout was
// set. It panics when a layout set by SetLayout does not sum to n: that is a
// programming error, not bad input.
func (c *PowerSGD) ensure(n int) {
	if c.layout != nil && c.layoutN == n {
		return
	}
	if c.fixed {
		panic(fmt.Sprintf("compression: PowerSGD layout covers %d values, vector has %d", c.layoutN, n))
	}
	var layout []Shape
	if n > 0 {
		cols := max(int(math.Sqrt(float64(n))), 1)
		rows := n / cols
		layout = append(layout, Shape{rows, cols})
		if tail := n - rows*cols; tail > 0 {
			layout = append(layout, Shape{1, tail})
		}
	}
	c.setLayout(layout, n)
}

// PLen returns the length of the phase-1 vector for a vector of n: r·rows per
// compressed tensor plus rows·cols per raw tensor.
func (c *PowerSGD) PLen(n int) int {
	c.ensure(n)
	l := 0
	for t, s := range c.layout {
		if r := c.ranks[t]; r > 0 {
			l += r * s.Rows
		} else {
			l += s.Rows * s.Cols
		}
	}
	return l
}

// QLen returns the length of the phase-2 vector for a vector of n: r·cols per
// compressed tensor.
func (c *PowerSGD) QLen(n int) int {
	c.ensure(n)
	l := 0
	for t, s := range c.layout {
		l += c.ranks[t] * s.Cols
	}
	return l
}

// Project is phase 1 of a PowerSGD all-reduce: it returns (in dst, resized to
// PLen) P = M·Q for every compressed tensor of m, with the warm-start Q, and
// the raw tensors verbatim. All-reduce (sum or mean) it, then call
// Backproject.
func (c *PowerSGD) Project(dst []float32, m []float32) []float32 {
	c.ensure(len(m))
	c.normaliseQ()
	dst = resizeF(dst, c.PLen(len(m)))
	off, po := 0, 0
	for t, s := range c.layout {
		mt := m[off : off+s.Rows*s.Cols]
		off += s.Rows * s.Cols
		r := c.ranks[t]
		if r == 0 {
			po += copy(dst[po:], mt)
			continue
		}
		pt := dst[po : po+r*s.Rows]
		po += r * s.Rows
		qt := c.q[t]
		for i := 0; i < s.Rows; i++ {
			row := mt[i*s.Cols : (i+1)*s.Cols]
			for l := 0; l < r; l++ {
				pt[l*s.Rows+i] = dot32(row, qt[l*s.Cols:(l+1)*s.Cols])
			}
		}
	}
	return dst
}

// normaliseQ scales every column of every warm-start Q to unit length (which
// leaves P̂ unchanged) and redraws any column that collapsed to zero.
func (c *PowerSGD) normaliseQ() {
	for t, qt := range c.q {
		if qt == nil {
			continue
		}
		cols := c.layout[t].Cols
		for l := 0; l < c.ranks[t]; l++ {
			col := qt[l*cols : (l+1)*cols]
			nrm := math.Sqrt(sumSq(col))
			if nrm == 0 || math.IsNaN(nrm) || math.IsInf(nrm, 0) {
				base := splitmix64(c.Seed ^ splitmix64(uint64(t)+1))
				for j := range col {
					col[j] = normal(base, uint64(l*cols+j))
				}
				nrm = math.Sqrt(sumSq(col))
			}
			scaleF(col, float32(1/nrm))
		}
	}
}

// Backproject is phase 2: it orthonormalises, in place, the P part of p (the
// all-reduced phase-1 vector) and returns (in dst, resized to QLen) Q = Mᵀ·P̂
// for every compressed tensor of m. All-reduce it the same way as p, then call
// Reconstruct(out, p, q) and SetWarmStart(q).
func (c *PowerSGD) Backproject(dst []float32, m []float32, p []float32) []float32 {
	c.ensure(len(m))
	dst = resizeF(dst, c.QLen(len(m)))
	clear(dst)
	off, po, qo := 0, 0, 0
	for t, s := range c.layout {
		mt := m[off : off+s.Rows*s.Cols]
		off += s.Rows * s.Cols
		r := c.ranks[t]
		if r == 0 {
			po += s.Rows * s.Cols
			continue
		}
		pt := p[po : po+r*s.Rows]
		po += r * s.Rows
		orthonormalise(pt, s.Rows, r)
		qt := dst[qo : qo+r*s.Cols]
		qo += r * s.Cols
		for i := 0; i < s.Rows; i++ {
			row := mt[i*s.Cols : (i+1)*s.Cols]
			for l := 0; l < r; l++ {
				axpy32(pt[l*s.Rows+i], row, qt[l*s.Cols:(l+1)*s.Cols])
			}
		}
	}
	return dst
}

// Reconstruct writes into out (the vector length) P̂·Qᵀ for every compressed
// tensor and the raw tensors from p, where p is the phase-1 vector after
// Backproject and q the all-reduced phase-2 vector.
func (c *PowerSGD) Reconstruct(out []float32, p, q []float32) {
	c.ensure(len(out))
	off, po, qo := 0, 0, 0
	for t, s := range c.layout {
		ot := out[off : off+s.Rows*s.Cols]
		off += s.Rows * s.Cols
		r := c.ranks[t]
		if r == 0 {
			po += copy(ot, p[po:po+s.Rows*s.Cols])
			continue
		}
		pt := p[po : po+r*s.Rows]
		po += r * s.Rows
		qt := q[qo : qo+r*s.Cols]
		qo += r * s.Cols
		clear(ot)
		for i := 0; i < s.Rows; i++ {
			row := ot[i*s.Cols : (i+1)*s.Cols]
			for l := 0; l < r; l++ {
				axpy32(pt[l*s.Rows+i], qt[l*s.Cols:(l+1)*s.Cols], row)
			}
		}
	}
}

// SetWarmStart stores q (the all-reduced phase-2 vector) as the Q the next
// Project starts from. Every peer must store the same q.
func (c *PowerSGD) SetWarmStart(q []float32) {
	qo := 0
	for _, qt := range c.q {
		if qt != nil {
			qo += copy(qt, q[qo:qo+len(qt)])
		}
	}
}

// Encode implements Codec: the three steps above on this vector alone.
func (c *PowerSGD) Encode(dst []byte, src []float32) []byte {
	n := len(src)
	c.p = c.Project(c.p, src)
	c.qv = c.Backproject(c.qv, src, c.p)
	c.SetWarmStart(c.qv)

	size := headerLen(n) + uvarintLen(uint64(len(c.layout)))
	for t, s := range c.layout {
		size += uvarintLen(uint64(s.Rows)) + uvarintLen(uint64(s.Cols)) + uvarintLen(uint64(c.ranks[t]))
	}
	size += 4 * (len(c.p) + len(c.qv))
	out := resize(dst, size)
	off := putHeader(out, IDPowerSGD, n)
	off += putUvarint(out[off:], uint64(len(c.layout)))
	for t, s := range c.layout {
		off += putUvarint(out[off:], uint64(s.Rows))
		off += putUvarint(out[off:], uint64(s.Cols))
		off += putUvarint(out[off:], uint64(c.ranks[t]))
	}
	po, qo := 0, 0
	for t, s := range c.layout {
		if r := c.ranks[t]; r == 0 {
			putFloats(out[off:], c.p[po:po+s.Rows*s.Cols])
			off += 4 * s.Rows * s.Cols
			po += s.Rows * s.Cols
		} else {
			putFloats(out[off:], c.p[po:po+r*s.Rows])
			off += 4 * r * s.Rows
			po += r * s.Rows
			putFloats(out[off:], c.qv[qo:qo+r*s.Cols])
			off += 4 * r * s.Cols
			qo += r * s.Cols
		}
	}
	return out
}

// Decode implements Codec.
func (*PowerSGD) Decode(dst []float32, src []byte) error { return powerDecode(dst, src, false) }

func (*PowerSGD) decodeAdd(acc []float32, src []byte) error { return powerDecode(acc, src, true) }

func powerDecode(dst []float32, src []byte, add bool) error {
	r, err := readHeader(src, IDPowerSGD, len(dst))
	if err != nil {
		return err
	}
	n := uint64(len(dst))
	nt := r.uvarint()
	if r.err == nil && (nt > n || nt > maxTensors) {
		r.fail("%d tensors for %d values", nt, n)
	}
	// Pass 1: validate the layout and size the payload.
	shapes := r.b
	var total, payload uint64
	for t := uint64(0); t < nt && r.err == nil; t++ {
		rows, cols, rk := r.uvarint(), r.uvarint(), r.uvarint()
		if r.err != nil {
			break
		}
		if rows == 0 || cols == 0 || rows > n || cols > n/rows || rows*cols > n-total {
			r.fail("tensor %d: shape %dx%d does not fit %d values", t, rows, cols, n)
			break
		}
		total += rows * cols
		if rk == 0 {
			payload += rows * cols
		} else {
			if rk > min(rows, cols) || (rows+cols)*rk >= rows*cols {
				r.fail("tensor %d: rank %d for %dx%d", t, rk, rows, cols)
				break
			}
			payload += (rows + cols) * rk
		}
	}
	if r.err == nil && total != n {
		r.fail("layout covers %d values, want %d", total, n)
	}
	data := r.bytes(4 * payload)
	if err := r.end(); err != nil {
		return err
	}
	// Pass 2: decode, re-reading the (now validated) layout.
	sr := reader{b: shapes}
	off := 0
	for t := uint64(0); t < nt; t++ {
		rows, cols, rk := int(sr.uvarint()), int(sr.uvarint()), int(sr.uvarint())
		ot := dst[off : off+rows*cols]
		off += rows * cols
		if rk == 0 {
			if add {
				addFloats(ot, data)
			} else {
				getFloats(ot, data)
			}
			data = data[4*rows*cols:]
			continue
		}
		pt := data[:4*rk*rows]
		qt := data[4*rk*rows : 4*rk*(rows+cols)]
		data = data[4*rk*(rows+cols):]
		if !add {
			clear(ot)
		}
		for i := 0; i < rows; i++ {
			row := ot[i*cols : (i+1)*cols]
			for l := 0; l < rk; l++ {
				a := getFloat(pt, l*rows+i)
				q := qt[4*l*cols : 4*(l+1)*cols]
				for j := range row {
					row[j] += float32(a * math.Float32frombits(binary.LittleEndian.Uint32(q[4*j:])))
				}
			}
		}
	}
	return nil
}

// The arithmetic below writes every product as float32(a*b) or
// float64(a*b): Go may otherwise fuse a*b+c into an FMA on some targets
// (GOAMD64=v3, arm64), and peers built differently would then orthonormalise
// the same all-reduced P into different P̂.

// orthonormalise runs modified Gram–Schmidt on the r columns of P, stored
// column by column in pt (r×rows), accumulating in float64. A column that
// becomes numerically zero is set to zero.
func orthonormalise(pt []float32, rows, r int) {
	for l := 0; l < r; l++ {
		col := pt[l*rows : (l+1)*rows]
		for k := 0; k < l; k++ {
			prev := pt[k*rows : (k+1)*rows]
			d := dot64(prev, col)
			axpy32(float32(-d), prev, col)
		}
		nrm := math.Sqrt(sumSq(col))
		if nrm < 1e-30 || math.IsNaN(nrm) || math.IsInf(nrm, 0) {
			clear(col)
			continue
		}
		scaleF(col, float32(1/nrm))
	}
}

func dot32(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += float32(a[i] * b[i])
		s1 += float32(a[i+1] * b[i+1])
		s2 += float32(a[i+2] * b[i+2])
		s3 += float32(a[i+3] * b[i+3])
	}
	for ; i < len(a); i++ {
		s0 += float32(a[i] * b[i])
	}
	return (s0 + s1) + (s2 + s3)
}

func dot64(a, b []float32) float64 {
	b = b[:len(a)]
	var s float64
	for i, v := range a {
		s += float64(float64(v) * float64(b[i]))
	}
	return s
}

func sumSq(a []float32) float64 {
	var s float64
	for _, v := range a {
		s += float64(float64(v) * float64(v))
	}
	return s
}

// axpy32 computes y += alpha·x.
func axpy32(alpha float32, x, y []float32) {
	y = y[:len(x)]
	for i, v := range x {
		y[i] += float32(alpha * v)
	}
}

func scaleF(x []float32, a float32) {
	for i := range x {
		x[i] *= a
	}
}

var _ Stateful = (*PowerSGD)(nil)

// AppendState implements Stateful: the layout (and whether SetLayout fixed
// it) and every warm-start Q.
func (c *PowerSGD) AppendState(dst []byte) []byte {
	dst = append(dst, statePowerSGD)
	fixed := uint64(0)
	if c.fixed {
		fixed = 1
	}
	dst = appendUvarint(dst, fixed)
	dst = appendUvarint(dst, uint64(len(c.layout)))
	for _, s := range c.layout {
		dst = appendUvarint(dst, uint64(s.Rows))
		dst = appendUvarint(dst, uint64(s.Cols))
	}
	for _, q := range c.q {
		off := len(dst)
		dst = append(dst, make([]byte, 4*len(q))...)
		putFloats(dst[off:], q)
	}
	return dst
}

// LoadState implements Stateful. The state must come from a PowerSGD of the
// same rank.
func (c *PowerSGD) LoadState(b []byte) error {
	r := reader{b: b}
	if r.byte() != statePowerSGD && r.err == nil {
		return fmt.Errorf("%w: not a PowerSGD state", ErrState)
	}
	fixed := r.uvarint()
	nt := r.uvarint()
	if r.err == nil && nt > maxTensors {
		r.fail("%d tensors", nt)
	}
	if r.err != nil {
		return fmt.Errorf("%w: %v", ErrState, r.err)
	}
	layout := make([]Shape, nt)
	n := 0
	for t := range layout {
		rows, cols := r.uvarint(), r.uvarint()
		if r.err == nil && (rows == 0 || cols == 0 || rows > math.MaxInt32 || cols > math.MaxInt32/rows) {
			r.fail("tensor %d has shape %dx%d", t, rows, cols)
		}
		if r.err != nil {
			return fmt.Errorf("%w: %v", ErrState, r.err)
		}
		layout[t] = Shape{int(rows), int(cols)}
		n += int(rows * cols)
	}
	var qn uint64
	for _, s := range layout {
		qn += uint64(effRank(s, c.rank()) * s.Cols)
	}
	qb := r.bytes(4 * qn)
	if err := r.end(); err != nil {
		return fmt.Errorf("%w: %v", ErrState, err)
	}
	c.setLayout(layout, n)
	c.fixed = fixed == 1
	for _, q := range c.q {
		getFloats(q, qb)
		qb = qb[4*len(q):]
	}
	return nil
}
