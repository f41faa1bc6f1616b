package device

import (
	"math"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
)

// CPU is the pure-Go CPU backend. Its GEMM runs on gonum's blas32
// implementation; every other kernel is a plain loop.
type CPU struct {
	impl gonum.Implementation
}

var _ Backend = (*CPU)(nil)

// NewCPU returns a CPU backend.
func NewCPU() *CPU { return &CPU{} }

// Name implements Backend.
func (*CPU) Name() string { return "cpu/gonum" }

func trans(t bool) blas.Transpose {
	if t {
		return blas.Trans
	}
	return blas.NoTrans
}

// Gemm implements Backend.
func (c *CPU) Gemm(tA, tB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, cc []float32, ldc int) {
	if m == 0 || n == 0 {
		return
	}
	if k == 0 || alpha == 0 {
		scaleMatrix(beta, m, n, cc, ldc)
		return
	}
	if beta == 0 {
		// gonum multiplies C by beta, which keeps NaNs; the contract is that
		// C is not read when beta == 0.
		for i := 0; i < m; i++ {
			clear(cc[i*ldc : i*ldc+n])
		}
	}
	c.impl.Sgemm(trans(tA), trans(tB), m, n, k, alpha, a, lda, b, ldb, beta, cc, ldc)
}

// GemmStrided implements Backend, one GEMM after another.
func (c *CPU) GemmStrided(tA, tB bool, m, n, k int, alpha float32, a []float32, lda, sa int, b []float32, ldb, sb int, beta float32, cc []float32, ldc, sc int, count int) {
	for i := 0; i < count; i++ {
		c.Gemm(tA, tB, m, n, k, alpha, a[i*sa:], lda, b[i*sb:], ldb, beta, cc[i*sc:], ldc)
	}
}

func scaleMatrix(beta float32, m, n int, c []float32, ldc int) {
	for i := 0; i < m; i++ {
		row := c[i*ldc : i*ldc+n]
		if beta == 0 {
			clear(row)
			continue
		}
		for j := range row {
			row[j] *= beta
		}
	}
}

// Axpy implements Backend.
func (*CPU) Axpy(alpha float32, x, y []float32) {
	y = y[:len(x)]
	for i, v := range x {
		y[i] += alpha * v
	}
}

// Scale implements Backend.
func (*CPU) Scale(alpha float32, x []float32) {
	for i := range x {
		x[i] *= alpha
	}
}

// Dot implements Backend.
func (*CPU) Dot(x, y []float32) float64 {
	y = y[:len(x)]
	var s float64
	for i, v := range x {
		s += float64(v) * float64(y[i])
	}
	return s
}

// SumSquares implements Backend.
func (*CPU) SumSquares(x []float32) float64 {
	var s float64
	for _, v := range x {
		s += float64(v) * float64(v)
	}
	return s
}

// WeightedSum implements Backend.
func (*CPU) WeightedSum(dst []float32, srcs [][]float32, w []float32) {
	if len(srcs) != len(w) {
		panic("device: WeightedSum: len(srcs) != len(w)")
	}
	if len(srcs) == 0 {
		clear(dst)
		return
	}
	s0, w0 := srcs[0][:len(dst)], w[0]
	for i := range dst {
		dst[i] = w0 * s0[i]
	}
	for j := 1; j < len(srcs); j++ {
		s, wj := srcs[j][:len(dst)], w[j]
		for i := range dst {
			dst[i] += wj * s[i]
		}
	}
}

// AddRowVector implements Backend.
func (*CPU) AddRowVector(x, v []float32, rows, cols int) {
	v = v[:cols]
	for r := 0; r < rows; r++ {
		row := x[r*cols : r*cols+cols]
		for j, b := range v {
			row[j] += b
		}
	}
}

// SumRows implements Backend.
func (*CPU) SumRows(dst, x []float32, rows, cols int) {
	dst = dst[:cols]
	for r := 0; r < rows; r++ {
		row := x[r*cols : r*cols+cols]
		for j, v := range row {
			dst[j] += v
		}
	}
}

// BiasReLU implements Backend.
func (*CPU) BiasReLU(x, bias []float32, rows, cols int) {
	bias = bias[:cols]
	for r := 0; r < rows; r++ {
		row := x[r*cols : r*cols+cols]
		for j, b := range bias {
			v := row[j] + b
			if v < 0 {
				v = 0
			}
			row[j] = v
		}
	}
}

// ReLU implements Backend.
func (*CPU) ReLU(y, x []float32) {
	y = y[:len(x)]
	for i, v := range x {
		if v < 0 {
			v = 0
		}
		y[i] = v
	}
}

// ReLUBackward implements Backend.
func (*CPU) ReLUBackward(dx, dy, y []float32) {
	dx = dx[:len(dy)]
	y = y[:len(dy)]
	for i, g := range dy {
		if y[i] <= 0 {
			g = 0
		}
		dx[i] = g
	}
}

// SoftmaxXent implements Backend.
func (*CPU) SoftmaxXent(grad, logits []float32, labels []int32, rows, cols int) (float64, int) {
	if rows == 0 {
		return 0, 0
	}
	inv := 1 / float32(rows)
	var loss float64
	correct := 0
	for r := 0; r < rows; r++ {
		z := logits[r*cols : r*cols+cols]
		g := grad[r*cols : r*cols+cols]
		y := int(labels[r])
		mx, arg := z[0], 0
		for j, v := range z {
			if v > mx {
				mx, arg = v, j
			}
		}
		if arg == y {
			correct++
		}
		var sum float64
		for _, v := range z {
			sum += math.Exp(float64(v - mx))
		}
		loss += math.Log(sum) - float64(z[y]-mx)
		is := 1 / sum
		for j, v := range z {
			g[j] = float32(math.Exp(float64(v-mx))*is) * inv
		}
		g[y] -= inv
	}
	return loss / float64(rows), correct
}

// SoftmaxRows implements Backend.
func (*CPU) SoftmaxRows(y, x []float32, rows, cols int, causal bool) {
	checkRows("SoftmaxRows x", x, rows, cols)
	checkRows("SoftmaxRows y", y, rows, cols)
	if cols == 0 {
		return
	}
	for r := 0; r < rows; r++ {
		z, out := x[r*cols:r*cols+cols], y[r*cols:r*cols+cols]
		valid := cols
		if causal {
			valid = r%cols + 1
		}
		mx := z[0]
		for _, v := range z[1:valid] {
			mx = max(mx, v)
		}
		var sum float64
		for _, v := range z[:valid] {
			sum += math.Exp(float64(v - mx))
		}
		is := 1 / sum
		for j, v := range z[:valid] {
			out[j] = float32(math.Exp(float64(v-mx)) * is)
		}
		clear(out[valid:])
	}
}

// SoftmaxRowsBackward implements Backend.
func (*CPU) SoftmaxRowsBackward(dx, dy, y []float32, rows, cols int) {
	checkRows("SoftmaxRowsBackward dy", dy, rows, cols)
	checkRows("SoftmaxRowsBackward y", y, rows, cols)
	checkRows("SoftmaxRowsBackward dx", dx, rows, cols)
	for r := 0; r < rows; r++ {
		g, p, d := dy[r*cols:r*cols+cols], y[r*cols:r*cols+cols], dx[r*cols:r*cols+cols]
		var s float64
		for j, v := range g {
			s += float64(v) * float64(p[j])
		}
		for j, v := range g {
			d[j] = float32(float64(p[j]) * (float64(v) - s))
		}
	}
}

// LayerNorm implements Backend.
func (*CPU) LayerNorm(y, mean, rstd, x, w, b []float32, rows, cols int, eps float32) {
	checkRows("LayerNorm x", x, rows, cols)
	checkRows("LayerNorm y", y, rows, cols)
	mean, rstd, w, b = mean[:rows], rstd[:rows], w[:cols], b[:cols]
	for r := 0; r < rows; r++ {
		z, out := x[r*cols:r*cols+cols], y[r*cols:r*cols+cols]
		var s float64
		for _, v := range z {
			s += float64(v)
		}
		mu := s / float64(cols)
		var ss float64
		for _, v := range z {
			d := float64(v) - mu
			ss += d * d
		}
		is := 1 / math.Sqrt(ss/float64(cols)+float64(eps))
		mean[r], rstd[r] = float32(mu), float32(is)
		for j, v := range z {
			out[j] = float32((float64(v)-mu)*is)*w[j] + b[j]
		}
	}
}

// LayerNormBackward implements Backend.
func (*CPU) LayerNormBackward(dx, dw, db, dy, x, mean, rstd, w []float32, rows, cols int) {
	checkRows("LayerNormBackward x", x, rows, cols)
	checkRows("LayerNormBackward dy", dy, rows, cols)
	checkRows("LayerNormBackward dx", dx, rows, cols)
	mean, rstd, w, dw, db = mean[:rows], rstd[:rows], w[:cols], dw[:cols], db[:cols]
	for r := 0; r < rows; r++ {
		z, g, d := x[r*cols:r*cols+cols], dy[r*cols:r*cols+cols], dx[r*cols:r*cols+cols]
		mu, is := float64(mean[r]), float64(rstd[r])
		var sg, sgx float64 // Σ dy·w and Σ dy·w·x̂
		for j, v := range z {
			xh := (float64(v) - mu) * is
			gj := float64(g[j])
			dw[j] += float32(gj * xh)
			db[j] += g[j]
			gw := gj * float64(w[j])
			sg += gw
			sgx += gw * xh
		}
		sg /= float64(cols)
		sgx /= float64(cols)
		for j, v := range z {
			xh := (float64(v) - mu) * is
			d[j] = float32(is * (float64(g[j])*float64(w[j]) - sg - xh*sgx))
		}
	}
}

// geluC is √(2/π), geluA the cubic coefficient of GELU's tanh approximation.
const geluC, geluA = 0.7978845608028654, 0.044715

// GELU implements Backend.
func (*CPU) GELU(y, d, x []float32) {
	y = y[:len(x)]
	if d != nil {
		d = d[:len(x)]
	}
	for i, v := range x {
		z := float64(v)
		t := math.Tanh(geluC * (z + geluA*z*z*z))
		if d != nil {
			d[i] = float32(0.5*(1+t) + 0.5*z*(1-t*t)*geluC*(1+3*geluA*z*z))
		}
		y[i] = float32(0.5 * z * (1 + t))
	}
}

// Mul implements Backend.
func (*CPU) Mul(dst, x, y []float32) {
	dst, y = dst[:len(x)], y[:len(x)]
	for i, v := range x {
		dst[i] = v * y[i]
	}
}

// Im2Col implements Backend.
func (*CPU) Im2Col(col, x []float32, g ConvGeom) {
	oh, ow := g.OutH(), g.OutW()
	cc := g.ColCols()
	kk := g.KH * g.KW
	for n := 0; n < g.N; n++ {
		img := x[n*g.H*g.W*g.C : (n+1)*g.H*g.W*g.C]
		for oy := 0; oy < oh; oy++ {
			for ox := 0; ox < ow; ox++ {
				row := col[((n*oh+oy)*ow+ox)*cc : ((n*oh+oy)*ow+ox+1)*cc]
				for ky := 0; ky < g.KH; ky++ {
					iy := oy*g.StrideH - g.PadH + ky
					for kx := 0; kx < g.KW; kx++ {
						ix := ox*g.StrideW - g.PadW + kx
						k := ky*g.KW + kx
						if iy < 0 || iy >= g.H || ix < 0 || ix >= g.W {
							for c := 0; c < g.C; c++ {
								row[c*kk+k] = 0
							}
							continue
						}
						px := img[(iy*g.W+ix)*g.C : (iy*g.W+ix+1)*g.C]
						for c, v := range px {
							row[c*kk+k] = v
						}
					}
				}
			}
		}
	}
}

// Col2Im implements Backend.
func (*CPU) Col2Im(dx, col []float32, g ConvGeom) {
	oh, ow := g.OutH(), g.OutW()
	cc := g.ColCols()
	kk := g.KH * g.KW
	for n := 0; n < g.N; n++ {
		img := dx[n*g.H*g.W*g.C : (n+1)*g.H*g.W*g.C]
		for oy := 0; oy < oh; oy++ {
			for ox := 0; ox < ow; ox++ {
				row := col[((n*oh+oy)*ow+ox)*cc : ((n*oh+oy)*ow+ox+1)*cc]
				for ky := 0; ky < g.KH; ky++ {
					iy := oy*g.StrideH - g.PadH + ky
					if iy < 0 || iy >= g.H {
						continue
					}
					for kx := 0; kx < g.KW; kx++ {
						ix := ox*g.StrideW - g.PadW + kx
						if ix < 0 || ix >= g.W {
							continue
						}
						k := ky*g.KW + kx
						px := img[(iy*g.W+ix)*g.C : (iy*g.W+ix+1)*g.C]
						for c := range px {
							px[c] += row[c*kk+k]
						}
					}
				}
			}
		}
	}
}

// MaxPool implements Backend.
func (*CPU) MaxPool(y []float32, arg []int32, x []float32, g PoolGeom) {
	oh, ow := g.OutH(), g.OutW()
	for n := 0; n < g.N; n++ {
		for oy := 0; oy < oh; oy++ {
			for ox := 0; ox < ow; ox++ {
				o := ((n*oh+oy)*ow + ox) * g.C
				for c := 0; c < g.C; c++ {
					best := float32(math.Inf(-1))
					bi := -1
					for ky := 0; ky < g.K; ky++ {
						iy := oy*g.Stride + ky
						for kx := 0; kx < g.K; kx++ {
							ix := ox*g.Stride + kx
							i := ((n*g.H+iy)*g.W+ix)*g.C + c
							if v := x[i]; v > best || bi < 0 {
								best, bi = v, i
							}
						}
					}
					y[o+c] = best
					arg[o+c] = int32(bi)
				}
			}
		}
	}
}

// MaxPoolBackward implements Backend.
func (*CPU) MaxPoolBackward(dx, dy []float32, arg []int32) {
	clear(dx)
	arg = arg[:len(dy)]
	for i, g := range dy {
		dx[arg[i]] += g
	}
}

// SGD implements Backend.
func (*CPU) SGD(w, g, buf []float32, lr, mu, wd float32, nesterov bool) {
	g = g[:len(w)]
	if mu == 0 {
		for i := range w {
			d := g[i] + wd*w[i]
			w[i] -= lr * d
		}
		return
	}
	buf = buf[:len(w)]
	for i := range w {
		d := g[i] + wd*w[i]
		b := mu*buf[i] + d
		buf[i] = b
		if nesterov {
			d += mu * b
		} else {
			d = b
		}
		w[i] -= lr * d
	}
}

// Adam implements Backend.
func (*CPU) Adam(w, g, m, v []float32, t int, lr, beta1, beta2, eps, wd float32, decoupled bool) {
	g, m, v = g[:len(w)], m[:len(w)], v[:len(w)]
	bc1 := 1 - math.Pow(float64(beta1), float64(t))
	bc2 := 1 - math.Pow(float64(beta2), float64(t))
	step := lr / float32(bc1)
	sq := float32(math.Sqrt(bc2))
	for i := range w {
		gi := g[i]
		if decoupled {
			w[i] -= lr * wd * w[i]
		} else {
			gi += wd * w[i]
		}
		mi := beta1*m[i] + (1-beta1)*gi
		vi := beta2*v[i] + (1-beta2)*gi*gi
		m[i], v[i] = mi, vi
		w[i] -= step * mi / (float32(math.Sqrt(float64(vi)))/sq + eps)
	}
}

// RandNormal implements Backend.
func (*CPU) RandNormal(x []float32, mean, std float32, seed uint64) {
	for i := range x {
		x[i] = mean + std*float32(NormalAt(seed, uint64(i)))
	}
}

// RandUniform implements Backend.
func (*CPU) RandUniform(x []float32, lo, hi float32, seed uint64) {
	span := float64(hi - lo)
	for i := range x {
		x[i] = lo + float32(UniformAt(seed, uint64(i))*span)
	}
}
