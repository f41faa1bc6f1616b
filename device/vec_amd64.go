//go:build amd64 && !purego

package device

// AVX-512 elementwise kernels in vec_amd64.s. They index through raw
// pointers: the Fast methods check every length before calling them.

//go:noescape
func axpyAVX512(alpha float32, x, y *float32, n int)

//go:noescape
func scaleAVX512(alpha float32, x *float32, n int)

//go:noescape
func dotAVX512(x, y *float32, n int) float64

//go:noescape
func sumSquaresAVX512(x *float32, n int) float64

//go:noescape
func weightedSumAVX512(dst *float32, srcs *[]float32, w *float32, nsrc, n int)

//go:noescape
func biasRowsAVX512(x, bias *float32, rows, cols int, relu bool)

//go:noescape
func reluAVX512(y, x *float32, n int)

//go:noescape
func reluBackwardAVX512(dx, dy, y *float32, n int)

//go:noescape
func sumRowsAVX512(dst, x *float32, rows, cols int)

//go:noescape
func sgdAVX512(w, grad, buf *float32, n int, lr, mu, wd float32, nesterov bool)

//go:noescape
func adamAVX512(w, grad, m, v *float32, n int, p *adamParams)

//go:noescape
func softmaxRowAVX512(grad, z *float32, cols int, scale float32) (mx, sum float32, arg int)

//go:noescape
func im2colPixelAVX512(row, img *float32, origin int, offs *int32, mask uint32, kk, c int)

//go:noescape
func col2imPixelAVX512(dx, row *float32, origin int, offs *int32, mask uint32, kk, c int)

//go:noescape
func maxPoolRowAVX512(y *float32, arg *int32, x *float32, base, step, npix int, offs *int32, kk, c int)

//go:noescape
func nonFiniteAVX512(x *float32, n int) bool

// divFiniteAVX512 sets x[i] = float32(float64(x[i]) / d) for n values (a
// multiple of 16) and reports whether some result is NaN or ±Inf.
//
//go:noescape
func divFiniteAVX512(x *float32, d float64, n int) (bad bool)

// axpyFiniteAVX512 sets y += alpha·x for n values; bit 0 of bad is set
// when some y was NaN or ±Inf before, bit 1 when some y is after.
//
//go:noescape
func axpyFiniteAVX512(alpha float32, x, y *float32, n int) (bad uint8)

// axpyToFiniteAVX512 sets out = alpha·x + y for n values (axpyFiniteAVX512's
// FMA) and reports whether some out is NaN or ±Inf.
//
//go:noescape
func axpyToFiniteAVX512(alpha float32, x, y, out *float32, n int) (bad bool)

// geluAVX512 sets y = GELU(x) and, unless d is nil, d = GELU'(x), for n
// values.
//
//go:noescape
func geluAVX512(y, d, x *float32, n int)

// layerNormAVX512 is CPU.LayerNorm for rows ≥ 1 and cols a positive
// multiple of 8.
//
//go:noescape
func layerNormAVX512(y, mean, rstd, x, w, b *float32, rows, cols int, eps float32)

// layerNormBackwardAVX512 is CPU.LayerNormBackward for rows ≥ 1 and cols a
// positive multiple of 8.
//
//go:noescape
func layerNormBackwardAVX512(dx, dw, db, dy, x, mean, rstd, w *float32, rows, cols int)

//go:noescape
func minMaxAVX512(a, b *float32, n int)
