// Package devicetest is a conformance suite for device.Backend
// implementations: every kernel is compared against a naive float64
// reference. A new backend passes when devicetest.Run(t, be) does.
package devicetest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/starling-ml/starling/device"
)

// Run checks every kernel of be against the references in this package.
func Run(t *testing.T, be device.Backend) {
	t.Run("Gemm", func(t *testing.T) { testGemm(t, be) })
	t.Run("GemmStrided", func(t *testing.T) { testGemmStrided(t, be) })
	t.Run("Vector", func(t *testing.T) { testVector(t, be) })
	t.Run("Rows", func(t *testing.T) { testRows(t, be) })
	t.Run("SoftmaxXent", func(t *testing.T) { testSoftmax(t, be) })
	t.Run("SoftmaxRows", func(t *testing.T) { testSoftmaxRows(t, be) })
	t.Run("LayerNorm", func(t *testing.T) { testLayerNorm(t, be) })
	t.Run("GELU", func(t *testing.T) { testGELU(t, be) })
	t.Run("Conv", func(t *testing.T) { testConv(t, be) })
	t.Run("Pool", func(t *testing.T) { testPool(t, be) })
	t.Run("Optim", func(t *testing.T) { testOptim(t, be) })
	t.Run("Rand", func(t *testing.T) { testRand(t, be) })
}

// RandSlice returns n values in [-1, 1) from a seeded generator.
func RandSlice(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.Float64()*2 - 1)
	}
	return x
}

// NaiveGemm is the float64 reference for Backend.Gemm: every product and
// sum in float64, one rounding to float32 at the end. (Loops run i, p, j
// over a float64 row so that large shapes stay cheap under -race.)
func NaiveGemm(tA, tB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	row := make([]float64, n)
	for i := 0; i < m; i++ {
		clear(row)
		for p := 0; p < k; p++ {
			var av float64
			if tA {
				av = float64(a[p*lda+i])
			} else {
				av = float64(a[i*lda+p])
			}
			if tB {
				for j := range row {
					row[j] += av * float64(b[j*ldb+p])
				}
			} else {
				for j, bv := range b[p*ldb : p*ldb+n] {
					row[j] += av * float64(bv)
				}
			}
		}
		for j, s := range row {
			v := float64(alpha) * s
			if beta != 0 {
				v += float64(beta) * float64(c[i*ldc+j])
			}
			c[i*ldc+j] = float32(v)
		}
	}
}

// CheckGemm runs one GEMM on be and on the reference and reports the
// worst error relative to the magnitude of the terms (k·max|a|·max|b|),
// which bounds float32 accumulation error independent of summation order.
func CheckGemm(be device.Backend, r *rand.Rand, tA, tB bool, m, n, k int, alpha, beta float32) error {
	lda, ldb, ldc := k, n, n
	ar, br := m, k
	if tA {
		lda, ar = m, k
	}
	if tB {
		ldb, br = k, n
	}
	// Padding in leading dimensions exercises strides.
	lda += r.IntN(3)
	ldb += r.IntN(3)
	ldc += r.IntN(3)
	a := RandSlice(r, max(ar*lda, 1))
	b := RandSlice(r, max(br*ldb, 1))
	c := RandSlice(r, max(m*ldc, 1))
	if beta == 0 {
		for i := range c {
			c[i] = float32(math.NaN()) // must not be read
		}
	}
	want := append([]float32(nil), c...)
	NaiveGemm(tA, tB, m, n, k, alpha, a, lda, b, ldb, beta, want, ldc)
	got := append([]float32(nil), c...)
	be.Gemm(tA, tB, m, n, k, alpha, a, lda, b, ldb, beta, got, ldc)
	scale := float64(k)*math.Abs(float64(alpha)) + math.Abs(float64(beta)) + 1
	tol := 4e-7 * scale * 4
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			g, w := got[i*ldc+j], want[i*ldc+j]
			if d := math.Abs(float64(g - w)); !(d <= tol) {
				return fmt.Errorf("gemm tA=%v tB=%v m=%d n=%d k=%d: C[%d,%d] = %v, want %v (tol %.3g)", tA, tB, m, n, k, i, j, g, w, tol)
			}
		}
		// Padding columns of C must be untouched.
		for j := n; j < ldc && i*ldc+j < len(c); j++ {
			if got[i*ldc+j] != c[i*ldc+j] && !(math.IsNaN(float64(got[i*ldc+j])) && math.IsNaN(float64(c[i*ldc+j]))) {
				return fmt.Errorf("gemm wrote outside C at [%d,%d]", i, j)
			}
		}
	}
	return nil
}

func testGemm(t *testing.T, be device.Backend) {
	r := rand.New(rand.NewPCG(1, 2))
	sizes := []int{1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 48, 64, 65, 100, 129}
	for iter := 0; iter < 300; iter++ {
		m := sizes[r.IntN(len(sizes))]
		n := sizes[r.IntN(len(sizes))]
		k := sizes[r.IntN(len(sizes))]
		tA, tB := r.IntN(2) == 1, r.IntN(2) == 1
		alpha := []float32{1, -0.5, 2}[r.IntN(3)]
		beta := []float32{0, 1, 0.5}[r.IntN(3)]
		if err := CheckGemm(be, r, tA, tB, m, n, k, alpha, beta); err != nil {
			t.Fatal(err)
		}
	}
	// Shapes of the models: MLP 784-128-10 and FedAvg CNN at small batch.
	for _, s := range [][3]int{{32, 128, 784}, {32, 10, 128}, {128, 784, 32}, {196, 64, 800}, {784, 32, 25}, {300, 257, 513}} {
		for _, tt := range [][2]bool{{false, false}, {false, true}, {true, false}, {true, true}} {
			if err := CheckGemm(be, r, tt[0], tt[1], s[0], s[1], s[2], 1, 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Degenerate shapes: k == 0 scales C by beta.
	c := []float32{1, 2, 3, 4}
	be.Gemm(false, false, 2, 2, 0, 1, nil, 1, nil, 2, 0.5, c, 2)
	if c[0] != 0.5 || c[3] != 2 {
		t.Fatalf("k=0 gemm: got %v", c)
	}
}

// testGemmStrided checks batches of GEMMs, from ones small enough to run
// one by one to ones a backend splits between goroutines, laid out as
// attention's heads are (interleaved, with gaps), against NaiveGemm; what
// lies between the C blocks must stay untouched.
func testGemmStrided(t *testing.T, be device.Backend) {
	r := rand.New(rand.NewPCG(21, 22))
	for _, s := range []struct{ m, n, k, count int }{{3, 5, 7, 1}, {4, 4, 4, 6}, {32, 32, 16, 9}, {64, 48, 32, 12}, {128, 32, 128, 3}} {
		for _, tt := range [][2]bool{{false, false}, {false, true}, {true, false}, {true, true}} {
			tA, tB := tt[0], tt[1]
			ar, ac, br, bc := s.m, s.k, s.k, s.n
			if tA {
				ar, ac = ac, ar
			}
			if tB {
				br, bc = bc, br
			}
			// Each operand's rows are interleaved with the other GEMMs': GEMM i
			// starts at column i·ac of a row of count·ac (+1) values.
			lda, ldb, ldc := s.count*ac+1, s.count*bc+1, s.count*s.n+2
			a, b := RandSlice(r, ar*lda), RandSlice(r, br*ldb)
			c := RandSlice(r, s.m*ldc)
			want := append([]float32(nil), c...)
			for i := 0; i < s.count; i++ {
				NaiveGemm(tA, tB, s.m, s.n, s.k, 0.5, a[i*ac:], lda, b[i*bc:], ldb, 1, want[i*s.n:], ldc)
			}
			be.GemmStrided(tA, tB, s.m, s.n, s.k, 0.5, a, lda, ac, b, ldb, bc, 1, c, ldc, s.n, s.count)
			tol := 4e-7 * float64(s.k+2) * 4
			for i := range c {
				if d := math.Abs(float64(c[i] - want[i])); !(d <= tol) {
					t.Fatalf("GemmStrided %+v tA=%v tB=%v: c[%d] = %v, want %v", s, tA, tB, i, c[i], want[i])
				}
			}
		}
	}
}

func near(a, b, tol float64) bool { return math.Abs(a-b) <= tol*(1+math.Abs(b)) }

func testVector(t *testing.T, be device.Backend) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{0, 1, 7, 16, 33, 1000, 4097} {
		x, y := RandSlice(r, n), RandSlice(r, n)
		var dot, ss float64
		for i := range x {
			dot += float64(x[i]) * float64(y[i])
			ss += float64(x[i]) * float64(x[i])
		}
		if got := be.Dot(x, y); !near(got, dot, 1e-5) {
			t.Fatalf("Dot n=%d: %v want %v", n, got, dot)
		}
		if got := be.SumSquares(x); !near(got, ss, 1e-5) {
			t.Fatalf("SumSquares n=%d: %v want %v", n, got, ss)
		}
		y2 := append([]float32(nil), y...)
		be.Axpy(0.5, x, y2)
		for i := range y2 {
			if !near(float64(y2[i]), float64(y[i])+0.5*float64(x[i]), 1e-6) {
				t.Fatalf("Axpy n=%d i=%d", n, i)
			}
		}
		x2 := append([]float32(nil), x...)
		be.Scale(-3, x2)
		for i := range x2 {
			if !near(float64(x2[i]), -3*float64(x[i]), 1e-6) {
				t.Fatalf("Scale n=%d i=%d", n, i)
			}
		}
		z := RandSlice(r, n)
		dst := make([]float32, n)
		be.WeightedSum(dst, [][]float32{x, y, z}, []float32{0.2, 0.3, 0.5})
		for i := range dst {
			w := 0.2*float64(x[i]) + 0.3*float64(y[i]) + 0.5*float64(z[i])
			if !near(float64(dst[i]), w, 1e-5) {
				t.Fatalf("WeightedSum n=%d i=%d: %v want %v", n, i, dst[i], w)
			}
		}
		relu := make([]float32, n)
		be.ReLU(relu, x)
		dy := RandSlice(r, n)
		dx := make([]float32, n)
		be.ReLUBackward(dx, dy, relu)
		for i := range x {
			if relu[i] != max(x[i], 0) {
				t.Fatalf("ReLU n=%d i=%d", n, i)
			}
			want := dy[i]
			if x[i] <= 0 {
				want = 0
			}
			if dx[i] != want {
				t.Fatalf("ReLUBackward n=%d i=%d", n, i)
			}
		}
	}
}

func testRows(t *testing.T, be device.Backend) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, s := range [][2]int{{1, 1}, {3, 5}, {17, 33}, {64, 128}} {
		rows, cols := s[0], s[1]
		x, v := RandSlice(r, rows*cols), RandSlice(r, cols)
		a := append([]float32(nil), x...)
		be.AddRowVector(a, v, rows, cols)
		br := append([]float32(nil), x...)
		be.BiasReLU(br, v, rows, cols)
		sum := RandSlice(r, cols)
		sum0 := append([]float32(nil), sum...)
		be.SumRows(sum, x, rows, cols)
		for j := 0; j < cols; j++ {
			s := float64(sum0[j])
			for i := 0; i < rows; i++ {
				k := i*cols + j
				if a[k] != x[k]+v[j] {
					t.Fatalf("AddRowVector [%d,%d]", i, j)
				}
				if br[k] != max(x[k]+v[j], 0) {
					t.Fatalf("BiasReLU [%d,%d]", i, j)
				}
				s += float64(x[k])
			}
			if !near(float64(sum[j]), s, 1e-5) {
				t.Fatalf("SumRows col %d: %v want %v", j, sum[j], s)
			}
		}
	}
}

func testSoftmax(t *testing.T, be device.Backend) {
	r := rand.New(rand.NewPCG(7, 8))
	rows, cols := 13, 10
	z := RandSlice(r, rows*cols)
	for i := range z {
		z[i] *= 20 // large logits exercise the max shift
	}
	labels := make([]int32, rows)
	for i := range labels {
		labels[i] = int32(r.IntN(cols))
	}
	grad := make([]float32, rows*cols)
	loss, correct := be.SoftmaxXent(grad, z, labels, rows, cols)
	var wantLoss float64
	wantCorrect := 0
	for i := 0; i < rows; i++ {
		row := z[i*cols : (i+1)*cols]
		mx, arg := math.Inf(-1), 0
		for j, v := range row {
			if float64(v) > mx {
				mx, arg = float64(v), j
			}
		}
		if arg == int(labels[i]) {
			wantCorrect++
		}
		var s float64
		for _, v := range row {
			s += math.Exp(float64(v) - mx)
		}
		wantLoss += math.Log(s) + mx - float64(row[labels[i]])
		for j, v := range row {
			p := math.Exp(float64(v)-mx) / s
			if j == int(labels[i]) {
				p--
			}
			if !near(float64(grad[i*cols+j]), p/float64(rows), 1e-5) {
				t.Fatalf("grad[%d,%d] = %v want %v", i, j, grad[i*cols+j], p/float64(rows))
			}
		}
	}
	wantLoss /= float64(rows)
	if !near(loss, wantLoss, 1e-6) || correct != wantCorrect {
		t.Fatalf("loss %v correct %d, want %v %d", loss, correct, wantLoss, wantCorrect)
	}
}

// testSoftmaxRows checks SoftmaxRows (plain and causal, into a separate
// slice and in place) and SoftmaxRowsBackward against float64 references:
// probabilities to 1e-6 absolute (a float32 exp is about 1 ulp), gradients
// to 1e-6·(1+Σ|dy|·y).
func testSoftmaxRows(t *testing.T, be device.Backend) {
	r := rand.New(rand.NewPCG(15, 16))
	for _, s := range [][2]int{{1, 1}, {3, 5}, {16, 16}, {2 * 17, 17}, {64, 33}} {
		rows, cols := s[0], s[1]
		for _, causal := range []bool{false, true} {
			if causal && rows%cols != 0 {
				continue
			}
			x := RandSlice(r, rows*cols)
			for i := range x {
				x[i] *= 10
			}
			y := RandSlice(r, rows*cols) // must be overwritten
			be.SoftmaxRows(y, x, rows, cols, causal)
			inPlace := append([]float32(nil), x...)
			be.SoftmaxRows(inPlace, inPlace, rows, cols, causal)
			want := make([]float64, rows*cols)
			for i := 0; i < rows; i++ {
				valid := cols
				if causal {
					valid = i%cols + 1
				}
				row := x[i*cols : i*cols+valid]
				mx := math.Inf(-1)
				for _, v := range row {
					mx = math.Max(mx, float64(v))
				}
				var sum float64
				for _, v := range row {
					sum += math.Exp(float64(v) - mx)
				}
				for j, v := range row {
					want[i*cols+j] = math.Exp(float64(v)-mx) / sum
				}
			}
			for i, w := range want {
				if math.Abs(float64(y[i])-w) > 1e-6 || inPlace[i] != y[i] {
					t.Fatalf("SoftmaxRows %dx%d causal=%v [%d] = %v (in place %v), want %v", rows, cols, causal, i, y[i], inPlace[i], w)
				}
			}
			dy := RandSlice(r, rows*cols)
			dx := RandSlice(r, rows*cols)
			be.SoftmaxRowsBackward(dx, dy, y, rows, cols)
			alias := append([]float32(nil), dy...)
			be.SoftmaxRowsBackward(alias, alias, y, rows, cols)
			for i := 0; i < rows; i++ {
				var s, mag float64
				for j := 0; j < cols; j++ {
					s += float64(dy[i*cols+j]) * float64(y[i*cols+j])
					mag += math.Abs(float64(dy[i*cols+j]) * float64(y[i*cols+j]))
				}
				for j := 0; j < cols; j++ {
					k := i*cols + j
					w := float64(y[k]) * (float64(dy[k]) - s)
					if math.Abs(float64(dx[k])-w) > 1e-6*(1+mag) || math.Abs(float64(alias[k])-w) > 1e-6*(1+mag) {
						t.Fatalf("SoftmaxRowsBackward %dx%d [%d] = %v (aliased %v), want %v", rows, cols, k, dx[k], alias[k], w)
					}
				}
			}
		}
	}
}

// testLayerNorm checks LayerNorm and LayerNormBackward against a float64
// reference to 1e-5 relative, including that dw and db accumulate.
func testLayerNorm(t *testing.T, be device.Backend) {
	r := rand.New(rand.NewPCG(17, 18))
	const eps = 1e-5
	for _, s := range [][2]int{{1, 1}, {1, 7}, {5, 16}, {33, 100}, {64, 128}, {1031, 128}} { // the last large enough to split
		rows, cols := s[0], s[1]
		x := RandSlice(r, rows*cols)
		for i := range x {
			x[i] = 3*x[i] + 1 // a mean and scale far from (0, 1)
		}
		w, b := RandSlice(r, cols), RandSlice(r, cols)
		y := make([]float32, rows*cols)
		mean, rstd := make([]float32, rows), make([]float32, rows)
		be.LayerNorm(y, mean, rstd, x, w, b, rows, cols, eps)
		dy := RandSlice(r, rows*cols)
		dx := make([]float32, rows*cols)
		dw, db := RandSlice(r, cols), RandSlice(r, cols)
		dw0, db0 := append([]float32(nil), dw...), append([]float32(nil), db...)
		be.LayerNormBackward(dx, dw, db, dy, x, mean, rstd, w, rows, cols)
		wdw, wdb := make([]float64, cols), make([]float64, cols)
		for j := range wdw {
			wdw[j], wdb[j] = float64(dw0[j]), float64(db0[j])
		}
		for i := 0; i < rows; i++ {
			row := x[i*cols : i*cols+cols]
			var mu, v float64
			for _, e := range row {
				mu += float64(e)
			}
			mu /= float64(cols)
			for _, e := range row {
				v += (float64(e) - mu) * (float64(e) - mu)
			}
			is := 1 / math.Sqrt(v/float64(cols)+eps)
			if !near(float64(mean[i]), mu, 1e-5) || !near(float64(rstd[i]), is, 1e-5) {
				t.Fatalf("LayerNorm %dx%d row %d: mean %v rstd %v, want %v %v", rows, cols, i, mean[i], rstd[i], mu, is)
			}
			var sg, sgx float64
			for j, e := range row {
				xh := (float64(e) - mu) * is
				if want := xh*float64(w[j]) + float64(b[j]); !near(float64(y[i*cols+j]), want, 1e-5) {
					t.Fatalf("LayerNorm %dx%d [%d,%d] = %v, want %v", rows, cols, i, j, y[i*cols+j], want)
				}
				g := float64(dy[i*cols+j])
				wdw[j] += g * xh
				wdb[j] += g
				sg += g * float64(w[j])
				sgx += g * float64(w[j]) * xh
			}
			sg /= float64(cols)
			sgx /= float64(cols)
			for j, e := range row {
				xh := (float64(e) - mu) * is
				want := is * (float64(dy[i*cols+j])*float64(w[j]) - sg - xh*sgx)
				if !near(float64(dx[i*cols+j]), want, 1e-5*(1+is)) {
					t.Fatalf("LayerNormBackward %dx%d dx[%d,%d] = %v, want %v", rows, cols, i, j, dx[i*cols+j], want)
				}
			}
		}
		for j := range wdw {
			if !near(float64(dw[j]), wdw[j], 1e-5*float64(rows)) || !near(float64(db[j]), wdb[j], 1e-5*float64(rows)) {
				t.Fatalf("LayerNormBackward %dx%d dw[%d] %v db %v, want %v %v", rows, cols, j, dw[j], db[j], wdw[j], wdb[j])
			}
		}
	}
}

// testGELU checks GELU with and without its derivative (into separate
// slices and in place) and Mul against float64 references to
// 2e-6·(1+|value|).
func testGELU(t *testing.T, be device.Backend) {
	r := rand.New(rand.NewPCG(19, 20))
	for _, n := range []int{0, 1, 15, 16, 17, 1000, 140001} { // the last large enough to split
		x := RandSlice(r, n)
		for i := range x {
			x[i] *= 8 // the tails, where tanh saturates
		}
		y, d := make([]float32, n), make([]float32, n)
		be.GELU(y, d, x)
		inPlace := append([]float32(nil), x...)
		be.GELU(inPlace, nil, inPlace)
		dy := RandSlice(r, n)
		dx := make([]float32, n)
		be.Mul(dx, dy, d)
		alias := append([]float32(nil), dy...)
		be.Mul(alias, d, alias)
		const c, a = 0.7978845608028654, 0.044715
		for i, v := range x {
			z := float64(v)
			th := math.Tanh(c * (z + a*z*z*z))
			want := 0.5 * z * (1 + th)
			if !near(float64(y[i]), want, 2e-6) || inPlace[i] != y[i] {
				t.Fatalf("GELU(%v) = %v (in place %v), want %v", v, y[i], inPlace[i], want)
			}
			wd := 0.5*(1+th) + 0.5*z*(1-th*th)*c*(1+3*a*z*z)
			if !near(float64(d[i]), wd, 2e-6) {
				t.Fatalf("GELU'(%v) = %v, want %v", v, d[i], wd)
			}
			if want := dy[i] * d[i]; dx[i] != want || alias[i] != want {
				t.Fatalf("Mul: %v·%v = %v (aliased %v), want %v", dy[i], d[i], dx[i], alias[i], want)
			}
		}
	}
}

func testConv(t *testing.T, be device.Backend) {
	r := rand.New(rand.NewPCG(9, 10))
	for _, g := range []device.ConvGeom{
		{N: 2, H: 5, W: 6, C: 3, KH: 3, KW: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1},
		{N: 1, H: 7, W: 7, C: 2, KH: 5, KW: 5, StrideH: 2, StrideW: 1, PadH: 2, PadW: 0},
		{N: 3, H: 4, W: 4, C: 1, KH: 1, KW: 1, StrideH: 1, StrideW: 1},
	} {
		if err := g.Validate(); err != nil {
			t.Fatal(err)
		}
		x := RandSlice(r, g.N*g.H*g.W*g.C)
		col := make([]float32, g.ColRows()*g.ColCols())
		be.Im2Col(col, x, g)
		oh, ow := g.OutH(), g.OutW()
		dcol := RandSlice(r, len(col))
		dx := make([]float32, len(x))
		be.Col2Im(dx, dcol, g)
		want := make([]float64, len(x))
		for n := 0; n < g.N; n++ {
			for oy := 0; oy < oh; oy++ {
				for ox := 0; ox < ow; ox++ {
					row := (n*oh+oy)*ow + ox
					for c := 0; c < g.C; c++ {
						for ky := 0; ky < g.KH; ky++ {
							for kx := 0; kx < g.KW; kx++ {
								iy, ix := oy*g.StrideH-g.PadH+ky, ox*g.StrideW-g.PadW+kx
								ci := row*g.ColCols() + (c*g.KH+ky)*g.KW + kx
								var v float32
								if iy >= 0 && iy < g.H && ix >= 0 && ix < g.W {
									xi := ((n*g.H+iy)*g.W+ix)*g.C + c
									v = x[xi]
									want[xi] += float64(dcol[ci])
								}
								if col[ci] != v {
									t.Fatalf("im2col %+v at row %d col %d: %v want %v", g, row, ci, col[ci], v)
								}
							}
						}
					}
				}
			}
		}
		for i := range dx {
			if !near(float64(dx[i]), want[i], 1e-5) {
				t.Fatalf("col2im %+v at %d: %v want %v", g, i, dx[i], want[i])
			}
		}
	}
}

func testPool(t *testing.T, be device.Backend) {
	r := rand.New(rand.NewPCG(11, 12))
	g := device.PoolGeom{N: 2, H: 6, W: 5, C: 3, K: 2, Stride: 2}
	x := RandSlice(r, g.N*g.H*g.W*g.C)
	oh, ow := g.OutH(), g.OutW()
	y := make([]float32, g.N*oh*ow*g.C)
	arg := make([]int32, len(y))
	be.MaxPool(y, arg, x, g)
	for n := 0; n < g.N; n++ {
		for oy := 0; oy < oh; oy++ {
			for ox := 0; ox < ow; ox++ {
				for c := 0; c < g.C; c++ {
					best := float32(math.Inf(-1))
					for ky := 0; ky < g.K; ky++ {
						for kx := 0; kx < g.K; kx++ {
							best = max(best, x[((n*g.H+oy*g.Stride+ky)*g.W+ox*g.Stride+kx)*g.C+c])
						}
					}
					o := ((n*oh+oy)*ow+ox)*g.C + c
					if y[o] != best || x[arg[o]] != best {
						t.Fatalf("maxpool at %d: %v want %v", o, y[o], best)
					}
				}
			}
		}
	}
	dy := RandSlice(r, len(y))
	dx := RandSlice(r, len(x)) // must be overwritten
	be.MaxPoolBackward(dx, dy, arg)
	want := make([]float32, len(x))
	for i, a := range arg {
		want[a] += dy[i]
	}
	for i := range dx {
		if dx[i] != want[i] {
			t.Fatalf("maxpool backward at %d", i)
		}
	}
}

func testOptim(t *testing.T, be device.Backend) {
	r := rand.New(rand.NewPCG(13, 14))
	n := 37
	for _, nesterov := range []bool{false, true} {
		for _, mu := range []float32{0, 0.9} {
			w, g := RandSlice(r, n), RandSlice(r, n)
			buf := make([]float32, n)
			ww := make([]float64, n)
			bb := make([]float64, n)
			for i := range w {
				ww[i] = float64(w[i])
			}
			for step := 0; step < 3; step++ {
				be.SGD(w, g, buf, 0.1, mu, 0.01, nesterov)
				for i := range ww {
					d := float64(g[i]) + 0.01*ww[i]
					if mu != 0 {
						bb[i] = float64(mu)*bb[i] + d
						if nesterov {
							d += float64(mu) * bb[i]
						} else {
							d = bb[i]
						}
					}
					ww[i] -= 0.1 * d
				}
			}
			for i := range w {
				if !near(float64(w[i]), ww[i], 1e-5) {
					t.Fatalf("SGD mu=%v nesterov=%v i=%d: %v want %v", mu, nesterov, i, w[i], ww[i])
				}
			}
		}
	}
	for _, decoupled := range []bool{false, true} {
		w := RandSlice(r, n)
		m, v := make([]float32, n), make([]float32, n)
		ww, mm, vv := make([]float64, n), make([]float64, n), make([]float64, n)
		for i := range w {
			ww[i] = float64(w[i])
		}
		const lr, b1, b2, eps, wd = 1e-2, 0.9, 0.999, 1e-8, 0.1
		for step := 1; step <= 4; step++ {
			g := RandSlice(r, n)
			be.Adam(w, g, m, v, step, lr, b1, b2, eps, wd, decoupled)
			for i := range ww {
				gi := float64(g[i])
				if decoupled {
					ww[i] -= lr * wd * ww[i]
				} else {
					gi += wd * ww[i]
				}
				mm[i] = b1*mm[i] + (1-b1)*gi
				vv[i] = b2*vv[i] + (1-b2)*gi*gi
				mh := mm[i] / (1 - math.Pow(b1, float64(step)))
				vh := vv[i] / (1 - math.Pow(b2, float64(step)))
				ww[i] -= lr * mh / (math.Sqrt(vh) + eps)
			}
		}
		for i := range w {
			if !near(float64(w[i]), ww[i], 1e-5) {
				t.Fatalf("Adam decoupled=%v i=%d: %v want %v", decoupled, i, w[i], ww[i])
			}
		}
	}
}

func testRand(t *testing.T, be device.Backend) {
	const n = 200000
	x := make([]float32, n)
	be.RandNormal(x, 1, 2, 42)
	var s, ss float64
	for _, v := range x {
		s += float64(v)
		ss += float64(v) * float64(v)
	}
	mean := s / n
	std := math.Sqrt(ss/n - mean*mean)
	if math.Abs(mean-1) > 0.02 || math.Abs(std-2) > 0.02 {
		t.Fatalf("RandNormal mean %v std %v, want 1, 2", mean, std)
	}
	// Deterministic and split-invariant: the second half filled on its own
	// equals the second half of the whole (same seed, offset indices are
	// not supported, so compare whole fills).
	y := make([]float32, n)
	be.RandNormal(y, 1, 2, 42)
	for i := range x {
		if x[i] != y[i] {
			t.Fatalf("RandNormal not deterministic at %d", i)
		}
	}
	be.RandUniform(x, -3, 5, 7)
	lo, hi := float32(5), float32(-3)
	s = 0
	for _, v := range x {
		lo, hi = min(lo, v), max(hi, v)
		s += float64(v)
	}
	if lo < -3 || hi >= 5 || lo > -2.99 || hi < 4.99 || math.Abs(s/n-1) > 0.03 {
		t.Fatalf("RandUniform range [%v, %v] mean %v", lo, hi, s/n)
	}
	for i := range x {
		if want := -3 + float32(device.UniformAt(7, uint64(i))*8); x[i] != want {
			t.Fatalf("RandUniform[%d] = %v, want backend-independent %v", i, x[i], want)
		}
	}
}
