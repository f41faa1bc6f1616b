package workload

import (
	"encoding/hex"
	"fmt"

	"github.com/starling-ml/starling/data"
	"github.com/starling-ml/starling/device"
	"github.com/starling-ml/starling/nn"
)

// MetaVocab is the safetensors metadata key under which Save records a
// text model's vocabulary: the hex of its binary encoding
// (data.Vocab.AppendBinary: "SVOC", version, level, count, then the
// byte or rune of each token id from 1 up, big-endian uint32s; id 0 is
// the unknown token).
const MetaVocab = "starling.vocab"

// Models returns the constructor of the workload's models that a command
// trains: each runs on be (nil: device.Default()) and, when initFile is
// not empty, starts from the weights that safetensors file holds (as
// nn.Model.LoadFile reads them: exactly the model's state dict, in F32)
// instead of seed's initialisation; seed still seeds dropout. The file
// is read and checked once, here, so a bad file fails before any
// training: the error is one line that starts with the file's path and,
// for a tensor missing or of another shape, names the tensor and both
// shapes; a file Save wrote for another vocabulary of the same size is
// refused with ErrVocab. Further opts (nn.WithPrecision) apply to every
// model. The constructor is safe for concurrent use.
func (w *Workload) Models(be device.Backend, initFile string, opts ...nn.Option) (func(seed uint64) (*nn.Model, error), error) {
	build := w.ModelFunc(append([]nn.Option{nn.WithBackend(be)}, opts...)...)
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
	if err := w.checkVocab(initFile); err != nil {
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

// checkVocab refuses a weights file whose recorded vocabulary is not the
// workload's. A file without one (exported by torch) passes.
func (w *Workload) checkVocab(path string) error {
	meta, err := nn.ReadMetadata(path)
	if err != nil {
		return err
	}
	enc, ok := meta[MetaVocab]
	if !ok || w.Vocab == nil {
		return nil
	}
	b, err := hex.DecodeString(enc)
	var v data.Vocab
	if err == nil {
		err = v.UnmarshalBinary(b)
	}
	if err != nil {
		return fmt.Errorf("%s: %w: metadata %s: %w", path, ErrVocab, MetaVocab, err)
	}
	if v.Digest() != w.Vocab.Digest() {
		return fmt.Errorf("%s: %w: the weights were trained on a %v, this data has a %v", path, ErrVocab, &v, w.Vocab)
	}
	return nil
}

// Save writes m's parameters to path as SaveParams does.
func (w *Workload) Save(m *nn.Model, path string) error { return w.SaveParams(m, path, m.Params) }

// SaveParams writes params, laid out as m's (a swarm's global model, a
// checkpoint's), to path as a PyTorch state dict (nn.Model.SaveParams)
// that also records, for text, the vocabulary under MetaVocab, so that
// the tokens can be decoded and Models can refuse the file for another
// vocabulary.
func (w *Workload) SaveParams(m *nn.Model, path string, params []float32) error {
	var meta map[string]string
	if w.Vocab != nil {
		b, err := w.Vocab.MarshalBinary()
		if err != nil {
			return err
		}
		meta = map[string]string{MetaVocab: hex.EncodeToString(b)}
	}
	return m.SaveParamsWith(path, params, meta)
}
