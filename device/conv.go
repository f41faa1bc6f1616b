package device

import (
	"fmt"
	"math"
)

// The convolution helpers of the Fast backend. With AVX-512 each output
// pixel is one kernel call: im2col gathers the KH·KW window positions of
// each channel (16 at a time) into the channel's run of the im2col row,
// col2im gathers each window position's channel values (stride KH·KW in
// the row) and adds them to the pixel's contiguous channels, and max
// pooling compares 16 channels at a time. Window positions that fall in the
// padding are masked off, never addressed.

// convWindow is the per-call table of a convolution's window: offs[t] is
// the offset, in elements of an NHWC image, of window position t = ky·KW+kx
// from the window origin.
type convWindow struct {
	offs [32]int32
	kk   int
}

func newConvWindow(g ConvGeom) (w convWindow, ok bool) {
	w.kk = g.KH * g.KW
	if w.kk > 32 || g.H*g.W*g.C > math.MaxInt32 {
		return w, false
	}
	for ky := 0; ky < g.KH; ky++ {
		for kx := 0; kx < g.KW; kx++ {
			w.offs[ky*g.KW+kx] = int32((ky*g.W + kx) * g.C)
		}
	}
	return w, true
}

// rowMask returns the window positions whose row iy0+ky lies in [0, H).
func (g ConvGeom) rowMask(iy0 int) uint32 {
	var m uint32
	full := uint32(1)<<g.KW - 1
	for ky := 0; ky < g.KH; ky++ {
		if iy := iy0 + ky; iy >= 0 && iy < g.H {
			m |= full << (ky * g.KW)
		}
	}
	return m
}

// colMask returns the window positions whose column ix0+kx lies in [0, W).
func (g ConvGeom) colMask(ix0 int) uint32 {
	var bits uint32
	for kx := 0; kx < g.KW; kx++ {
		if ix := ix0 + kx; ix >= 0 && ix < g.W {
			bits |= 1 << kx
		}
	}
	var m uint32
	for ky := 0; ky < g.KH; ky++ {
		m |= bits << (ky * g.KW)
	}
	return m
}

func (g ConvGeom) mustFit(what string, x, col []float32) {
	if err := g.Validate(); err != nil {
		panic(fmt.Sprintf("device: %s: %v", what, err))
	}
	if want := g.N * g.H * g.W * g.C; len(x) < want {
		panic(fmt.Sprintf("device: %s: image len %d, want ≥ %d", what, len(x), want))
	}
	if want := g.ColRows() * g.ColCols(); len(col) < want {
		panic(fmt.Sprintf("device: %s: col len %d, want ≥ %d", what, len(col), want))
	}
}

// convPixels calls f for every output pixel with its im2col row index, the
// flat index of its window origin (possibly outside the image) and the mask
// of window positions inside the image.
func (g ConvGeom) convPixels(f func(row, origin int, mask uint32)) {
	oh, ow := g.OutH(), g.OutW()
	var cols [256]uint32
	for ox := 0; ox < min(ow, len(cols)); ox++ {
		cols[ox] = g.colMask(ox*g.StrideW - g.PadW)
	}
	row := 0
	for n := 0; n < g.N; n++ {
		for oy := 0; oy < oh; oy++ {
			iy0 := oy*g.StrideH - g.PadH
			rm := g.rowMask(iy0)
			for ox := 0; ox < ow; ox++ {
				ix0 := ox*g.StrideW - g.PadW
				cm := uint32(0)
				if ox < len(cols) {
					cm = cols[ox]
				} else {
					cm = g.colMask(ix0)
				}
				f(row, ((n*g.H+iy0)*g.W+ix0)*g.C, rm&cm)
				row++
			}
		}
	}
}

// Im2Col implements Backend.
func (f *Fast) Im2Col(col, x []float32, g ConvGeom) {
	w, ok := newConvWindow(g)
	if !f.vec || !ok || g.N == 0 {
		f.cpu.Im2Col(col, x, g)
		return
	}
	g.mustFit("Im2Col", x, col)
	cc := g.ColCols()
	// The kernel's stores are 64-byte vectors at a stride of KH·KW floats:
	// mostly split across cache lines, and measured 6× slower than a plain
	// copy when they miss the cache. So each row is built in an L1-resident
	// buffer and copied out.
	var tmp [2048]float32
	g.convPixels(func(row, origin int, mask uint32) {
		if cc <= len(tmp) {
			im2colPixelAVX512(&tmp[0], &x[0], origin, &w.offs[0], mask, w.kk, g.C)
			copy(col[row*cc:row*cc+cc], tmp[:cc])
			return
		}
		im2colPixelAVX512(&col[row*cc], &x[0], origin, &w.offs[0], mask, w.kk, g.C)
	})
}

// Col2Im implements Backend.
func (f *Fast) Col2Im(dx, col []float32, g ConvGeom) {
	w, ok := newConvWindow(g)
	// With few channels each gather fetches only a few lanes: the scalar
	// loop wins (measured at C = 1: 2× faster).
	if !f.vec || !ok || g.N == 0 || g.C < 8 {
		f.cpu.Col2Im(dx, col, g)
		return
	}
	g.mustFit("Col2Im", dx, col)
	cc := g.ColCols()
	// Each row is read by KH·KW strided gathers; one sequential copy into an
	// L1-resident buffer first lets the hardware prefetcher stream it.
	var tmp [2048]float32
	g.convPixels(func(row, origin int, mask uint32) {
		src := col[row*cc : row*cc+cc]
		if cc <= len(tmp) {
			copy(tmp[:cc], src)
			src = tmp[:cc]
		}
		col2imPixelAVX512(&dx[0], &src[0], origin, &w.offs[0], mask, w.kk, g.C)
	})
}

// MaxPool implements Backend.
func (f *Fast) MaxPool(y []float32, arg []int32, x []float32, g PoolGeom) {
	kk := g.K * g.K
	if !f.vec || kk > 64 || g.N*g.H*g.W*g.C > math.MaxInt32 || g.N == 0 {
		f.cpu.MaxPool(y, arg, x, g)
		return
	}
	if err := g.Validate(); err != nil {
		panic(fmt.Sprintf("device: MaxPool: %v", err))
	}
	oh, ow := g.OutH(), g.OutW()
	if len(x) < g.N*g.H*g.W*g.C || len(y) < g.N*oh*ow*g.C || len(arg) < g.N*oh*ow*g.C {
		panic(fmt.Sprintf("device: MaxPool: lens x %d y %d arg %d too short for %+v", len(x), len(y), len(arg), g))
	}
	var offs [64]int32
	for ky := 0; ky < g.K; ky++ {
		for kx := 0; kx < g.K; kx++ {
			offs[ky*g.K+kx] = int32((ky*g.W + kx) * g.C)
		}
	}
	for n := 0; n < g.N; n++ {
		for oy := 0; oy < oh; oy++ {
			o := ((n*oh + oy) * ow) * g.C
			base := (n*g.H + oy*g.Stride) * g.W * g.C
			maxPoolRowAVX512(&y[o], &arg[o], &x[0], base, g.Stride*g.C, ow, &offs[0], kk, g.C)
		}
	}
}
