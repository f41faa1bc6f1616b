package device

import (
	"fmt"
	"runtime"
	"sync"
)

// microKernel computes one MR×NR tile of C:
//
//	C[0:rows, cols] = alpha·(A·B) + beta·C[0:rows, cols]
//
// A is read in place in one of two layouts, chosen by which kernel is
// called: step layout A(r, p) = a[p·lda + r] (a packed panel with lda = MR,
// or op(A) = Aᵀ in place) or row layout A(r, p) = a[r·lda + p] (op(A) = A in
// place). B is a packed panel (kc steps of NR values; ldb ignored) or, for
// the direct kernels, B(p, j) = b[p·ldb + j] in place, read through the
// column mask. C is not read when beta is +0 (callers turn −0 into +0).
// Kernels that honour the column mask store (and, if direct, load) only the
// columns whose bit is set; the others store all NR columns and are only
// called on full-width tiles.
type microKernel func(kc int, a, b, c *float32, lda, ldb, ldc int, alpha, beta float32, rows int, mask uint64)

// gemmImpl is a blocked GEMM in the GotoBLAS/BLIS layout around one
// micro-kernel family: B is packed in kc×nc panels of NR-wide slivers (or,
// where a direct kernel exists and op(B) = B, read in place) and the kernel
// sweeps the MR×NR tiles of C. Full MR-row slivers of A are read in place;
// only the ragged last sliver is packed, zero padded.
type gemmImpl struct {
	name    string
	mr, nr  int
	masked  bool        // kernels honour the column mask
	kStep   microKernel // A step layout, B packed
	kRow    microKernel // A row layout, B packed; nil: pack A instead
	kStepB  microKernel // A step layout, B in place; nil: pack B
	kRowB   microKernel // A row layout, B in place
	packAll bool        // pack every A sliver (for kernels without in-place reads)

	// pack16 transposes 16×16 blocks for the transposing packs; nil: Go loops.
	pack16 func(d, src *float32, ld, w, blocks int)

	kc, mc, nc int // cache blocking: depth, rows of A per block, columns of B per panel

	// parFlops is the smallest 2·m·n·k worth splitting across goroutines.
	parFlops int

	// narrow, if set, takes the GEMMs with n ≤ narrow.nr.
	narrow *gemmImpl
}

// gemmBuf is one worker's packing space.
type gemmBuf struct {
	a, b, tile []float32
	pad        []float32 // 16 zero-padded rows for a ragged transposing pack
}

// gemmBufs keeps packing buffers: as many as GEMMs ever ran at once (≤ 64
// kept).
var gemmBufs = make(freeList[gemmBuf], 64)

func grow(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n)
	}
	return s[:n]
}

// checkGemm panics with a clear message when the slices are too short for the
// stated shapes: the kernels index through raw pointers, so this is the only
// bounds check they get.
func checkGemm(tA, tB bool, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int) {
	if m < 0 || n < 0 || k < 0 {
		panic(fmt.Sprintf("device: Gemm: negative dimension m=%d n=%d k=%d", m, n, k))
	}
	need := func(what string, s []float32, rows, cols, ld int) {
		if rows == 0 || cols == 0 {
			return
		}
		if ld < cols {
			panic(fmt.Sprintf("device: Gemm: leading dimension of %s is %d, want ≥ %d", what, ld, cols))
		}
		if want := (rows-1)*ld + cols; len(s) < want {
			panic(fmt.Sprintf("device: Gemm: len(%s) = %d, want ≥ %d", what, len(s), want))
		}
	}
	if m == 0 || n == 0 {
		return
	}
	if tA {
		need("a", a, k, m, lda)
	} else {
		need("a", a, m, k, lda)
	}
	if tB {
		need("b", b, n, k, ldb)
	} else {
		need("b", b, k, n, ldb)
	}
	need("c", c, m, n, ldc)
}

// begin checks a GEMM's slices, does the ones with nothing to multiply,
// and returns the kernel family and beta (−0 made +0) for the rest, or
// ok false when nothing is left to do.
func (g *gemmImpl) begin(tA, tB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) (_ *gemmImpl, _ float32, ok bool) {
	checkGemm(tA, tB, m, n, k, a, lda, b, ldb, c, ldc)
	if m == 0 || n == 0 {
		return g, beta, false
	}
	if g.narrow != nil && n <= g.narrow.nr {
		g = g.narrow
	}
	if k == 0 || alpha == 0 {
		scaleMatrix(beta, m, n, c, ldc)
		return g, beta, false
	}
	if beta == 0 {
		beta = 0 // −0 → +0: the kernels test the bit pattern
	}
	return g, beta, true
}

// gemm implements Backend.Gemm.
func (g *gemmImpl) gemm(tA, tB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	g, beta, ok := g.begin(tA, tB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
	if !ok {
		return
	}
	nt := g.threads(m, n, k)
	if nt <= 1 {
		g.serial(tA, tB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
		return
	}
	call := gemmCalls.get()
	*call = gemmCall{
		g: g, tA: tA, tB: tB, m: m, n: n, k: k,
		alpha: alpha, a: a, lda: lda, b: b, ldb: ldb, beta: beta, c: c, ldc: ldc,
		nt: nt, parts: call.parts,
	}
	mt, ntl := (m+g.mr-1)/g.mr, (n+g.nr-1)/g.nr
	switch {
	case g.kSplit(m, n, k, nt):
		call.split = splitK
		for len(call.parts) < nt {
			call.parts = append(call.parts, nil)
		}
		for w := 1; w < nt; w++ {
			call.parts[w] = grow(call.parts[w], m*n)
		}
	case mt >= ntl:
		call.split, call.tiles, call.unit = splitM, mt, g.mr
	default:
		call.split, call.tiles, call.unit = splitN, ntl, g.nr
	}
	forkJoin(call, call.nt)
	if call.split == splitK {
		// Worker 0 accumulated into C with the caller's beta; add the others.
		for w := 1; w < nt; w++ {
			p := call.parts[w]
			for i := 0; i < m; i++ {
				row := c[i*ldc : i*ldc+n]
				for j, v := range p[i*n : i*n+n] {
					row[j] += v
				}
			}
		}
	}
	putCall(call)
}

// Ways to split a GEMM across goroutines.
const (
	splitM     = iota // contiguous runs of MR-row tiles
	splitN            // contiguous runs of NR-column tiles
	splitK            // contiguous runs of kc steps, into private partial sums
	splitBatch        // contiguous runs of the GEMMs of a strided batch
)

// gemmCall is one GEMM split across goroutines: every part is an independent
// GEMM on a slice of the problem with its own packing buffers.
type gemmCall struct {
	g                  *gemmImpl
	tA, tB             bool
	m, n, k            int
	alpha, beta        float32
	a, b, c            []float32
	lda, ldb, ldc      int
	nt                 int
	split, tiles, unit int
	parts              [][]float32 // splitK: worker w > 0 accumulates into parts[w] (m×n)
	sa, sb, sc         int         // splitBatch: the strides between GEMMs (tiles counts them)
	wg                 sync.WaitGroup
}

// run computes part w of nt.
func (cl *gemmCall) run(w int) {
	g, nt := cl.g, cl.nt
	tA, tB, m, n, k := cl.tA, cl.tB, cl.m, cl.n, cl.k
	a, lda, b, ldb, c, ldc := cl.a, cl.lda, cl.b, cl.ldb, cl.c, cl.ldc
	switch cl.split {
	case splitBatch:
		for i := cl.tiles * w / nt; i < cl.tiles*(w+1)/nt; i++ {
			g.one(tA, tB, m, n, k, cl.alpha, a[i*cl.sa:], lda, b[i*cl.sb:], ldb, cl.beta, c[i*cl.sc:], ldc)
		}
	case splitK:
		steps := (k + g.kc - 1) / g.kc
		k0 := steps * w / nt * g.kc
		k1 := min(steps*(w+1)/nt*g.kc, k)
		if k0 >= k1 {
			if w > 0 {
				clear(cl.parts[w])
			}
			return
		}
		ao, bo := k0, k0*ldb
		if tA {
			ao = k0 * lda
		}
		if tB {
			bo = k0
		}
		if w == 0 {
			g.serial(tA, tB, m, n, k1-k0, cl.alpha, a[ao:], lda, b[bo:], ldb, cl.beta, c, ldc)
			return
		}
		g.serial(tA, tB, m, n, k1-k0, cl.alpha, a[ao:], lda, b[bo:], ldb, 0, cl.parts[w], n)
	case splitM:
		lo := cl.tiles * w / nt * cl.unit
		hi := min(cl.tiles*(w+1)/nt*cl.unit, m)
		if lo >= hi {
			return
		}
		ao := lo * lda
		if tA {
			ao = lo
		}
		g.serial(tA, tB, hi-lo, n, k, cl.alpha, a[ao:], lda, b, ldb, cl.beta, c[lo*ldc:], ldc)
	default:
		lo := cl.tiles * w / nt * cl.unit
		hi := min(cl.tiles*(w+1)/nt*cl.unit, n)
		if lo >= hi {
			return
		}
		bo := lo
		if tB {
			bo = lo * ldb
		}
		g.serial(tA, tB, m, hi-lo, k, cl.alpha, a, lda, b[bo:], ldb, cl.beta, c[lo:], ldc)
	}
}

// one runs a GEMM on the calling goroutine alone.
func (g *gemmImpl) one(tA, tB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	if g, beta, ok := g.begin(tA, tB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc); ok {
		g.serial(tA, tB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
	}
}

// gemmStrided implements Backend.GemmStrided: the GEMMs of a batch too
// small to split one by one are split across goroutines between them.
func (g *gemmImpl) gemmStrided(tA, tB bool, m, n, k int, alpha float32, a []float32, lda, sa int, b []float32, ldb, sb int, beta float32, c []float32, ldc, sc int, count int) {
	if count <= 0 {
		return
	}
	if sa < 0 || sb < 0 || sc < 0 {
		panic(fmt.Sprintf("device: GemmStrided: negative stride (%d, %d, %d)", sa, sb, sc))
	}
	last := count - 1 // the farthest GEMM: checking it checks them all
	g.one(tA, tB, m, n, k, alpha, a[last*sa:], lda, b[last*sb:], ldb, beta, c[last*sc:], ldc)
	count--
	flops := 2 * m * n * k
	nt := min(runtime.GOMAXPROCS(0), count)
	if count == 0 || flops*count < g.parFlops || flops >= g.parFlops || nt <= 1 {
		for i := 0; i < count; i++ {
			g.gemm(tA, tB, m, n, k, alpha, a[i*sa:], lda, b[i*sb:], ldb, beta, c[i*sc:], ldc)
		}
		return
	}
	call := gemmCalls.get()
	*call = gemmCall{
		g: g, tA: tA, tB: tB, m: m, n: n, k: k,
		alpha: alpha, a: a, lda: lda, b: b, ldb: ldb, beta: beta, c: c, ldc: ldc,
		nt: nt, parts: call.parts, split: splitBatch, tiles: count, sa: sa, sb: sb, sc: sc,
	}
	forkJoin(call, call.nt)
	putCall(call)
}

func (cl *gemmCall) waitGroup() *sync.WaitGroup { return &cl.wg }

// splitter is a call split into parts: a GEMM's or a pointwise kernel's.
type splitter interface {
	run(w int) // computes part w
	waitGroup() *sync.WaitGroup
}

// forkJoin runs parts 1..nt−1 of s on goroutines of their own, part 0 on
// the calling goroutine, and waits for the rest: no goroutine outlives the
// call.
func forkJoin(s splitter, nt int) {
	wg := s.waitGroup()
	wg.Add(nt - 1)
	for w := 1; w < nt; w++ {
		go runPart(s, w)
	}
	s.run(0)
	wg.Wait()
}

// runPart computes part w of s and says so. (A function, not a method
// value: go with a method value allocates a closure.)
func runPart(s splitter, w int) {
	s.run(w)
	s.waitGroup().Done()
}

var gemmCalls = make(freeList[gemmCall], 64)

// putCall drops the call's references to the caller's slices and keeps it
// (with its partial-sum buffers) for reuse.
func putCall(c *gemmCall) {
	c.a, c.b, c.c, c.g = nil, nil, nil, nil
	gemmCalls.put(c)
}

// threads returns how many goroutines a GEMM of this shape should use:
// GOMAXPROCS, less where the arithmetic would not pay for the hand-off, and
// at most one per two tiles (or per kc of depth, for a split along k).
func (g *gemmImpl) threads(m, n, k int) int {
	p := runtime.GOMAXPROCS(0)
	flops := 2 * m * n * k
	if p <= 1 || flops < g.parFlops {
		return 1
	}
	p = min(p, flops/g.parFlops)
	if g.kSplit(m, n, k, p) {
		return min(p, k/g.kc)
	}
	tiles := max((m+g.mr-1)/g.mr, (n+g.nr-1)/g.nr)
	return max(min(p, tiles/2), 1)
}

// kSplit reports whether nt goroutines should split the k dimension: when m
// and n are small next to k, as in a weight gradient over a large batch.
func (g *gemmImpl) kSplit(m, n, k, nt int) bool {
	return k >= 4*max(m, n) && k >= 2*g.kc
}

// serial runs the blocked algorithm on the calling goroutine.
func (g *gemmImpl) serial(tA, tB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	buf := gemmBufs.get()
	defer gemmBufs.put(buf)
	mr, nr := g.mr, g.nr
	kcMax := min(g.kc, k)
	ncMax := min(g.nc, (n+nr-1)/nr*nr)
	mcMax := min(g.mc, (m+mr-1)/mr*mr)
	buf.b = grow(buf.b, kcMax*ncMax)
	buf.a = grow(buf.a, kcMax*mcMax)
	buf.tile = grow(buf.tile, mr*nr)
	full := uint64(1)<<nr - 1
	if nr >= 64 {
		full = ^uint64(0)
	}
	// B is read in place unless its row stride is a multiple of 2 KiB, which
	// would fold a kc-deep sliver onto a few L1 sets (measured: 15–20 %
	// slower at ldb = 1024 than packing).
	directB := !tB && g.kStepB != nil && ldb%512 != 0
	for jc := 0; jc < n; jc += g.nc {
		nc := min(g.nc, n-jc)
		for pc := 0; pc < k; pc += g.kc {
			kc := min(g.kc, k-pc)
			if !directB {
				g.packB(buf.b, b, ldb, tB, pc, jc, kc, nc, &buf.pad)
			}
			bet := beta
			if pc > 0 {
				bet = 1
			}
			for ic := 0; ic < m; ic += g.mc {
				mc := min(g.mc, m-ic)
				for jr := 0; jr < nc; jr += nr {
					cols := min(nr, nc-jr)
					var bp *float32
					lb := nr
					if directB {
						bp, lb = &b[pc*ldb+jc+jr], ldb
					} else {
						bp = &buf.b[jr*kc]
					}
					mask := full
					if cols < nr {
						mask = uint64(1)<<cols - 1
					}
					for ir := 0; ir < mc; ir += mr {
						rows := min(mr, mc-ir)
						i0 := ic + ir
						var ap *float32
						la, rowA := mr, false
						switch {
						case rows < mr || g.packAll || (!tA && g.kRow == nil):
							if jr == 0 {
								g.packA(buf.a[ir*kc:], a, lda, tA, i0, pc, rows, kc)
							}
							ap = &buf.a[ir*kc]
						case tA:
							ap, la = &a[pc*lda+i0], lda
						default:
							ap, la, rowA = &a[i0*lda+pc], lda, true
						}
						kern := g.kStep
						switch {
						case rowA && directB:
							kern = g.kRowB
						case rowA:
							kern = g.kRow
						case directB:
							kern = g.kStepB
						}
						co := i0*ldc + jc + jr
						if cols == nr || g.masked {
							kern(kc, ap, bp, &c[co], la, lb, ldc, alpha, bet, rows, mask)
							continue
						}
						t := buf.tile
						kern(kc, ap, bp, &t[0], la, lb, nr, 1, 0, rows, full)
						mergeTile(c[co:], ldc, t, nr, rows, cols, alpha, bet)
					}
				}
			}
		}
	}
}

// mergeTile sets C = alpha·T + beta·C over rows×cols (C not read if beta == 0).
func mergeTile(c []float32, ldc int, t []float32, ldt, rows, cols int, alpha, beta float32) {
	for i := 0; i < rows; i++ {
		cr := c[i*ldc : i*ldc+cols]
		tr := t[i*ldt : i*ldt+cols]
		if beta == 0 {
			for j, v := range tr {
				cr[j] = alpha * v
			}
			continue
		}
		for j, v := range tr {
			cr[j] = alpha*v + beta*cr[j]
		}
	}
}

// packA copies the mc×kc block of op(A) at (i0, p0) into MR-tall slivers:
// sliver s holds, for each p, the MR values op(A)[i0+s·MR+r, p0+p], zero
// padded past mc.
func (g *gemmImpl) packA(dst, a []float32, lda int, tA bool, i0, p0, mc, kc int) {
	mr := g.mr
	for s := 0; s*mr < mc; s++ {
		d := dst[s*mr*kc : (s+1)*mr*kc]
		rows := min(mr, mc-s*mr)
		r0 := i0 + s*mr
		if tA {
			// op(A)[i, p] = a[p*lda + i]: each step is a contiguous run.
			for p := 0; p < kc; p++ {
				src := a[(p0+p)*lda+r0 : (p0+p)*lda+r0+rows]
				dp := d[p*mr : p*mr+mr]
				copy(dp, src)
				clear(dp[rows:])
			}
			continue
		}
		if rows < mr {
			clear(d)
		}
		packTransposedGo(d, a[r0*lda+p0:], lda, rows, kc, mr)
	}
}

// packB copies the kc×nc panel of op(B) at (p0, j0) into NR-wide slivers:
// sliver s holds, for each p, the NR values op(B)[p0+p, j0+s·NR+j], zero
// padded past nc.
func (g *gemmImpl) packB(dst, b []float32, ldb int, tB bool, p0, j0, kc, nc int, pad *[]float32) {
	nr := g.nr
	for s := 0; s*nr < nc; s++ {
		d := dst[s*nr*kc : (s+1)*nr*kc]
		cols := min(nr, nc-s*nr)
		c0 := j0 + s*nr
		if !tB {
			for p := 0; p < kc; p++ {
				src := b[(p0+p)*ldb+c0 : (p0+p)*ldb+c0+cols]
				dp := d[p*nr : p*nr+nr]
				copy(dp, src)
				clear(dp[cols:])
			}
			continue
		}
		if cols < nr {
			clear(d)
		}
		g.packTransposed(d, b[c0*ldb+p0:], ldb, cols, kc, nr, pad)
	}
}

// packTransposedGo writes the rows×kc matrix src (leading dimension ld)
// transposed into d with a stride of w: d[p*w + r] = src[r*ld + p].
func packTransposedGo(d, src []float32, ld, rows, kc, w int) {
	for r := 0; r < rows; r++ {
		row := src[r*ld : r*ld+kc]
		dd := d[r:]
		for p, v := range row {
			dd[p*w] = v
		}
	}
}

// packTransposed writes d[p·w + r] = src[r·ld + p] for r < rows, p < kc,
// 16×16 blocks at a time with g.pack16 where there is one. A last group of
// fewer than 16 rows is first copied into pad (zero rows below it) when the
// 16 output columns fit in w.
func (g *gemmImpl) packTransposed(d, src []float32, ld, rows, kc, w int, pad *[]float32) {
	if g.pack16 == nil || kc < 16 {
		packTransposedGo(d, src, ld, rows, kc, w)
		return
	}
	blocks := kc / 16
	tail := func(d, src []float32, ld int) {
		if blocks*16 < kc {
			packTransposedGo(d[blocks*16*w:], src[blocks*16:], ld, 16, kc-blocks*16, w)
		}
	}
	r := 0
	for ; r+16 <= rows; r += 16 {
		// The whole region the assembly touches, bounds-checked once.
		_ = src[(r+15)*ld+blocks*16-1]
		_ = d[(blocks*16-1)*w+r+15]
		g.pack16(&d[r], &src[r*ld], ld, w, blocks)
		tail(d[r:], src[r*ld:], ld)
	}
	if r == rows {
		return
	}
	if r+16 > w {
		packTransposedGo(d[r:], src[r*ld:], ld, rows-r, kc, w)
		return
	}
	p := grow(*pad, 16*kc)
	*pad = p
	for i := 0; i < 16; i++ {
		if r+i < rows {
			copy(p[i*kc:i*kc+kc], src[(r+i)*ld:(r+i)*ld+kc])
		} else {
			clear(p[i*kc : i*kc+kc])
		}
	}
	_ = d[(blocks*16-1)*w+r+15]
	g.pack16(&d[r], &p[0], kc, w, blocks)
	tail(d[r:], p, kc)
}
