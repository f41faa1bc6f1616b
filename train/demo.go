package train

import (
	"fmt"
	"math"

	"github.com/starling-ml/starling/device"
	"github.com/starling-ml/starling/internal/spec"
	"github.com/starling-ml/starling/nn"
)

// DeMo (Peng, Quesnelle and Kingma, "DeMo: Decoupled Momentum
// Optimization", arXiv 2411.19870) as the exchange of synchronous
// data-parallel SGD (SyncConfig.DeMo). Each peer keeps its own momentum
// m and, every step,
//
//	m ← β·m + g                          (local; never averaged)
//	C = DCT(m)                           (per s×s tile of each matrix, per
//	                                      chunk of s of each vector)
//	Ĉ = the k largest |C| of each tile   (the rest zero)
//	m ← m − IDCT(Ĉ)                      (the momentum is the error feedback)
//	Q = IDCT(mean over the peers of Ĉ)   (the all-reduce of a sparse vector)
//	θ ← θ − η·(sign(Q) + λ·θ)            (the worker's SGD on sign(Q))
//
// The DCT is the orthonormal DCT-II, so IDCT is its transpose. Only Ĉ
// travels: k of every s² values of the matrices, with its indices (the
// compression codec "sparse", lossless). Unlike the paper, a tensor's
// tiles need not divide it: edge tiles are smaller and keep k·area/s²
// coefficients (at least one).

// DeMoConfig configures DeMo; the zero value is off.
type DeMoConfig struct {
	// Chunk is the tile side s: matrices are cut in s×s tiles, vectors in
	// chunks of s. 64, as the paper.
	Chunk int
	// TopK is the number of coefficients each full tile sends. 32, as the
	// paper (1 in 128 of a 64×64 tile; 32 of 64 of a vector's chunk).
	TopK int
	// Beta is the momentum's decay. 0.999, as the paper.
	Beta float32
	// NoSign sends Q itself, not its sign, to the optimiser.
	NoSign bool
	// Bits is how many mantissa bits of each sent coefficient are kept
	// (rounded to nearest, ties to even; what is rounded off stays in the
	// momentum like every unsent coefficient): 23 sends float32 exactly,
	// 7 the precision of bfloat16, in which the paper sends them. The
	// zeroed low bits cost nearly nothing on the wire once the sparse
	// codec's zstd stage squeezes them. 0 means 23.
	Bits int
}

// On reports whether DeMo is configured.
func (c DeMoConfig) On() bool { return c.TopK > 0 }

// Validate reports settings that cannot work.
func (c DeMoConfig) Validate() error {
	if !c.On() {
		return nil
	}
	switch {
	case c.Chunk < 1 || c.Chunk > 1<<12:
		return fmt.Errorf("%w: demo chunk %d not in [1, 4096]", ErrSync, c.Chunk)
	case c.TopK > c.Chunk*c.Chunk:
		return fmt.Errorf("%w: demo k=%d is more than a tile's %d coefficients", ErrSync, c.TopK, c.Chunk*c.Chunk)
	case !(c.Beta >= 0 && c.Beta < 1):
		return fmt.Errorf("%w: demo beta %v not in [0, 1)", ErrSync, c.Beta)
	case c.Bits < 0 || c.Bits > 23:
		return fmt.Errorf("%w: demo bits %d not in [0, 23]", ErrSync, c.Bits)
	}
	return nil
}

// ParseSyncStrategy reads --mode sync's --strategy: "dp" (data-parallel
// SGD: the zero DeMoConfig) or "demo[:chunk=64,k=32,beta=0.999,sign=1,bits=23]".
func ParseSyncStrategy(s string) (DeMoConfig, error) {
	t, err := spec.One(s)
	if err != nil {
		return DeMoConfig{}, fmt.Errorf("%w: %w", ErrSync, err)
	}
	r := t.Reader()
	r.Keyed()
	var c DeMoConfig
	switch t.Name {
	case "dp":
	case "demo":
		c.Chunk = r.Int("chunk", 64, 1, 1<<12)
		c.TopK = r.Int("k", 32, 1, 1<<24)
		c.Beta = float32(r.Float("beta", 0.999, spec.In(0, 1, true, false)))
		c.NoSign = r.Int("sign", 1, 0, 1) == 0
		if c.Bits = r.Int("bits", 23, 1, 23); c.Bits == 23 {
			c.Bits = 0
		}
	default:
		return DeMoConfig{}, fmt.Errorf("%w: %w", ErrSync, t.Errorf("unknown sync strategy %q (want dp or demo)", t.Name))
	}
	if err := r.Done(); err != nil {
		return DeMoConfig{}, fmt.Errorf("%w: %w", ErrSync, err)
	}
	return c, c.Validate()
}

// demoBand is a band of up to Chunk rows of one tensor (rows×cols, rows
// ld = cols apart) starting at parameter offset off: the unit the DCT runs
// on, two or three GEMMs a band. Its tiles are its column blocks.
type demoBand struct {
	off, rows, cols int
}

// demoTile is one tile, rows×cols of a tensor whose rows are ld apart,
// starting at offset off (its coefficients lie where its values do), of
// which k coefficients are sent.
type demoTile struct {
	off, ld    int
	rows, cols int
	k          int
}

// DeMo is one peer's DeMo state: its momentum and the tiling of the
// model. It is not safe for concurrent use.
type DeMo struct {
	cfg   DeMoConfig
	be    device.Backend
	bands []demoBand
	tiles []demoTile
	dct   map[int][]float32 // orthonormal DCT-II matrices by size
	n     int

	m    []float32 // momentum
	c    []float32 // its coefficients
	sent []float32 // IDCT of what was sent
	tmp  []float32 // one band's intermediate
	mag  []float32 // one tile's magnitudes
}

// NewDeMo returns DeMo for a model of the given views (each tensor's
// shape: matrices and higher are tiled as [shape[0], the rest], vectors in
// chunks), computing on be. Coefficients lie in the parameters' layout:
// coefficient (i, j) of a tile where its value (i, j) is.
func NewDeMo(cfg DeMoConfig, views []nn.View, be device.Backend) (*DeMo, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if !cfg.On() {
		return nil, fmt.Errorf("%w: demo is off", ErrSync)
	}
	d := &DeMo{cfg: cfg, be: be, dct: map[int][]float32{}}
	s := cfg.Chunk
	covered, maxBand := 0, 0
	for _, v := range views {
		rows, cols := 1, v.Len
		if len(v.Shape) >= 2 {
			rows = v.Shape[0]
			cols = v.Len / max(rows, 1)
		}
		full := min(s, rows) * min(s, cols)
		for r0 := 0; r0 < rows; r0 += s {
			h := min(s, rows-r0)
			d.bands = append(d.bands, demoBand{off: v.Offset + r0*cols, rows: h, cols: cols})
			maxBand = max(maxBand, h*cols)
			d.basis(h)
			for c0 := 0; c0 < cols; c0 += s {
				w := min(s, cols-c0)
				k := min(h*w, max(1, (cfg.TopK*h*w+full-1)/full))
				d.tiles = append(d.tiles, demoTile{off: v.Offset + r0*cols + c0, ld: cols, rows: h, cols: w, k: k})
				d.basis(w)
			}
		}
		covered += v.Len
		d.n = max(d.n, v.Offset+v.Len)
	}
	if covered != d.n {
		return nil, fmt.Errorf("%w: demo: the model's tensors do not cover its %d parameters (%d)", ErrSync, d.n, covered)
	}
	d.m, d.c, d.sent = device.Alloc(be, d.n), device.Alloc(be, d.n), device.Alloc(be, d.n)
	d.tmp, d.mag = device.Alloc(be, maxBand), device.Alloc(be, s*s)
	return d, nil
}

// basis returns the orthonormal DCT-II matrix of size n (row k is the k-th
// basis vector), computing it once.
func (d *DeMo) basis(n int) []float32 {
	if b, ok := d.dct[n]; ok {
		return b
	}
	b := device.Alloc(d.be, n*n)
	for k := range n {
		scale := math.Sqrt(2 / float64(n))
		if k == 0 {
			scale = math.Sqrt(1 / float64(n))
		}
		for i := range n {
			b[k*n+i] = float32(scale * math.Cos(math.Pi*(float64(i)+0.5)*float64(k)/float64(n)))
		}
	}
	d.dct[n] = b
	return b
}

// forward sets the coefficients c to the DCT of x, C = D_h · X · D_wᵀ per
// tile: per band, D_h times the band, then each column block times D_wᵀ.
func (d *DeMo) forward(c, x []float32) {
	s := d.cfg.Chunk
	for _, b := range d.bands {
		h, cols := b.rows, b.cols
		tmp := d.tmp[:h*cols]
		if h == 1 {
			copy(tmp, x[b.off:b.off+cols])
		} else {
			d.be.Gemm(false, false, h, cols, h, 1, d.dct[h], h, x[b.off:], cols, 0, tmp, cols)
		}
		full, r := cols/s, cols%s
		if full > 0 {
			d.be.GemmStrided(false, true, h, s, s, 1, tmp, cols, s, d.dct[s], s, 0, 0, c[b.off:], cols, s, full)
		}
		if r > 0 {
			d.be.Gemm(false, true, h, r, r, 1, tmp[full*s:], cols, d.dct[r], r, 0, c[b.off+full*s:], cols)
		}
	}
}

// inverse sets x to the inverse DCT of c, X = D_hᵀ · C · D_w per tile.
func (d *DeMo) inverse(x, c []float32) {
	s := d.cfg.Chunk
	for _, b := range d.bands {
		h, cols := b.rows, b.cols
		tmp := d.tmp[:h*cols]
		if h == 1 {
			tmp = x[b.off : b.off+cols]
		}
		full, r := cols/s, cols%s
		if full > 0 {
			d.be.GemmStrided(false, false, h, s, s, 1, c[b.off:], cols, s, d.dct[s], s, 0, 0, tmp, cols, s, full)
		}
		if r > 0 {
			d.be.Gemm(false, false, h, r, r, 1, c[b.off+full*s:], cols, d.dct[r], r, 0, tmp[full*s:], cols)
		}
		if h > 1 {
			d.be.Gemm(true, false, h, cols, h, 1, d.dct[h], h, tmp, cols, 0, x[b.off:], cols)
		}
	}
}

// Len returns the length of the vectors Prepare and Finish take.
func (d *DeMo) Len() int { return d.n }

// Prepare folds the gradient g into the momentum and writes what this
// peer sends into send (tile-packed coefficients, all but k per tile
// zero). Commit then takes what was sent out of the momentum.
func (d *DeMo) Prepare(send, g []float32) {
	beta := d.cfg.Beta
	for i, v := range g {
		d.m[i] = beta*d.m[i] + v
	}
	d.forward(d.c, d.m)
	clear(send)
	for _, t := range d.tiles {
		d.selectTop(send, t)
	}
	if b := d.cfg.Bits; b > 0 && b < 23 {
		for i, v := range send {
			if v != 0 {
				send[i] = roundMantissa(v, b)
			}
		}
	}
	d.inverse(d.sent, send)
}

// Commit takes the coefficients Prepare sent out of the momentum: call it
// once their all-reduce succeeded (a failed one leaves them in, to be
// sent later).
func (d *DeMo) Commit() {
	for i, v := range d.sent {
		d.m[i] -= v
	}
}

// Finish writes the update direction for the optimiser into out
// (parameter layout): the sign of the inverse DCT of the peers' mean
// coefficients avg (or the inverse DCT itself with NoSign).
func (d *DeMo) Finish(out, avg []float32) {
	d.inverse(out, avg)
	if d.cfg.NoSign {
		return
	}
	for i, v := range out {
		switch {
		case v > 0:
			out[i] = 1
		case v < 0:
			out[i] = -1
		default:
			out[i] = 0
		}
	}
}

// Momentum returns the momentum (a view).
func (d *DeMo) Momentum() []float32 { return d.m }

// selectTop copies the k coefficients of tile t of largest magnitude
// (NaN counts as largest; ties go to the first in row-major order) from
// d.c into send.
func (d *DeMo) selectTop(send []float32, t demoTile) {
	area := t.rows * t.cols
	mag := d.mag[:area]
	for i := range t.rows {
		row := d.c[t.off+i*t.ld : t.off+i*t.ld+t.cols]
		for j, v := range row {
			mag[i*t.cols+j] = abs32(v)
		}
	}
	thr := kthLargest(mag, t.k) // reorders mag
	// Every coefficient above thr, then those equal to it, up to k.
	above := 0
	for i := range t.rows {
		for _, v := range d.c[t.off+i*t.ld : t.off+i*t.ld+t.cols] {
			if abs32(v) > thr {
				above++
			}
		}
	}
	ties := t.k - above
	for i := range t.rows {
		o := t.off + i*t.ld
		for j, v := range d.c[o : o+t.cols] {
			if m := abs32(v); m > thr || (m == thr && ties > 0) {
				if m == thr {
					ties--
				}
				send[o+j] = v
			}
		}
	}
}

// roundMantissa rounds x to bits (0 < bits < 23) mantissa bits, to
// nearest with ties to even; NaN and ±Inf are returned as they are, and a
// value that rounds past the largest finite float32 becomes ±Inf.
func roundMantissa(x float32, bits int) float32 {
	u := math.Float32bits(x)
	if u&0x7f800000 == 0x7f800000 {
		return x
	}
	drop := uint(23 - bits)
	half := uint32(1)<<(drop-1) - 1 + (u>>drop)&1
	u = (u + half) &^ (uint32(1)<<drop - 1)
	return math.Float32frombits(u)
}

// kthLargest returns the k-th largest value of x (1 ≤ k ≤ len(x)),
// reordering x (quickselect, median-of-three pivots).
func kthLargest(x []float32, k int) float32 {
	lo, hi, want := 0, len(x)-1, k-1 // index in descending order
	for lo < hi {
		mid := lo + (hi-lo)/2
		// Median of three to x[hi] as the pivot.
		if x[mid] > x[lo] {
			x[mid], x[lo] = x[lo], x[mid]
		}
		if x[hi] > x[lo] {
			x[hi], x[lo] = x[lo], x[hi]
		}
		if x[mid] > x[hi] {
			x[mid], x[hi] = x[hi], x[mid]
		}
		p := x[hi]
		i := lo
		for j := lo; j < hi; j++ {
			if x[j] > p {
				x[i], x[j] = x[j], x[i]
				i++
			}
		}
		x[i], x[hi] = x[hi], x[i]
		switch {
		case i == want:
			return x[i]
		case i < want:
			lo = i + 1
		default:
			hi = i - 1
		}
	}
	return x[want]
}

func abs32(v float32) float32 {
	b := math.Float32bits(v) & 0x7fffffff
	if b > 0x7f800000 { // NaN
		return float32(math.Inf(1))
	}
	return math.Float32frombits(b)
}
