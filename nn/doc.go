// Package nn holds Starling's models: layers with hand-written backprop on
// device/, the softmax cross-entropy loss, optimisers, learning-rate
// schedules, gradient clipping and safetensors I/O.
//
// # One flat vector
//
// A Model keeps all its parameters in ONE []float32 (Params) and all its
// gradients in another of the same length (Grads); each layer works on views
// into them. That flat vector is what peers send, average and checkpoint:
//
//	m, _ := nn.NewMLP([]int{784, 200, 200, 10}, seed)
//	opt := nn.NewSGD(nn.SGDConfig{Momentum: 0.9})
//	for it.Next() {
//		x, y := it.Batch()
//		loss, _ := m.ForwardBackward(x, y) // fills m.Grads
//		opt.Step(m.Params, m.Grads, sched.LR(step))
//	}
//
// Param views (Model.Views) carry PyTorch-style names and shapes
// ("0.weight" [out, in] for the first Linear of a Sequential), so weights
// saved with SaveFile load into the equivalent torch.nn.Sequential with
// safetensors.torch.load_file. Convolution weights are [F, C, KH, KW] and
// Flatten emits channels-first order, as PyTorch does.
//
// Models are not safe for concurrent use; each peer owns its own. Package nn
// does no network I/O and starts no goroutines (the device backend may use
// threads inside a kernel).
package nn
