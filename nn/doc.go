// Package nn holds Starling's models: layers with hand-written backprop on
// device/, containers that compose them, losses, optimisers, learning-rate
// schedules, gradient clipping and safetensors I/O.
//
// # Building a model
//
// A model is a root layer, the per-sample input shape, a loss and a seed.
// Containers name their children as PyTorch modules do:
//
//	block := nn.NewNamedSequential(
//		nn.Child{Name: "ln", Layer: &nn.LayerNorm{Dim: 64}},
//		nn.Child{Name: "attn", Layer: &nn.CausalSelfAttention{Dim: 64, Heads: 4}},
//	)
//	root := nn.NewNamedSequential(
//		nn.Child{Name: "wte", Layer: &nn.Embedding{Num: 65, Dim: 64}},
//		nn.Child{Name: "wpe", Layer: &nn.PositionEmbedding{T: 32, Dim: 64}},
//		nn.Child{Name: "block", Layer: nn.NewResidual(block)}, // x + block(x)
//		nn.Child{Name: "head", Layer: &nn.Dense{In: 64, Out: 65}},
//	)
//	m, err := nn.NewModel(root, nn.Shape{32}, nn.NextTokenCrossEntropy{}, seed)
//	// m.Views(): "wte.weight", "wpe.weight", "block.ln.weight", …,
//	// "block.attn.c_attn.weight", …, "head.bias"
//
// New, NewMLP, NewCNN and NewLogReg build the MNIST classifiers, and
// NewCharLM a minGPT-style character language model, from the same parts.
//
// # One flat vector
//
// A Model keeps all its parameters in ONE []float32 (Params) and all its
// gradients in another of the same length (Grads), in PyTorch's state_dict
// order; each layer works on views into them. That flat vector is what
// peers send, average and checkpoint:
//
//	m, _ := nn.NewMLP([]int{784, 200, 200, 10}, seed)
//	opt := nn.NewSGD(nn.SGDConfig{Momentum: 0.9}, nn.WithBackend(m.Backend()))
//	for it.Next() {
//		x, y := it.Batch()
//		loss, _ := m.ForwardBackward(x, y) // fills m.Grads
//		opt.Step(m.Params, m.Grads, sched.LR(step))
//	}
//
// Param views (Model.Views) carry PyTorch state-dict names and shapes
// ("0.weight" [out, in] for the first Linear of a Sequential), so weights
// saved with SaveFile (or SaveParams, from a vector laid out as Params)
// load strictly into the equivalent torch module with
// safetensors.torch.load_file, and LoadFile reads such a state dict back.
// Convolution weights are [F, C, KH, KW] and Flatten emits channels-first
// order, as PyTorch does; Starling's images are channels last, so torch
// takes a batch as x.permute(0, 3, 1, 2).
//
// Targets are class indices: one per sample for CrossEntropy, one per
// position for NextTokenCrossEntropy; token ids enter as float32 values.
// The compute backend is a value the model holds (WithBackend, else
// device.Default()); pass it on to the optimiser.
//
// Models are not safe for concurrent use; each peer owns its own. A layer
// belongs to one model. Package nn does no network I/O and starts no
// goroutines (the device backend may use threads inside a kernel).
package nn
