package nn

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/starling-ml/starling/device"
	"github.com/starling-ml/starling/internal/spec"
)

// Errors returned by nn.
var (
	// ErrShape reports weights or inputs whose shape does not match the model.
	ErrShape = errors.New("nn: shape mismatch")
	// ErrArch reports an unknown or malformed model architecture.
	ErrArch = errors.New("nn: bad architecture")
)

// View names one parameter tensor inside the flat vectors.
type View struct {
	Name   string // PyTorch Sequential name, e.g. "0.weight"
	Shape  []int
	Offset int // start in Params and Grads
	Len    int
}

// Model is a Sequential network ending in logits for Classes classes, with
// its parameters and gradients in one flat vector each.
type Model struct {
	// Arch is the architecture string the model was built from.
	Arch string
	// Input is the per-sample input shape.
	Input Shape
	// Classes is the number of output logits.
	Classes int
	// Params holds every parameter; Grads the matching gradients.
	Params, Grads []float32

	be     device.Backend
	layers []Layer
	views  []View
	probs  []float32
}

// Backend returns the compute backend the model runs on.
func (m *Model) Backend() device.Backend { return m.be }

// Views returns the parameter tensors in order. The slice is shared; do not
// modify it.
func (m *Model) Views() []View { return m.views }

// Param returns the parameter slice of view v.
func (m *Model) Param(v View) []float32 { return m.Params[v.Offset : v.Offset+v.Len] }

// Layers returns the model's layers (for inspection and tests).
func (m *Model) Layers() []Layer { return m.layers }

// build assembles a Sequential from torch-style modules: a ReLU directly
// after a Linear or Conv2d is fused into it but keeps its index, so names
// match torch.nn.Sequential's.
func build(arch string, in Shape, classes int, mods []Layer, seed uint64, be device.Backend) (*Model, error) {
	if be == nil {
		be = device.Default()
	}
	m := &Model{Arch: arch, Input: in, Classes: classes, be: be}
	type named struct {
		l   Layer
		idx int
	}
	var kept []named
	for i, l := range mods {
		if _, ok := l.(*ReLU); ok && len(kept) > 0 {
			switch p := kept[len(kept)-1].l.(type) {
			case *Dense:
				if !p.ReLU {
					p.ReLU = true
					continue
				}
			case *Conv2D:
				if !p.ReLU {
					p.ReLU = true
					continue
				}
			}
		}
		kept = append(kept, named{l, i})
	}
	shape := in
	total := 0
	for _, k := range kept {
		out, err := k.l.Setup(shape)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: module %d: %v", ErrArch, arch, k.idx, err)
		}
		shape = out
		for _, p := range k.l.Params() {
			n := Shape(p.Shape).Size()
			m.views = append(m.views, View{Name: fmt.Sprintf("%d.%s", k.idx, p.Suffix), Shape: p.Shape, Offset: total, Len: n})
			total += n
		}
		m.layers = append(m.layers, k.l)
	}
	if shape.Size() != classes || len(shape) != 1 {
		return nil, fmt.Errorf("%w: %s ends in %v, want %d logits", ErrArch, arch, shape, classes)
	}
	m.Params = make([]float32, total)
	m.Grads = make([]float32, total)
	vi := 0
	for _, l := range m.layers {
		specs := l.Params()
		p, g := make([][]float32, len(specs)), make([][]float32, len(specs))
		for j := range specs {
			v := m.views[vi]
			p[j], g[j] = m.Params[v.Offset:v.Offset+v.Len], m.Grads[v.Offset:v.Offset+v.Len]
			vi++
		}
		l.Bind(p, g)
	}
	m.Init(seed)
	return m, nil
}

// Init sets every parameter to PyTorch's default initialisation,
// U(±1/√fan_in), from values derived from (seed, tensor index) alone.
func (m *Model) Init(seed uint64) {
	vi := 0
	for _, l := range m.layers {
		for _, p := range l.Params() {
			b := initBound(p.FanIn)
			m.be.RandUniform(m.Param(m.views[vi]), -b, b, device.Hash64(seed, uint64(vi)))
			vi++
		}
	}
}

// Forward returns the logits (n×Classes) for a batch x of n samples. The
// result is owned by the model and valid until the next call.
func (m *Model) Forward(x []float32, n int) []float32 {
	if len(x) < n*m.Input.Size() {
		panic(fmt.Sprintf("nn: Forward: %d values for %d samples of %d", len(x), n, m.Input.Size()))
	}
	h := x[:n*m.Input.Size()]
	for _, l := range m.layers {
		h = l.Forward(m.be, h, n)
	}
	return h
}

// ForwardBackward runs one batch (len(y) samples) through the model,
// overwrites Grads with the gradient of the mean cross-entropy loss, and
// returns that loss and the number of correct predictions.
func (m *Model) ForwardBackward(x []float32, y []int32) (loss float64, correct int) {
	n := len(y)
	if err := m.checkLabels(y); err != nil {
		panic(err)
	}
	logits := m.Forward(x, n)
	m.probs = grow(m.probs, n*m.Classes)
	loss, correct = m.be.SoftmaxXent(m.probs, logits, y, n, m.Classes)
	d := m.probs
	for i := len(m.layers) - 1; i >= 0; i-- {
		d = m.layers[i].Backward(m.be, d, n, i > 0)
	}
	return loss, correct
}

func (m *Model) checkLabels(y []int32) error {
	for i, c := range y {
		if c < 0 || int(c) >= m.Classes {
			return fmt.Errorf("nn: label %d of sample %d outside [0, %d)", c, i, m.Classes)
		}
	}
	return nil
}

// Evaluate returns the mean loss and the accuracy of the model on the n
// samples in x (n×Input.Size()) with labels y, in batches of the given size.
func (m *Model) Evaluate(x []float32, y []int32, batch int) (loss, acc float64) {
	if len(y) == 0 {
		return 0, 0
	}
	if err := m.checkLabels(y); err != nil {
		panic(err)
	}
	d := m.Input.Size()
	correct := 0
	for s := 0; s < len(y); s += batch {
		e := min(s+batch, len(y))
		n := e - s
		logits := m.Forward(x[s*d:e*d], n)
		m.probs = grow(m.probs, n*m.Classes)
		l, c := m.be.SoftmaxXent(m.probs, logits, y[s:e], n, m.Classes)
		loss += l * float64(n)
		correct += c
	}
	return loss / float64(len(y)), float64(correct) / float64(len(y))
}

// FLOPsPerSample returns the multiply-add FLOPs (2 per MAC) of one forward
// pass of one sample through the GEMMs; a training step costs about three
// times that (less the first layer's input gradient).
func (m *Model) FLOPsPerSample() float64 {
	var f float64
	for _, l := range m.layers {
		switch l := l.(type) {
		case *Dense:
			f += 2 * float64(l.In) * float64(l.Out)
		case *Conv2D:
			f += 2 * float64(l.geom.OutH()*l.geom.OutW()) * float64(l.geom.ColCols()) * float64(l.Out)
		}
	}
	return f
}

// NewLogReg returns multinomial logistic regression: one Linear layer.
func NewLogReg(in, classes int, seed uint64) (*Model, error) {
	return build(fmt.Sprintf("logreg:%d-%d", in, classes), Shape{in}, classes, []Layer{&Dense{In: in, Out: classes}}, seed, nil)
}

// NewMLP returns an MLP with the given widths (input, hidden…, classes)
// and ReLU between the layers. FedAvg's "2NN" is {784, 200, 200, 10}.
func NewMLP(widths []int, seed uint64) (*Model, error) {
	if len(widths) < 2 {
		return nil, fmt.Errorf("%w: an MLP needs at least input and output widths, got %v", ErrArch, widths)
	}
	var mods []Layer
	parts := make([]string, len(widths))
	for i, w := range widths {
		if w <= 0 {
			return nil, fmt.Errorf("%w: width %d", ErrArch, w)
		}
		parts[i] = strconv.Itoa(w)
		if i == 0 {
			continue
		}
		if i > 1 {
			mods = append(mods, &ReLU{})
		}
		mods = append(mods, &Dense{In: widths[i-1], Out: w})
	}
	return build("mlp:"+strings.Join(parts, "-"), Shape{widths[0]}, widths[len(widths)-1], mods, seed, nil)
}

// NewCNN returns the CNN of McMahan et al. 2017 for h×w×c images: 5×5 conv
// with 32 channels, 2×2 max pool, 5×5 conv with 64 channels, 2×2 max pool,
// a 512-unit ReLU layer and a linear output layer ("same" padding, as in
// the TensorFlow model the paper used: 1,663,370 parameters on MNIST).
func NewCNN(h, w, c, classes int, seed uint64) (*Model, error) {
	mods := []Layer{
		&Conv2D{In: c, Out: 32, K: 5, Pad: 2}, &ReLU{}, &MaxPool2D{K: 2},
		&Conv2D{In: 32, Out: 64, K: 5, Pad: 2}, &ReLU{}, &MaxPool2D{K: 2},
		&Flatten{},
		&Dense{In: (h / 4) * (w / 4) * 64, Out: 512}, &ReLU{},
		&Dense{In: 512, Out: classes},
	}
	return build(fmt.Sprintf("cnn:%dx%dx%d-%d", h, w, c, classes), Shape{h, w, c}, classes, mods, seed, nil)
}

// New builds a model for 28×28 grey images with 10 classes (MNIST) from a
// name: "logreg", "mlp" (784-200-200-10, FedAvg's 2NN), "mlp:784-128-10"
// (explicit widths), "2nn", or "cnn" (FedAvg's CNN).
func New(arch string, seed uint64) (*Model, error) {
	t, err := spec.One(arch)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrArch, err)
	}
	r := t.Reader()
	switch t.Name {
	case "logreg":
		if err := r.Done(); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrArch, err)
		}
		return NewLogReg(784, 10, seed)
	case "mlp", "2nn":
		ws := r.String("widths", "784-200-200-10")
		if err := r.Done(); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrArch, err)
		}
		var widths []int
		for _, f := range strings.Split(ws, "-") {
			w, err := strconv.Atoi(f)
			if err != nil {
				return nil, fmt.Errorf("%w: %w", ErrArch, t.Errorf("widths must be integers joined by '-'"))
			}
			widths = append(widths, w)
		}
		if widths[0] != 784 || widths[len(widths)-1] != 10 {
			return nil, fmt.Errorf("%w: %w", ErrArch, t.Errorf("MNIST models start at 784 and end at 10"))
		}
		return NewMLP(widths, seed)
	case "cnn":
		if err := r.Done(); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrArch, err)
		}
		return NewCNN(28, 28, 1, 10, seed)
	}
	return nil, fmt.Errorf("%w: %w", ErrArch, t.Errorf("unknown model %q (want logreg, mlp, mlp:W-W-…, 2nn or cnn)", t.Name))
}
