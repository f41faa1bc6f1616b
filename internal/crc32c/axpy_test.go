package crc32c

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/starling-ml/starling/device"
)

// TestAxpyTo: AxpyTo gives device.AxpyTo's sums bit for bit, Update's
// checksums of y and of the sums, and UpdateFinite's verdict on each, for
// every length up to 300 values and longer ones, from several starting
// CRCs, with a bad value in y or an overflowing sum placed in each
// register of a 64-value step, in the tail and nowhere.
func TestAxpyTo(t *testing.T) {
	if !device.AxpyToRuns(device.NewFast()) {
		t.Skip("no AVX-512 axpy kernel (device.AxpyToRuns)")
	}
	r := rand.New(rand.NewPCG(7, 8))
	lengths := []int{}
	for n := 0; n <= 300; n++ {
		lengths = append(lengths, n)
	}
	lengths = append(lengths, 1024, 4096+17, 65536)
	const alpha = 0.75
	for _, n := range lengths {
		x, y := make([]float32, n), make([]float32, n)
		for i := range x {
			x[i], y[i] = float32(r.NormFloat64()), float32(r.NormFloat64())
		}
		// Where a bad value goes: nowhere, then in each of a step's four
		// registers (values 0, 17, 35, 63 of the last whole step), and in
		// the tail.
		at := []int{-1}
		if steps := n / 64; steps > 0 {
			for _, k := range []int{0, 17, 35, 63} {
				at = append(at, 64*(steps-1)+k)
			}
		}
		if n%64 != 0 {
			at = append(at, n-1)
		}
		for _, i := range at {
			for _, bad := range []string{"none", "nan", "inf", "overflow"} {
				if (i < 0) != (bad == "none") {
					continue
				}
				yy, xx := slices.Clone(y), slices.Clone(x)
				switch bad {
				case "nan":
					yy[i] = float32(math.NaN())
				case "inf":
					yy[i] = float32(math.Inf(-1))
				case "overflow": // y finite, alpha·x + y not
					xx[i], yy[i] = math.MaxFloat32, math.MaxFloat32
				}
				crcY, crcOut := r.Uint32(), r.Uint32()
				want := make([]float32, n)
				wantOutFinite := device.AxpyTo(alpha, xx, yy, want)
				wantCrcY, wantYFinite := UpdateFinite(crcY, floatBytes(yy))
				wantCrcOut := Update(crcOut, floatBytes(want))
				out := make([]float32, n)
				gotCrcY, gotCrcOut, yFinite, outFinite := AxpyTo(alpha, xx, yy, out, crcY, crcOut)
				for k := range out {
					if math.Float32bits(out[k]) != math.Float32bits(want[k]) {
						t.Fatalf("n %d, %s at %d: out[%d] = %v, want %v", n, bad, i, k, out[k], want[k])
					}
				}
				if gotCrcY != wantCrcY || gotCrcOut != wantCrcOut || yFinite != wantYFinite || outFinite != wantOutFinite {
					t.Fatalf("n %d, %s at %d: crcs %#x %#x finite %v %v, want %#x %#x %v %v",
						n, bad, i, gotCrcY, gotCrcOut, yFinite, outFinite, wantCrcY, wantCrcOut, wantYFinite, wantOutFinite)
				}
				if wantYFinite != (bad == "none" || bad == "overflow") || wantOutFinite != (bad == "none") {
					t.Fatalf("n %d, %s at %d: the reference says y finite %v, out finite %v", n, bad, i, wantYFinite, wantOutFinite)
				}
			}
		}
	}
}

// BenchmarkAxpyTo compares AxpyTo with its three passes (UpdateFinite of
// y, device.AxpyTo, Update of the sums) on an all-reduce's receiving end:
// 256 KiB pieces of y in cache, x and out a 48 MB segment.
func BenchmarkAxpyTo(b *testing.B) {
	if !device.AxpyToRuns(device.NewFast()) {
		b.Skip("no AVX-512 axpy kernel")
	}
	const total, piece = 48 << 20 / 4, 256 << 10 / 4
	x, out, y := make([]float32, total), make([]float32, total), make([]float32, piece)
	for i := range x {
		x[i] = float32(i % 100)
	}
	for i := range y {
		y[i] = float32(i % 7)
	}
	b.Run("fused", func(b *testing.B) {
		b.SetBytes(4 * total)
		var c1, c2 uint32
		for b.Loop() {
			for off := 0; off < total; off += piece {
				c1, c2, _, _ = AxpyTo(0.5, x[off:off+piece], y, out[off:off+piece], c1, c2)
			}
		}
	})
	b.Run("passes", func(b *testing.B) {
		b.SetBytes(4 * total)
		var c1, c2 uint32
		for b.Loop() {
			for off := 0; off < total; off += piece {
				c1, _ = UpdateFinite(c1, floatBytes(y))
				device.AxpyTo(0.5, x[off:off+piece], y, out[off:off+piece])
				c2 = Update(c2, floatBytes(out[off:off+piece]))
			}
		}
	})
}
