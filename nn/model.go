package nn

import (
	"errors"
	"fmt"
	"reflect"
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
	Name   string // PyTorch state-dict name, e.g. "0.weight"
	Shape  []int
	Offset int // start in Params and Grads
	Len    int
}

// Option configures a model or an optimiser; options that do not apply to
// what is being built are ignored.
type Option func(*options)

type options struct {
	be   device.Backend
	arch string
	init func(name string, p ParamSpec) Initializer
	prec Precision
}

func resolve(opts []Option) options {
	o := options{be: device.Default()}
	for _, f := range opts {
		f(&o)
	}
	return o
}

// WithBackend runs the model or optimiser on be (device.Default() when
// not given or nil).
func WithBackend(be device.Backend) Option {
	return func(o *options) {
		if be != nil {
			o.be = be
		}
	}
}

// WithArch names the model's architecture (Model.Arch, which checkpoints
// record and check).
func WithArch(arch string) Option { return func(o *options) { o.arch = arch } }

// WithInit overrides the initialisation of the parameters for which rule
// returns an Initializer (by name, e.g. GPT-2's N(0, 0.02) for weights);
// the others keep their layer's default.
func WithInit(rule func(name string, p ParamSpec) Initializer) Option {
	return func(o *options) { o.init = rule }
}

// Model is a network built from a root layer and a loss, with its
// parameters and gradients in one flat vector each.
type Model struct {
	// Arch is the architecture string the model was built from.
	Arch string
	// Input is the per-sample input shape.
	Input Shape
	// Output is the per-sample output (logits) shape.
	Output Shape
	// Classes is the number of logits per target (Output's last axis).
	Classes int
	// Params holds every parameter; Grads the matching gradients.
	Params, Grads []float32

	be      device.Backend
	root    Layer
	loss    Loss
	targets int // targets per sample
	nodes   []node
	views   []View
	specs   []ParamSpec // of each view
	init    func(name string, p ParamSpec) Initializer
	stoch   []stochastic
	step    uint64
	probs   []float32
	// in and targetBuf hold the batch in the backend's memory when it has
	// its own (device.Stage); unused on the CPU.
	in        []float32
	targetBuf []int32
	prec      Precision
	half      []uint16 // BF16: Params rounded to bfloat16 before each forward pass
}

type stochastic struct {
	l    Stochastic
	seed uint64
}

// NewModel builds a model that maps inputs of shape in through root to
// logits that loss (CrossEntropy when nil) scores. Parameters are named as
// in PyTorch's state_dict and laid out in that order in Params; they are
// initialised from seed alone. Errors wrap ErrArch and, for shapes that do
// not fit, ErrShape.
func NewModel(root Layer, in Shape, loss Loss, seed uint64, opts ...Option) (*Model, error) {
	o := resolve(opts)
	if loss == nil {
		loss = CrossEntropy{}
	}
	arch := o.arch
	if arch == "" {
		arch = root.Kind()
	}
	out, err := root.Setup(in)
	targets := 0
	if err == nil {
		targets, err = loss.Targets(out)
	}
	if err == nil && (len(out) == 0 || targets <= 0) {
		err = fmt.Errorf("%w: %T gives %d targets for output %v", ErrShape, loss, targets, out)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrArch, arch, err)
	}
	m := &Model{
		Arch: arch, Input: append(Shape(nil), in...), Output: out, Classes: out[len(out)-1],
		be: o.be, root: root, loss: loss, targets: targets, init: o.init,
	}
	m.nodes = walk(root, "", nil)
	total := 0
	seen := map[string]bool{}
	layers := map[Layer]bool{}
	for _, nd := range m.nodes {
		if reflect.TypeOf(nd.l).Comparable() {
			if layers[nd.l] {
				return nil, fmt.Errorf("%w: %s: %s %q appears twice in the tree (a layer belongs to one place)", ErrArch, arch, nd.l.Kind(), nd.prefix)
			}
			layers[nd.l] = true
		}
		if s, ok := nd.l.(Stochastic); ok {
			m.stoch = append(m.stoch, stochastic{s, device.Hash64(seed^stochSalt, uint64(len(m.stoch)))})
		}
		for _, p := range nd.specs {
			name := joinName(nd.prefix, p.Suffix)
			if seen[name] {
				return nil, fmt.Errorf("%w: %s: two parameters named %q (children with equal names)", ErrArch, arch, name)
			}
			seen[name] = true
			n := Shape(p.Shape).Size()
			m.views = append(m.views, View{Name: name, Shape: p.Shape, Offset: total, Len: n})
			m.specs = append(m.specs, p)
			total += n
		}
	}
	m.Params = device.Alloc(o.be, total)
	m.Grads = device.Alloc(o.be, total)
	switch o.prec {
	case FP32:
	case BF16:
		m.prec, m.half = BF16, make([]uint16, total)
	default:
		return nil, fmt.Errorf("%w: %s: %v", ErrArch, arch, o.prec)
	}
	vi := 0
	for _, nd := range m.nodes {
		p, g := make([][]float32, len(nd.specs)), make([][]float32, len(nd.specs))
		h := make([][]uint16, len(nd.specs))
		for j := range nd.specs {
			v := m.views[vi]
			p[j], g[j] = m.Params[v.Offset:v.Offset+v.Len], m.Grads[v.Offset:v.Offset+v.Len]
			if m.half != nil {
				h[j] = m.half[v.Offset : v.Offset+v.Len]
			}
			vi++
		}
		nd.l.Bind(p, g)
		if l, ok := nd.l.(bf16Layer); ok && m.half != nil {
			l.useBF16(h)
		}
	}
	m.Init(seed)
	return m, nil
}

// stochSalt separates the seeds of stochastic layers from the parameters'.
const stochSalt = 0x5d0b5d0b5d0b5d0b

// Backend returns the compute backend the model runs on.
func (m *Model) Backend() device.Backend { return m.be }

// Precision returns the format the model computes in.
func (m *Model) Precision() Precision { return m.prec }

// Root returns the model's root layer.
func (m *Model) Root() Layer { return m.root }

// Loss returns the model's loss.
func (m *Model) Loss() Loss { return m.loss }

// Views returns the parameter tensors in order. The slice is shared; do not
// modify it.
func (m *Model) Views() []View { return m.views }

// Param returns the parameter slice of view v.
func (m *Model) Param(v View) []float32 { return m.Params[v.Offset : v.Offset+v.Len] }

// Layers returns the layers the root runs in turn: a Sequential root's
// (after ReLU fusion), else the root alone (for inspection and tests).
func (m *Model) Layers() []Layer {
	if s, ok := m.root.(*Sequential); ok {
		return s.Run()
	}
	return []Layer{m.root}
}

// Step returns the number of training steps (ForwardBackward calls) taken,
// which with the seed decides what stochastic layers draw.
func (m *Model) Step() uint64 { return m.step }

// SetStep sets the step count, to resume a run's randomness from a
// checkpoint or to repeat a step.
func (m *Model) SetStep(step uint64) { m.step = step }

// Init sets every parameter to its initialisation (PyTorch's default
// unless the layer or WithInit says otherwise, U(±1/√fan_in) for Linear
// and Conv2d), from values derived from (seed, tensor index) alone.
func (m *Model) Init(seed uint64) {
	for vi, v := range m.views {
		spec := m.specs[vi]
		f := spec.Init
		if m.init != nil {
			if r := m.init(v.Name, spec); r != nil {
				f = r
			}
		}
		if f == nil {
			f = InitUniform(initBound(spec.FanIn))
		}
		f(m.be, m.Param(v), device.Hash64(seed, uint64(vi)))
	}
}

// Forward returns the logits (n×Output.Size()) for a batch x of n samples,
// in evaluation mode (no dropout). The result is owned by the model and
// valid until the next call.
func (m *Model) Forward(x []float32, n int) []float32 { return m.forward(x, n, false) }

func (m *Model) forward(x []float32, n int, training bool) []float32 {
	if len(x) < n*m.Input.Size() {
		panic(fmt.Sprintf("nn: Forward: %d values for %d samples of %d", len(x), n, m.Input.Size()))
	}
	for _, s := range m.stoch {
		s.l.SetTraining(training, device.Hash64(s.seed, m.step))
	}
	if m.half != nil {
		// Params may have changed since the last pass (an optimiser
		// step, an average with peers): round them afresh.
		device.EncodeBF16(m.half, m.Params)
	}
	return m.root.Forward(m.be, device.Stage(m.be, &m.in, x[:n*m.Input.Size()]), n)
}

// ForwardBackward runs one training step's batch through the model: y
// holds the targets, one per sample or per position as the loss says
// (len(y)/targets samples). It overwrites Grads with the gradient of the
// mean loss and returns that loss and the number of correct predictions
// (samples or positions). It panics on a target outside [0, Classes).
func (m *Model) ForwardBackward(x []float32, y []int32) (loss float64, correct int) {
	n := m.samples(y)
	logits := m.forward(x, n, true)
	m.probs = grow(m.be, m.probs, len(y)*m.Classes)
	loss, correct = m.loss.Loss(m.be, m.probs, logits, device.StageInt32(m.be, &m.targetBuf, y), m.Classes)
	m.root.Backward(m.be, m.probs, n, false)
	m.step++
	return loss, correct
}

// samples checks the targets and returns how many samples they are for.
func (m *Model) samples(y []int32) int {
	if len(y)%m.targets != 0 {
		panic(fmt.Sprintf("nn: %d targets is not a whole number of samples of %d targets", len(y), m.targets))
	}
	for i, c := range y {
		if c < 0 || int(c) >= m.Classes {
			panic(fmt.Sprintf("nn: target %d at %d outside [0, %d)", c, i, m.Classes))
		}
	}
	return len(y) / m.targets
}

// Evaluate returns the mean loss and the accuracy (per target) of the
// model in evaluation mode on the samples in x with targets y, in batches
// of the given number of samples.
func (m *Model) Evaluate(x []float32, y []int32, batch int) (loss, acc float64) {
	if len(y) == 0 {
		return 0, 0
	}
	total := m.samples(y)
	d, t := m.Input.Size(), m.targets
	correct := 0
	for s := 0; s < total; s += batch {
		e := min(s+batch, total)
		logits := m.Forward(x[s*d:e*d], e-s)
		ys := y[s*t : e*t]
		m.probs = grow(m.be, m.probs, len(ys)*m.Classes)
		l, c := m.loss.Loss(m.be, m.probs, logits, device.StageInt32(m.be, &m.targetBuf, ys), m.Classes)
		loss += l * float64(len(ys))
		correct += c
	}
	return loss / float64(len(y)), float64(correct) / float64(len(y))
}

// FLOPsPerSample returns the multiply-add FLOPs (2 per MAC) of one forward
// pass of one sample through the GEMMs of this package's layers; a
// training step costs about three times that (less the first layer's input
// gradient).
func (m *Model) FLOPsPerSample() float64 {
	var f float64
	for _, nd := range m.nodes {
		if l, ok := nd.l.(flopser); ok {
			f += l.flops()
		}
	}
	return f
}

// sequential builds a classifier whose root is NewSequential(mods...)
// and checks it ends in the given number of logits.
func sequential(arch string, in Shape, classes int, mods []Layer, seed uint64, opts []Option) (*Model, error) {
	m, err := NewModel(NewSequential(mods...), in, CrossEntropy{}, seed, append(opts[:len(opts):len(opts)], WithArch(arch))...)
	if err != nil {
		return nil, err
	}
	if m.Classes != classes {
		return nil, fmt.Errorf("%w: %s ends in %v, want %d logits", ErrArch, arch, m.Output, classes)
	}
	return m, nil
}

// NewLogReg returns multinomial logistic regression: one Linear layer.
func NewLogReg(in, classes int, seed uint64, opts ...Option) (*Model, error) {
	return sequential(fmt.Sprintf("logreg:%d-%d", in, classes), Shape{in}, classes, []Layer{&Dense{In: in, Out: classes}}, seed, opts)
}

// NewMLP returns an MLP with the given widths (input, hidden…, classes)
// and ReLU between the layers. FedAvg's "2NN" is {784, 200, 200, 10}.
func NewMLP(widths []int, seed uint64, opts ...Option) (*Model, error) {
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
	return sequential("mlp:"+strings.Join(parts, "-"), Shape{widths[0]}, widths[len(widths)-1], mods, seed, opts)
}

// NewCNN returns the CNN of McMahan et al. 2017 for h×w×c images: 5×5 conv
// with 32 channels, 2×2 max pool, 5×5 conv with 64 channels, 2×2 max pool,
// a 512-unit ReLU layer and a linear output layer ("same" padding, as in
// the TensorFlow model the paper used: 1,663,370 parameters on MNIST).
func NewCNN(h, w, c, classes int, seed uint64, opts ...Option) (*Model, error) {
	mods := []Layer{
		&Conv2D{In: c, Out: 32, K: 5, Pad: 2}, &ReLU{}, &MaxPool2D{K: 2},
		&Conv2D{In: 32, Out: 64, K: 5, Pad: 2}, &ReLU{}, &MaxPool2D{K: 2},
		&Flatten{},
		&Dense{In: (h / 4) * (w / 4) * 64, Out: 512}, &ReLU{},
		&Dense{In: 512, Out: classes},
	}
	return sequential(fmt.Sprintf("cnn:%dx%dx%d-%d", h, w, c, classes), Shape{h, w, c}, classes, mods, seed, opts)
}

// New builds a model for 28×28 grey images with 10 classes (MNIST) from a
// name: "logreg", "mlp" (784-200-200-10, FedAvg's 2NN), "mlp:784-128-10"
// (explicit widths), "2nn", or "cnn" (FedAvg's CNN).
func New(arch string, seed uint64, opts ...Option) (*Model, error) {
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
		return NewLogReg(784, 10, seed, opts...)
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
		return NewMLP(widths, seed, opts...)
	case "cnn":
		if err := r.Done(); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrArch, err)
		}
		return NewCNN(28, 28, 1, 10, seed, opts...)
	}
	return nil, fmt.Errorf("%w: %w", ErrArch, t.Errorf("unknown model %q (want logreg, mlp, mlp:W-W-…, 2nn or cnn)", t.Name))
}
