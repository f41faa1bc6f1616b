package device_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/starling-ml/starling/device"
	"github.com/starling-ml/starling/device/devicetest"
)

// TestConvDifferential compares Im2Col, Col2Im, MaxPool and MaxPoolBackward
// of every Fast ISA with the CPU backend over random geometries (padding,
// strides, windows of 1..36 positions, channel counts across the 16-lane
// blocks), with guard elements after every output. Im2Col and MaxPool must
// match exactly (they copy); Col2Im sums in a different order, 1e-6.
func TestConvDifferential(t *testing.T) {
	ref := device.NewCPU()
	for _, isa := range device.SupportedISAs() {
		be := device.NewFastISA(isa)
		t.Run(isa, func(t *testing.T) {
			r := rand.New(rand.NewPCG(9, 99))
			for it := 0; it < 150; it++ {
				g := device.ConvGeom{
					N: 1 + r.IntN(3), H: 1 + r.IntN(12), W: 1 + r.IntN(12), C: 1 + r.IntN(40),
					KH: 1 + r.IntN(6), KW: 1 + r.IntN(6), StrideH: 1 + r.IntN(3), StrideW: 1 + r.IntN(3),
					PadH: r.IntN(3), PadW: r.IntN(3),
				}
				if it == 0 { // the FedAvg CNN's second convolution
					g = device.ConvGeom{N: 2, H: 14, W: 14, C: 32, KH: 5, KW: 5, StrideH: 1, StrideW: 1, PadH: 2, PadW: 2}
				}
				if g.Validate() != nil {
					continue
				}
				name := fmt.Sprintf("%+v", g)
				x := devicetest.RandSlice(r, g.N*g.H*g.W*g.C)
				n := g.ColRows() * g.ColCols()
				want := make([]float32, n)
				ref.Im2Col(want, x, g)
				got, all := guarded(r, n)
				be.Im2Col(got, x, g)
				sameSlices(t, "Im2Col "+name, got, want, 0)
				checkGuard(t, "Im2Col "+name, all, n)

				dcol := devicetest.RandSlice(r, n)
				wdx := devicetest.RandSlice(r, len(x)) // Col2Im accumulates
				gdx, gall := guarded(r, len(x))
				copy(gdx, wdx)
				ref.Col2Im(wdx, dcol, g)
				be.Col2Im(gdx, dcol, g)
				sameSlices(t, "Col2Im "+name, gdx, wdx, 1e-6)
				checkGuard(t, "Col2Im "+name, gall, len(x))
			}
			for it := 0; it < 150; it++ {
				g := device.PoolGeom{N: 1 + r.IntN(3), H: 1 + r.IntN(12), W: 1 + r.IntN(12), C: 1 + r.IntN(70), K: 1 + r.IntN(4), Stride: 1 + r.IntN(3)}
				if g.Validate() != nil {
					continue
				}
				name := fmt.Sprintf("%+v", g)
				x := devicetest.RandSlice(r, g.N*g.H*g.W*g.C)
				for i := range x {
					switch r.IntN(10) {
					case 0:
						x[i] = 0.5 // ties: the first maximum wins
					case 1:
						x[i] = float32(math.NaN())
					}
				}
				n := g.N * g.OutH() * g.OutW() * g.C
				wy, warg := make([]float32, n), make([]int32, n)
				ref.MaxPool(wy, warg, x, g)
				gy, yall := guarded(r, n)
				garg := make([]int32, n+5)
				for i := range garg {
					garg[i] = -7
				}
				be.MaxPool(gy, garg[:n], x, g)
				sameSlices(t, "MaxPool "+name, gy, wy, 0)
				checkGuard(t, "MaxPool "+name, yall, n)
				for i := range warg {
					if garg[i] != warg[i] {
						t.Fatalf("MaxPool %s: arg[%d] = %d, want %d", name, i, garg[i], warg[i])
					}
				}
				for i := n; i < len(garg); i++ {
					if garg[i] != -7 {
						t.Fatalf("MaxPool %s: wrote arg past the end", name)
					}
				}
				dy := devicetest.RandSlice(r, n)
				wdx := make([]float32, len(x))
				gdx := devicetest.RandSlice(r, len(x))
				ref.MaxPoolBackward(wdx, dy, warg)
				be.MaxPoolBackward(gdx, dy, warg)
				sameSlices(t, "MaxPoolBackward "+name, gdx, wdx, 0)
			}
		})
	}
}
