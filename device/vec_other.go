//go:build !amd64 || purego

package device

// Without assembly no Fast backend has vec set; these are never called.

func axpyAVX512(alpha float32, x, y *float32, n int)                            { panic(errNoAsm) }
func scaleAVX512(alpha float32, x *float32, n int)                              { panic(errNoAsm) }
func dotAVX512(x, y *float32, n int) float64                                    { panic(errNoAsm) }
func sumSquaresAVX512(x *float32, n int) float64                                { panic(errNoAsm) }
func weightedSumAVX512(dst *float32, srcs *[]float32, w *float32, nsrc, n int)  { panic(errNoAsm) }
func biasRowsAVX512(x, bias *float32, rows, cols int, relu bool)                { panic(errNoAsm) }
func reluAVX512(y, x *float32, n int)                                           { panic(errNoAsm) }
func reluBackwardAVX512(dx, dy, y *float32, n int)                              { panic(errNoAsm) }
func sumRowsAVX512(dst, x *float32, rows, cols int)                             { panic(errNoAsm) }
func sgdAVX512(w, grad, buf *float32, n int, lr, mu, wd float32, nesterov bool) { panic(errNoAsm) }
func adamAVX512(w, grad, m, v *float32, n int, p *adamParams)                   { panic(errNoAsm) }

const errNoAsm = "device: assembly kernel called in a build without assembly"

func softmaxRowAVX512(grad, z *float32, cols int, scale float32) (mx, sum float32, arg int) {
	panic(errNoAsm)
}

func im2colPixelAVX512(row, img *float32, origin int, offs *int32, mask uint32, kk, c int) {
	panic(errNoAsm)
}

func col2imPixelAVX512(dx, row *float32, origin int, offs *int32, mask uint32, kk, c int) {
	panic(errNoAsm)
}

func maxPoolRowAVX512(y *float32, arg *int32, x *float32, base, step, npix int, offs *int32, kk, c int) {
	panic(errNoAsm)
}

func nonFiniteAVX512(x *float32, n int) bool { panic(errNoAsm) }

func divFiniteAVX512(x *float32, d float64, n int) bool { panic(errNoAsm) }

func axpyFiniteAVX512(alpha float32, x, y *float32, n int) uint8 { panic(errNoAsm) }

func axpyToFiniteAVX512(alpha float32, x, y, out *float32, n int) bool { panic(errNoAsm) }

func geluAVX512(y, d, x *float32, n int) { panic(errNoAsm) }

func layerNormAVX512(y, mean, rstd, x, w, b *float32, rows, cols int, eps float32) {
	panic(errNoAsm)
}

func layerNormBackwardAVX512(dx, dw, db, dy, x, mean, rstd, w *float32, rows, cols int) {
	panic(errNoAsm)
}

func minMaxAVX512(a, b *float32, n int) { panic(errNoAsm) }
