package device_test

import (
	"testing"

	"github.com/starling-ml/starling/device"
	"github.com/starling-ml/starling/device/devicetest"
)

func TestCPUConformance(t *testing.T) { devicetest.Run(t, device.NewCPU()) }

func TestDefaultConformance(t *testing.T) { devicetest.Run(t, device.Default()) }

func TestGeomValidate(t *testing.T) {
	bad := []device.ConvGeom{
		{N: 1, H: 2, W: 2, C: 1, KH: 3, KW: 3, StrideH: 1, StrideW: 1},
		{N: 1, H: 2, W: 2, C: 0, KH: 1, KW: 1, StrideH: 1, StrideW: 1},
		{N: 1, H: 2, W: 2, C: 1, KH: 1, KW: 1, StrideH: 0, StrideW: 1},
	}
	for _, g := range bad {
		if g.Validate() == nil {
			t.Errorf("%+v: want error", g)
		}
	}
	if (device.PoolGeom{N: 1, H: 1, W: 4, C: 1, K: 2, Stride: 2}).Validate() == nil {
		t.Error("pool larger than input: want error")
	}
}

func TestDefaultIsFast(t *testing.T) {
	f := device.NewFast()
	want := f.Name()
	if f.ISA() == "go" {
		want = device.NewCPU().Name()
	}
	if got := device.Default().Name(); got != want {
		t.Fatalf("Default() = %s, want %s", got, want)
	}
	t.Logf("default backend: %s", want)
}
