package nn

import (
	"fmt"
	"slices"
	"strconv"

	"github.com/starling-ml/starling/device"
)

// Container is a layer made of named child layers, such as Sequential and
// Residual. Its parameters are its children's (and its own, which come
// first), named by PyTorch's dotted paths: "blocks.0.attn.c_attn.weight".
type Container interface {
	Layer
	// Children returns the child layers in PyTorch registration order.
	// The slice is shared; do not modify it.
	Children() []Child
}

// Child is one named child of a Container. An empty Name adds no path
// segment: the child's parameters are named as if they were the
// container's own (how a torch module's forward that calls two of its
// attributes in turn is written here).
type Child struct {
	Name  string
	Layer Layer
}

// Stochastic is implemented by layers whose training forward pass draws
// random numbers (Dropout). Before every forward pass the model calls
// SetTraining with whether it trains and, if so, a seed derived from the
// model's seed, the layer's position and the step, so that a step's
// randomness is reproducible.
type Stochastic interface {
	SetTraining(training bool, seed uint64)
}

// Sequential runs its children in order, as torch.nn.Sequential does. A
// ReLU directly after a Dense or Conv2D is fused into that layer (it keeps
// its name, so parameter names still match torch's).
type Sequential struct {
	noParams
	children []Child
	run      []Layer
	ins      []Shape // ins[i]: the per-sample input shape of run[i]
	fused    []bool  // fused[i]: child i is a ReLU fused into child i−1
}

var _ Container = (*Sequential)(nil)

// NewSequential returns a Sequential whose children are named "0", "1", …
// as in torch.nn.Sequential(*layers).
func NewSequential(layers ...Layer) *Sequential {
	cs := make([]Child, len(layers))
	for i, l := range layers {
		cs[i] = Child{Name: strconv.Itoa(i), Layer: l}
	}
	return &Sequential{children: cs}
}

// NewNamedSequential returns a Sequential with the given children, as
// torch.nn.Sequential(OrderedDict(...)) or a torch module whose forward
// calls its attributes in turn.
func NewNamedSequential(children ...Child) *Sequential {
	return &Sequential{children: append([]Child(nil), children...)}
}

// Kind implements Layer.
func (s *Sequential) Kind() string { return "Sequential" }

// Children implements Container.
func (s *Sequential) Children() []Child { return s.children }

// Run returns the layers Forward runs, after fusion (for inspection).
func (s *Sequential) Run() []Layer { return s.run }

// Setup implements Layer.
func (s *Sequential) Setup(in Shape) (Shape, error) {
	if len(s.fused) != len(s.children) {
		s.fused = make([]bool, len(s.children))
		for i := 1; i < len(s.children); i++ {
			if _, ok := s.children[i].Layer.(*ReLU); !ok {
				continue
			}
			switch p := s.children[i-1].Layer.(type) {
			case *Dense:
				s.fused[i], p.ReLU = !p.ReLU, true
			case *Conv2D:
				s.fused[i], p.ReLU = !p.ReLU, true
			}
		}
	}
	s.run, s.ins = s.run[:0], s.ins[:0]
	shape := in
	for i, c := range s.children {
		if s.fused[i] {
			continue
		}
		out, err := c.Layer.Setup(shape)
		if err != nil {
			return nil, fmt.Errorf("module %s (%s): %w", c.Name, c.Layer.Kind(), err)
		}
		s.ins = append(s.ins, shape)
		shape = out
		s.run = append(s.run, c.Layer)
	}
	return shape, nil
}

// Forward implements Layer.
func (s *Sequential) Forward(be device.Backend, x []float32, n int) []float32 {
	for _, l := range s.run {
		x = l.Forward(be, x, n)
	}
	return x
}

// Backward implements Layer.
func (s *Sequential) Backward(be device.Backend, dy []float32, n int, needDx bool) []float32 {
	for i := len(s.run) - 1; i >= 0; i-- {
		dy = s.run[i].Backward(be, dy, n, i > 0 || needDx)
	}
	return dy
}

// Residual is a skip connection around its body: y = x + Body(x). The body
// must keep the shape. Its gradient is the body's plus the identity's; the
// body's parameters are named as if they were the Residual's parent's
// (Residual adds no path segment).
type Residual struct {
	Body Layer

	noParams
	size  int
	y, dx []float32
}

var _ Container = (*Residual)(nil)

// NewResidual returns the skip connection y = x + body(x).
func NewResidual(body Layer) *Residual { return &Residual{Body: body} }

// Kind implements Layer.
func (r *Residual) Kind() string { return "Residual" }

// Children implements Container: the body, with no name of its own.
func (r *Residual) Children() []Child { return []Child{{Layer: r.Body}} }

// Setup implements Layer.
func (r *Residual) Setup(in Shape) (Shape, error) {
	out, err := r.Body.Setup(in)
	if err != nil {
		return nil, err
	}
	if !slices.Equal(in, out) {
		return nil, fmt.Errorf("%w: Residual body maps %v to %v; x + body(x) needs equal shapes", ErrShape, in, out)
	}
	r.size = in.Size()
	return in, nil
}

// Forward implements Layer.
func (r *Residual) Forward(be device.Backend, x []float32, n int) []float32 {
	x = x[:n*r.size]
	b := r.Body.Forward(be, x, n)
	r.y = grow(be, r.y, len(x))
	copy(r.y, x)
	be.Axpy(1, b[:len(x)], r.y)
	return r.y
}

// Backward implements Layer.
func (r *Residual) Backward(be device.Backend, dy []float32, n int, needDx bool) []float32 {
	dy = dy[:n*r.size]
	if needDx {
		r.dx = grow(be, r.dx, len(dy))
		copy(r.dx, dy) // before the body may overwrite dy
	}
	d := r.Body.Backward(be, dy, n, needDx)
	if !needDx {
		return nil
	}
	be.Axpy(1, d[:len(dy)], r.dx)
	return r.dx
}

// node is one layer of a model's tree with its path and parameter specs.
type node struct {
	l      Layer
	prefix string
	specs  []ParamSpec
}

// walk lists l and every layer below it, parents first, children in
// order, as torch's state_dict does.
func walk(l Layer, prefix string, out []node) []node {
	out = append(out, node{l: l, prefix: prefix, specs: l.Params()})
	if c, ok := l.(Container); ok {
		for _, ch := range c.Children() {
			out = walk(ch.Layer, joinName(prefix, ch.Name), out)
		}
	}
	return out
}

func joinName(prefix, name string) string {
	switch {
	case prefix == "":
		return name
	case name == "":
		return prefix
	}
	return prefix + "." + name
}
