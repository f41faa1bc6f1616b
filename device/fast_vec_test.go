package device_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/starling-ml/starling/device"
	"github.com/starling-ml/starling/device/devicetest"
)

// guarded returns a slice of n random values followed, in the same backing
// array, by guard values that no kernel may touch.
func guarded(r *rand.Rand, n int) (s, all []float32) {
	all = devicetest.RandSlice(r, n+17)
	for i := n; i < len(all); i++ {
		all[i] = 12345
	}
	return all[:n], all
}

func checkGuard(t *testing.T, what string, all []float32, n int) {
	t.Helper()
	for i := n; i < len(all); i++ {
		if all[i] != 12345 {
			t.Fatalf("%s n=%d: wrote past the end at %d", what, n, i)
		}
	}
}

func closeTo(got, want, tol float64) bool {
	if math.IsNaN(want) {
		return math.IsNaN(got)
	}
	return math.Abs(got-want) <= tol*(1+math.Abs(want))
}

func sameSlices(t *testing.T, what string, got, want []float32, tol float64) {
	t.Helper()
	for i := range want {
		if !closeTo(float64(got[i]), float64(want[i]), tol) || math.Signbit(float64(got[i])) != math.Signbit(float64(want[i])) && tol == 0 {
			t.Fatalf("%s: [%d] = %v, want %v", what, i, got[i], want[i])
		}
	}
}

// TestVecDifferential compares every elementwise kernel of every Fast ISA
// with the CPU backend over all lengths 0..100 and a few large ones, checks
// that nothing past the stated length is written, and that NaN and signed
// zero go where the CPU backend sends them. Tolerances: exact for the
// selects (ReLU and friends), 1e-6 relative for fused multiply-adds and
// reordered float32 sums, 1e-12 for the float64 reductions.
func TestVecDifferential(t *testing.T) {
	ref := device.NewCPU()
	lens := []int{}
	for n := 0; n <= 100; n++ {
		lens = append(lens, n)
	}
	lens = append(lens, 255, 256, 257, 1000, 4099, 65536+7)
	for _, isa := range device.SupportedISAs() {
		be := device.NewFastISA(isa)
		t.Run(isa, func(t *testing.T) {
			r := rand.New(rand.NewPCG(5, 55))
			for _, n := range lens {
				x, xa := guarded(r, n)
				y, ya := guarded(r, n)
				if n > 3 {
					x[1] = float32(math.NaN())
					x[2] = float32(math.Copysign(0, -1))
					y[3] = float32(math.NaN())
				}
				name := func(k string) string { return fmt.Sprintf("%s n=%d", k, n) }

				want := append([]float32(nil), y...)
				ref.Axpy(0.75, x, want)
				got := append([]float32(nil), ya...)
				be.Axpy(0.75, x, got[:n])
				sameSlices(t, name("Axpy"), got, want, 1e-6)
				checkGuard(t, name("Axpy"), got, n)

				want = append([]float32(nil), x...)
				ref.Scale(-1.5, want)
				got = append([]float32(nil), xa...)
				be.Scale(-1.5, got[:n])
				sameSlices(t, name("Scale"), got, want, 0)
				checkGuard(t, name("Scale"), got, n)

				xf, yf := x, y
				if n > 3 { // finite inputs for the reductions
					xf = append([]float32(nil), x...)
					yf = append([]float32(nil), y...)
					xf[1], yf[3] = 0.5, 0.25
				}
				if g, w := be.Dot(xf, yf), ref.Dot(xf, yf); !closeTo(g, w, 1e-12) {
					t.Fatalf("Dot n=%d: %v want %v", n, g, w)
				}
				if g, w := be.SumSquares(xf), ref.SumSquares(xf); !closeTo(g, w, 1e-12) {
					t.Fatalf("SumSquares n=%d: %v want %v", n, g, w)
				}

				want = make([]float32, n)
				ref.ReLU(want, x)
				got = append([]float32(nil), ya...)
				be.ReLU(got[:n], x)
				sameSlices(t, name("ReLU"), got, want, 0)
				checkGuard(t, name("ReLU"), got, n)
				inplace := append([]float32(nil), xa...)
				be.ReLU(inplace[:n], inplace[:n])
				sameSlices(t, name("ReLU in place"), inplace, want, 0)

				want = make([]float32, n)
				ref.ReLUBackward(want, y, x)
				got = append([]float32(nil), xa...)
				be.ReLUBackward(got[:n], y, x)
				sameSlices(t, name("ReLUBackward"), got, want, 0)
				checkGuard(t, name("ReLUBackward"), got, n)
				alias := append([]float32(nil), ya...)
				be.ReLUBackward(alias[:n], alias[:n], x)
				sameSlices(t, name("ReLUBackward aliased"), alias, want, 0)

				for _, k := range []int{1, 2, 3, 5, 17} {
					srcs := make([][]float32, k)
					ws := make([]float32, k)
					for j := range srcs {
						srcs[j] = devicetest.RandSlice(r, n+j) // longer sources are fine
						ws[j] = float32(r.Float64())
					}
					want = make([]float32, n)
					ref.WeightedSum(want, srcs, ws)
					got = append([]float32(nil), xa...)
					be.WeightedSum(got[:n], srcs, ws)
					sameSlices(t, name(fmt.Sprintf("WeightedSum k=%d", k)), got, want, 1e-6)
					checkGuard(t, name("WeightedSum"), got, n)
				}
			}
		})
	}
}

func TestRowsDifferential(t *testing.T) {
	ref := device.NewCPU()
	for _, isa := range device.SupportedISAs() {
		be := device.NewFastISA(isa)
		t.Run(isa, func(t *testing.T) {
			r := rand.New(rand.NewPCG(6, 66))
			for it := 0; it < 300; it++ {
				rows, cols := r.IntN(20), r.IntN(80)
				if it%20 == 0 {
					rows, cols = 256, []int{10, 128, 784}[r.IntN(3)]
				}
				n := rows * cols
				x, xa := guarded(r, n)
				v := devicetest.RandSlice(r, cols)
				if n > 3 {
					x[0] = float32(math.NaN())
				}
				for _, relu := range []bool{false, true} {
					want := append([]float32(nil), x...)
					got := append([]float32(nil), xa...)
					if relu {
						ref.BiasReLU(want, v, rows, cols)
						be.BiasReLU(got, v, rows, cols)
					} else {
						ref.AddRowVector(want, v, rows, cols)
						be.AddRowVector(got, v, rows, cols)
					}
					sameSlices(t, fmt.Sprintf("relu=%v %dx%d", relu, rows, cols), got, want, 0)
					checkGuard(t, "BiasReLU", got, n)
				}
				if n > 3 {
					x[0] = 1
				}
				d0, da := guarded(r, cols)
				want := append([]float32(nil), d0...)
				ref.SumRows(want, x, rows, cols)
				be.SumRows(da, x, rows, cols)
				sameSlices(t, fmt.Sprintf("SumRows %dx%d", rows, cols), da, want, 1e-5)
				checkGuard(t, "SumRows", da, cols)
			}
		})
	}
}

func TestOptimDifferential(t *testing.T) {
	ref := device.NewCPU()
	for _, isa := range device.SupportedISAs() {
		be := device.NewFastISA(isa)
		t.Run(isa, func(t *testing.T) {
			r := rand.New(rand.NewPCG(7, 77))
			for _, n := range []int{1, 15, 16, 17, 33, 100, 1031} {
				for _, c := range []struct {
					mu, wd   float32
					nesterov bool
				}{{0, 0, false}, {0, 1e-2, false}, {0.9, 1e-3, false}, {0.9, 0, true}} {
					w, wa := guarded(r, n)
					g := devicetest.RandSlice(r, n)
					buf, ba := guarded(r, n)
					ww, bb := append([]float32(nil), w...), append([]float32(nil), buf...)
					for step := 0; step < 3; step++ {
						ref.SGD(ww, g, bb, 0.05, c.mu, c.wd, c.nesterov)
						be.SGD(w, g, buf, 0.05, c.mu, c.wd, c.nesterov)
					}
					sameSlices(t, fmt.Sprintf("SGD n=%d %+v", n, c), w, ww, 1e-6)
					if c.mu != 0 {
						sameSlices(t, fmt.Sprintf("SGD buf n=%d %+v", n, c), buf, bb, 1e-6)
					}
					checkGuard(t, "SGD w", wa, n)
					checkGuard(t, "SGD buf", ba, n)
				}
				for _, decoupled := range []bool{false, true} {
					w, wa := guarded(r, n)
					m, ma := guarded(r, n)
					v, va := guarded(r, n)
					for i := range v {
						v[i] = v[i] * v[i]
					}
					ww := append([]float32(nil), w...)
					mm, vv := append([]float32(nil), m...), append([]float32(nil), v...)
					for step := 1; step <= 5; step++ {
						g := devicetest.RandSlice(r, n)
						ref.Adam(ww, g, mm, vv, step, 1e-3, 0.9, 0.999, 1e-8, 0.01, decoupled)
						be.Adam(w, g, m, v, step, 1e-3, 0.9, 0.999, 1e-8, 0.01, decoupled)
					}
					sameSlices(t, fmt.Sprintf("Adam w n=%d decoupled=%v", n, decoupled), w, ww, 1e-5)
					sameSlices(t, "Adam m", m, mm, 1e-5)
					sameSlices(t, "Adam v", v, vv, 1e-5)
					checkGuard(t, "Adam w", wa, n)
					checkGuard(t, "Adam m", ma, n)
					checkGuard(t, "Adam v", va, n)
				}
			}
		})
	}
}

// TestSoftmaxDifferential compares SoftmaxXent with the CPU backend over
// random shapes, logit scales up to ±200 (exp underflow), ties for the
// argmax, and grad aliasing logits. Tolerances: grad 1e-6 relative to the
// row scale 1/rows, loss 1e-6·(1+|loss|), correct counts exact.
func TestSoftmaxDifferential(t *testing.T) {
	ref := device.NewCPU()
	for _, isa := range device.SupportedISAs() {
		be := device.NewFastISA(isa)
		t.Run(isa, func(t *testing.T) {
			r := rand.New(rand.NewPCG(8, 88))
			for it := 0; it < 400; it++ {
				rows, cols := 1+r.IntN(40), 1+r.IntN(70)
				if it%50 == 0 {
					rows, cols = 256, 10
				}
				scale := []float32{1, 5, 30, 200}[r.IntN(4)]
				z := devicetest.RandSlice(r, rows*cols)
				for i := range z {
					z[i] *= scale
					if r.IntN(7) == 0 {
						z[i] = float32(int(z[i])) // ties
					}
				}
				labels := make([]int32, rows)
				for i := range labels {
					labels[i] = int32(r.IntN(cols))
				}
				want := make([]float32, rows*cols)
				wl, wc := ref.SoftmaxXent(want, z, labels, rows, cols)
				got, ga := guarded(r, rows*cols)
				gl, gc := be.SoftmaxXent(got, z, labels, rows, cols)
				checkGuard(t, "SoftmaxXent", ga, rows*cols)
				alias := append([]float32(nil), z...)
				al, ac := be.SoftmaxXent(alias, alias, labels, rows, cols)
				if gc != wc || ac != wc || !closeTo(gl, wl, 1e-6) || al != gl {
					t.Fatalf("%dx%d scale %v: loss %v/%v correct %d/%d, want %v %d", rows, cols, scale, gl, al, gc, ac, wl, wc)
				}
				tol := 1e-6 / float64(rows)
				for i := range want {
					if math.Abs(float64(got[i]-want[i])) > tol || got[i] != alias[i] {
						t.Fatalf("%dx%d scale %v: grad[%d] = %v (aliased %v), want %v", rows, cols, scale, i, got[i], alias[i], want[i])
					}
				}
			}
		})
	}
}
