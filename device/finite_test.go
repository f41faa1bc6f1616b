package device

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestAllFinite checks the AVX-512 kernel (where this CPU has it) and the
// portable bit test against math.IsNaN/IsInf for every length up to four
// 64-value steps and every position of one bad value, among values next to
// the bad ones (the largest finite values, subnormals).
func TestAllFinite(t *testing.T) {
	bad := []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)), math.Float32frombits(0x7fc00001), math.Float32frombits(0xff800001), math.Float32frombits(0x7f800001)}
	good := []float32{0, float32(math.Copysign(0, -1)), 1, -1, math.MaxFloat32, -math.MaxFloat32, math.SmallestNonzeroFloat32, math.Float32frombits(0x7f7fffff), math.Float32frombits(0xff7fffff), math.Float32frombits(0x00800000)}
	impls := map[string]func([]float32) bool{"go": allFiniteGo}
	if finiteVec {
		impls["avx512"] = func(x []float32) bool { return !nonFiniteAVX512(&x[0], len(x)) }
	} else {
		t.Log("no AVX-512 on this CPU: only the portable test runs")
	}
	r := rand.New(rand.NewPCG(3, 4))
	for name, f := range impls {
		for n := 1; n <= 4*64+17; n++ {
			// One more value than n, bad, past the end: never read.
			buf := make([]float32, n+1)
			for i := range buf {
				buf[i] = good[r.IntN(len(good))]
			}
			buf[n] = bad[0]
			x := buf[:n]
			if !f(x) {
				t.Fatalf("%s n=%d all finite: reported a bad value", name, n)
			}
			for pos := range n {
				old := x[pos]
				x[pos] = bad[r.IntN(len(bad))]
				if f(x) {
					t.Fatalf("%s n=%d: missed %v at %d", name, n, x[pos], pos)
				}
				x[pos] = old
			}
		}
	}
	if !AllFinite(nil) {
		t.Fatal("AllFinite(nil) = false")
	}
}

func BenchmarkAllFinite(b *testing.B) {
	x := make([]float32, 1<<18) // one 1 MiB chunk
	for i := range x {
		x[i] = float32(i) * 0.5
	}
	b.Run("avx512", func(b *testing.B) {
		if !finiteVec {
			b.Skip("no AVX-512")
		}
		b.SetBytes(int64(4 * len(x)))
		for b.Loop() {
			if nonFiniteAVX512(&x[0], len(x)) {
				b.Fatal("finite input")
			}
		}
	})
	b.Run("go", func(b *testing.B) {
		b.SetBytes(int64(4 * len(x)))
		for b.Loop() {
			if !allFiniteGo(x) {
				b.Fatal("finite input")
			}
		}
	})
}

// TestAxpyFinite checks the fused kernel against its backend's Axpy and two AllFinite
// checks, on the fast and the portable backend, for every length up to
// four 64-value steps: y must equal the reference bit for bit, the value
// past the end must stay untouched, and each flag must see one bad input
// value, or one overflowing sum, at every position.
func TestAxpyFinite(t *testing.T) {
	nan := float32(math.NaN())
	inf := float32(math.Inf(1))
	backends := []Backend{NewCPU(), NewFastISA("go")}
	if finiteVec {
		backends = append(backends, NewFast())
	}
	r := rand.New(rand.NewPCG(5, 6))
	for _, be := range backends {
		for n := 0; n <= 4*64+17; n++ {
			x := make([]float32, n)
			y := make([]float32, n+1)
			for i := range x {
				x[i], y[i] = r.Float32()*4-2, r.Float32()*4-2
			}
			y[n] = 42
			check := func(what string, wantIn, wantOut bool) {
				t.Helper()
				ref := append([]float32(nil), y[:n]...)
				be.Axpy(-1.5, x, ref)
				in, out := AxpyFinite(be, -1.5, x, y[:n])
				if in != wantIn || out != wantOut {
					t.Fatalf("%s n=%d %s: (in, out) = (%v, %v), want (%v, %v)", be.Name(), n, what, in, out, wantIn, wantOut)
				}
				for i := range ref {
					if math.Float32bits(ref[i]) != math.Float32bits(y[i]) && !(ref[i] != ref[i] && y[i] != y[i]) {
						t.Fatalf("%s n=%d %s: y[%d] = %v, want %v", be.Name(), n, what, i, y[i], ref[i])
					}
				}
				if y[n] != 42 {
					t.Fatalf("%s n=%d %s: wrote past the end", be.Name(), n, what)
				}
			}
			check("finite", true, true)
			for pos := range n {
				keepX, keepY := x[pos], y[pos]
				y[pos] = nan
				check("NaN in y", false, false)
				y[pos] = keepY
				x[pos] = inf
				check("Inf in x", true, false)
				x[pos], y[pos] = math.MaxFloat32, -math.MaxFloat32
				check("overflow", true, false)
				x[pos], y[pos] = keepX, keepY
			}
		}
	}
}

func BenchmarkAxpyFinite(b *testing.B) {
	x := make([]float32, 1<<16) // one 256 KiB chunk
	y := make([]float32, len(x))
	for i := range x {
		x[i], y[i] = float32(i)*0.5, float32(i)*0.25
	}
	be := Default()
	b.Run("fused", func(b *testing.B) {
		b.SetBytes(int64(4 * len(x)))
		for b.Loop() {
			if in, out := AxpyFinite(be, 1e-9, x, y); !in || !out {
				b.Fatal("finite input")
			}
		}
	})
	b.Run("apart", func(b *testing.B) {
		b.SetBytes(int64(4 * len(x)))
		for b.Loop() {
			if !AllFinite(y) {
				b.Fatal("finite input")
			}
			be.Axpy(1e-9, x, y)
			if !AllFinite(y) {
				b.Fatal("finite input")
			}
		}
	})
}

// TestAxpyTo: AxpyTo gives AxpyFinite's bits without touching y, writes
// no further than out's end, and reports a NaN, ±Inf or overflow in out.
func TestAxpyTo(t *testing.T) {
	be := NewFast()
	if !AxpyToRuns(be) {
		t.Skip("no AVX-512 kernel here: AxpyTo is not used")
	}
	if AxpyToRuns(NewCPU()) {
		t.Fatal("AxpyToRuns for the CPU backend, whose Axpy gives other bits")
	}
	r := rand.New(rand.NewPCG(7, 8))
	for n := 0; n <= 4*64+17; n++ {
		x, y := make([]float32, n), make([]float32, n)
		for i := range x {
			x[i], y[i] = r.Float32()*4-2, r.Float32()*4-2
		}
		for _, bad := range []float32{0, float32(math.NaN()), float32(math.Inf(-1)), math.MaxFloat32} {
			if n == 0 && bad != 0 {
				continue
			}
			xx, yy := append([]float32(nil), x...), append([]float32(nil), y...)
			switch bad {
			case 0:
			case math.MaxFloat32: // an overflow: -1.5·-MaxFloat32
				xx[n/2] = -bad
			default:
				yy[n/2] = bad
			}
			want := append([]float32(nil), yy...)
			AxpyFinite(be, -1.5, xx, want)
			out := make([]float32, n+1)
			out[n] = 42
			ok := AxpyTo(-1.5, xx, yy, out[:n])
			if ok != (bad == 0) {
				t.Fatalf("n=%d bad=%v: finite %v", n, bad, ok)
			}
			for i := range want {
				if math.Float32bits(want[i]) != math.Float32bits(out[i]) && !(want[i] != want[i] && out[i] != out[i]) {
					t.Fatalf("n=%d: out[%d] = %v, want %v", n, i, out[i], want[i])
				}
			}
			if out[n] != 42 || (n > 0 && bad == 0 && yy[0] != y[0]) {
				t.Fatalf("n=%d: wrote past out's end or into y", n)
			}
		}
	}
}

// TestDivFinite: DivFinite gives the bits of float32(float64(x)/d) for
// every length around its 16-value steps, ordinary, subnormal, huge and
// non-finite values, and divisors that overflow and underflow them; it
// reports non-finite results wherever they are.
func TestDivFinite(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, d := range []float64{3, 7.25, 1e-30, 1e30, 0.1, -2} {
		for n := 0; n <= 70; n++ {
			x := make([]float32, n)
			for i := range x {
				switch r.IntN(8) {
				case 0:
					x[i] = math.MaxFloat32 * float32(r.Float64())
				case 1:
					x[i] = math.SmallestNonzeroFloat32 * float32(r.IntN(100))
				default:
					x[i] = float32(r.NormFloat64() * 1e3)
				}
			}
			if n > 0 && r.IntN(4) == 0 {
				x[r.IntN(n)] = float32(math.Inf(1))
			}
			want := make([]float32, n)
			fin := true
			for i, v := range x {
				want[i] = float32(float64(v) / d)
				fin = fin && !math.IsInf(float64(want[i]), 0) && !math.IsNaN(float64(want[i]))
			}
			got := slices.Clone(x)
			if f := DivFinite(got, d); f != fin {
				t.Fatalf("d %v n %d: finite %v, want %v", d, n, f, fin)
			}
			for i := range want {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("d %v n %d: x[%d] = %v, want %v", d, n, i, got[i], want[i])
				}
			}
		}
	}
}
