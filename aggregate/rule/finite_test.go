package rule

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// scanFirstNonFinite is the plain scan FirstNonFinite replaced.
func scanFirstNonFinite(x []float32) int {
	for i, v := range x {
		if v-v != 0 {
			return i
		}
	}
	return -1
}

func naiveFirstNonFinite(x []float32) int {
	for i, v := range x {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return i
		}
	}
	return -1
}

// TestFirstNonFinite checks device.AllFinite and the search behind it
// against math.IsNaN/IsInf for every length up to three 64-value steps,
// every position of a bad value, and values next to the bad ones (the
// largest finite values, subnormals).
func TestFirstNonFinite(t *testing.T) {
	bad := []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)), math.Float32frombits(0x7fc00001), math.Float32frombits(0xff800001)}
	good := []float32{0, -0, 1, -1, math.MaxFloat32, -math.MaxFloat32, math.SmallestNonzeroFloat32, math.Float32frombits(0x7f7fffff), math.Float32frombits(0x00800000)}
	r := rand.New(rand.NewPCG(1, 2))
	for n := 0; n <= 3*64+5; n++ {
		x := make([]float32, n)
		for i := range x {
			x[i] = good[r.IntN(len(good))]
		}
		if got := FirstNonFinite(x); got != -1 {
			t.Fatalf("n=%d all finite: got %d", n, got)
		}
		for pos := 0; pos < n; pos++ {
			y := append([]float32(nil), x...)
			y[pos] = bad[r.IntN(len(bad))]
			if pos+3 < n {
				y[pos+3] = bad[r.IntN(len(bad))]
			}
			if got, want := FirstNonFinite(y), naiveFirstNonFinite(y); got != want {
				t.Fatalf("n=%d bad at %d: got %d, want %d", n, pos, got, want)
			}
		}
	}
}

func BenchmarkFirstNonFinite(b *testing.B) {
	for _, n := range []int{16 << 10, 1 << 20} {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(i) * 0.5
		}
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			b.SetBytes(int64(4 * n))
			b.ReportAllocs()
			for b.Loop() {
				if FirstNonFinite(x) != -1 {
					b.Fatal("finite input")
				}
			}
		})
		b.Run(fmt.Sprintf("scan/n=%d", n), func(b *testing.B) {
			b.SetBytes(int64(4 * n))
			for b.Loop() {
				if scanFirstNonFinite(x) != -1 {
					b.Fatal("finite input")
				}
			}
		})
	}
}
