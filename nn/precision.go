package nn

import (
	"fmt"

	"github.com/starling-ml/starling/device"
)

// Precision is the format a model computes in.
//
// FP32 stores and computes everything in float32. BF16 is mixed precision:
// Params (the master weights the optimiser updates) stay float32, and
// before each forward pass the model rounds them into a bfloat16 copy
// that the GEMM layers (Dense, Conv2d, and so the CharLM's projections
// and head) read; the activations a layer keeps only for its own backward
// pass (Conv2d's im2col matrix, GELU's derivative) are stored as
// bfloat16. Every GEMM multiplies and accumulates in float32
// (device.GemmMixed), and gradients, biases, LayerNorm and embeddings stay
// float32.
type Precision int

// The precisions.
const (
	FP32 Precision = iota
	BF16
)

// String returns the name ParsePrecision reads.
func (p Precision) String() string {
	switch p {
	case FP32:
		return "fp32"
	case BF16:
		return "bf16"
	}
	return fmt.Sprintf("Precision(%d)", int(p))
}

// ParsePrecision reads "fp32" (or "") and "bf16".
func ParsePrecision(s string) (Precision, error) {
	switch s {
	case "fp32", "":
		return FP32, nil
	case "bf16":
		return BF16, nil
	}
	return 0, fmt.Errorf("nn: unknown precision %q (want fp32 or bf16)", s)
}

// WithPrecision sets the model's precision (FP32 when not given).
func WithPrecision(p Precision) Option { return func(o *options) { o.prec = p } }

// bf16Layer is implemented by the layers that run in BF16 mode. useBF16
// gives them bfloat16 views of their parameters, in Params order, which
// the model fills from Params before every forward pass; a layer without
// parameters gets none and only switches its saved activations.
type bf16Layer interface {
	useBF16(h [][]uint16)
}

// weightMat is a GEMM operand for weight w (float32) or, in BF16 mode,
// its bfloat16 copy wh.
func weightMat(w []float32, wh []uint16, ld int) device.Mat {
	if wh != nil {
		return device.BF16(wh, ld)
	}
	return device.F32(w, ld)
}

func growHalf(buf []uint16, n int) []uint16 {
	if cap(buf) < n {
		return make([]uint16, n)
	}
	return buf[:n]
}
