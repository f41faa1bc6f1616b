package workload

import (
	"github.com/starling-ml/starling/device"
	"github.com/starling-ml/starling/nn"
)

// Models returns the constructor of the workload's models that a command
// trains: each runs on be (nil: device.Default()) and, when initFile is
// not empty, starts from the weights that safetensors file holds (as
// nn.Model.LoadFile reads them: exactly the model's state dict, in F32)
// instead of seed's initialisation; seed still seeds dropout. The file
// is read and checked once, here, so a bad file fails before any
// training: the error is one line that names the file and, for a
// tensor missing or of another shape, the tensor and both shapes. The
// constructor is safe for concurrent use.
func (w *Workload) Models(be device.Backend, initFile string) (func(seed uint64) (*nn.Model, error), error) {
	build := w.ModelFunc(nn.WithBackend(be))
	if initFile == "" {
		return build, nil
	}
	probe, err := build(0)
	if err != nil {
		return nil, err
	}
	if err := probe.LoadFile(initFile); err != nil {
		return nil, err
	}
	init := probe.Params
	return func(seed uint64) (*nn.Model, error) {
		m, err := build(seed)
		if err != nil {
			return nil, err
		}
		copy(m.Params, init)
		return m, nil
	}, nil
}
