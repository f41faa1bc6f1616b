package main

import (
	"encoding/hex"
	"fmt"

	"github.com/starling-ml/starling/swarm"
	"github.com/starling-ml/starling/workload"

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

// archID names m's architecture for the swarm: workload.ModelID of its
// architecture digest. Peers with other IDs ignore this one's messages,
// so models of different shapes are never averaged.
func archID(m *nn.Model) string { return workload.ModelID("spirals", workload.Digest(m, nil)) }

// paramDigest returns the SHA-256 of m's parameters (swarm.Digest), in
// hex: equal digests mean bit-identical models.
func paramDigest(m *nn.Model) string {
	d := swarm.Digest(m.Params)
	return hex.EncodeToString(d[:])
}
