package main

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"

	"github.com/starling-ml/starling/nn"
	"github.com/starling-ml/starling/train"
)

// modelFunc returns the constructor of this example's classifier: a Dense
// embedding of the 2-D point into width features, blocks pre-LayerNorm
// residual MLP blocks (x + proj(GELU(fc(LayerNorm(x))))), a final
// LayerNorm and a Dense head with one logit per class. Parameters carry
// PyTorch state-dict names ("embed.weight", "block0.fc.weight", …).
func modelFunc(width, blocks, classes int) train.ModelFunc {
	return func(seed uint64) (*nn.Model, error) {
		children := []nn.Child{{Name: "embed", Layer: &nn.Dense{In: 2, Out: width}}}
		for b := range blocks {
			body := nn.NewNamedSequential(
				nn.Child{Name: "ln", Layer: &nn.LayerNorm{Dim: width}},
				nn.Child{Name: "fc", Layer: &nn.Dense{In: width, Out: 2 * width}},
				nn.Child{Name: "act", Layer: &nn.GELU{}},
				nn.Child{Name: "proj", Layer: &nn.Dense{In: 2 * width, Out: width}},
			)
			children = append(children, nn.Child{Name: fmt.Sprintf("block%d", b), Layer: nn.NewResidual(body)})
		}
		children = append(children,
			nn.Child{Name: "ln_f", Layer: &nn.LayerNorm{Dim: width}},
			nn.Child{Name: "head", Layer: &nn.Dense{In: width, Out: classes}},
		)
		arch := fmt.Sprintf("spirals-resmlp:width=%d,blocks=%d,classes=%d", width, blocks, classes)
		return nn.NewModel(nn.NewNamedSequential(children...), nn.Shape{2}, nn.CrossEntropy{}, seed, nn.WithArch(arch))
	}
}

// archID names m's architecture for the swarm: its Arch string and a
// digest of every parameter's name and shape. Peers with other IDs ignore
// this one's messages, so models of different shapes are never averaged.
func archID(m *nn.Model) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n", m.Arch)
	for _, v := range m.Views() {
		fmt.Fprintf(h, "%s %v\n", v.Name, v.Shape)
	}
	return "spirals-" + hex.EncodeToString(h.Sum(nil)[:8])
}

// paramDigest returns the SHA-256 of m's parameters as little-endian
// float32 bits, in hex: equal digests mean bit-identical models.
func paramDigest(m *nn.Model) string {
	h := sha256.New()
	var b [4]byte
	for _, p := range m.Params {
		binary.LittleEndian.PutUint32(b[:], math.Float32bits(p))
		h.Write(b[:])
	}
	return hex.EncodeToString(h.Sum(nil))
}
