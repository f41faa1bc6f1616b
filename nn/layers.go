package nn

import (
	"fmt"
	"math"

	"github.com/starling-ml/starling/device"
)

// Shape is a per-sample activation shape: [D] for vectors, [H, W, C] for
// images (channels last).
type Shape []int

// Size returns the number of values per sample.
func (s Shape) Size() int {
	n := 1
	for _, d := range s {
		n *= d
	}
	return n
}

// ParamSpec declares one parameter tensor of a layer.
type ParamSpec struct {
	Suffix string // "weight" or "bias"
	Shape  []int  // PyTorch layout
	FanIn  int    // for the default initialisation bound 1/√FanIn
}

// Layer is one step of a Sequential model. A layer owns its scratch buffers;
// Forward's result is valid until the next Forward, Backward's until the
// next Backward.
type Layer interface {
	// Kind names the layer type, e.g. "Linear".
	Kind() string
	// Setup fixes the input shape and returns the output shape.
	Setup(in Shape) (Shape, error)
	// Params declares the layer's parameters (may be empty).
	Params() []ParamSpec
	// Bind gives the layer its parameter and gradient views, in Params order.
	Bind(p, g [][]float32)
	// Forward computes the output for a batch of n samples.
	Forward(be device.Backend, x []float32, n int) []float32
	// Backward takes dL/dy and writes the parameter gradients (overwriting
	// them); it returns dL/dx when needDx is set, else nil.
	Backward(be device.Backend, dy []float32, n int, needDx bool) []float32
}

func grow(buf []float32, n int) []float32 {
	if cap(buf) < n {
		return make([]float32, n)
	}
	return buf[:n]
}

// Dense is a fully connected layer y = x·Wᵀ + b with W of shape [Out, In],
// optionally followed by a fused ReLU.
type Dense struct {
	In, Out int
	ReLU    bool // fuse a ReLU after the affine map

	w, b, dw, db []float32
	x, y, dx     []float32
}

// Kind implements Layer.
func (l *Dense) Kind() string { return "Linear" }

// Setup implements Layer.
func (l *Dense) Setup(in Shape) (Shape, error) {
	if in.Size() != l.In {
		return nil, fmt.Errorf("nn: Linear(%d, %d) got input of %d values", l.In, l.Out, in.Size())
	}
	return Shape{l.Out}, nil
}

// Params implements Layer.
func (l *Dense) Params() []ParamSpec {
	return []ParamSpec{{"weight", []int{l.Out, l.In}, l.In}, {"bias", []int{l.Out}, l.In}}
}

// Bind implements Layer.
func (l *Dense) Bind(p, g [][]float32) { l.w, l.b, l.dw, l.db = p[0], p[1], g[0], g[1] }

// Forward implements Layer.
func (l *Dense) Forward(be device.Backend, x []float32, n int) []float32 {
	l.x = x
	l.y = grow(l.y, n*l.Out)
	be.Gemm(false, true, n, l.Out, l.In, 1, x, l.In, l.w, l.In, 0, l.y, l.Out)
	if l.ReLU {
		be.BiasReLU(l.y, l.b, n, l.Out)
	} else {
		be.AddRowVector(l.y, l.b, n, l.Out)
	}
	return l.y
}

// Backward implements Layer. With a fused ReLU, dy is masked in place.
func (l *Dense) Backward(be device.Backend, dy []float32, n int, needDx bool) []float32 {
	if l.ReLU {
		be.ReLUBackward(dy, dy, l.y)
	}
	be.Gemm(true, false, l.Out, l.In, n, 1, dy, l.Out, l.x, l.In, 0, l.dw, l.In)
	clear(l.db)
	be.SumRows(l.db, dy, n, l.Out)
	if !needDx {
		return nil
	}
	l.dx = grow(l.dx, n*l.In)
	be.Gemm(false, false, n, l.In, l.Out, 1, dy, l.Out, l.w, l.In, 0, l.dx, l.In)
	return l.dx
}

// ReLU is a standalone rectifier (models fuse it into the layer before it
// where they can; this form serves layers that cannot fuse).
type ReLU struct {
	size  int
	y, dx []float32
}

// Kind implements Layer.
func (l *ReLU) Kind() string { return "ReLU" }

// Setup implements Layer.
func (l *ReLU) Setup(in Shape) (Shape, error) { l.size = in.Size(); return in, nil }

// Params implements Layer.
func (l *ReLU) Params() []ParamSpec { return nil }

// Bind implements Layer.
func (l *ReLU) Bind(p, g [][]float32) {}

// Forward implements Layer.
func (l *ReLU) Forward(be device.Backend, x []float32, n int) []float32 {
	l.y = grow(l.y, n*l.size)
	be.ReLU(l.y, x[:n*l.size])
	return l.y
}

// Backward implements Layer.
func (l *ReLU) Backward(be device.Backend, dy []float32, n int, needDx bool) []float32 {
	if !needDx {
		return nil
	}
	l.dx = grow(l.dx, n*l.size)
	be.ReLUBackward(l.dx, dy[:n*l.size], l.y)
	return l.dx
}

// Conv2D is a 2-D convolution over channels-last images computed as one
// im2col GEMM per batch, with weight [Out, In, K, K] and an optional fused
// ReLU.
type Conv2D struct {
	In, Out, K, Stride, Pad int
	ReLU                    bool

	h, w             int
	geom             device.ConvGeom
	wt, b, dw, db    []float32
	col, y, dcol, dx []float32
}

// Kind implements Layer.
func (l *Conv2D) Kind() string { return "Conv2d" }

// Setup implements Layer.
func (l *Conv2D) Setup(in Shape) (Shape, error) {
	if len(in) != 3 || in[2] != l.In {
		return nil, fmt.Errorf("nn: Conv2d(%d, %d) needs [H, W, %d] input, got %v", l.In, l.Out, l.In, in)
	}
	if l.Stride == 0 {
		l.Stride = 1
	}
	l.h, l.w = in[0], in[1]
	g := device.ConvGeom{N: 1, H: l.h, W: l.w, C: l.In, KH: l.K, KW: l.K, StrideH: l.Stride, StrideW: l.Stride, PadH: l.Pad, PadW: l.Pad}
	if err := g.Validate(); err != nil {
		return nil, fmt.Errorf("nn: Conv2d: %w", err)
	}
	l.geom = g
	return Shape{g.OutH(), g.OutW(), l.Out}, nil
}

// Params implements Layer.
func (l *Conv2D) Params() []ParamSpec {
	fan := l.In * l.K * l.K
	return []ParamSpec{{"weight", []int{l.Out, l.In, l.K, l.K}, fan}, {"bias", []int{l.Out}, fan}}
}

// Bind implements Layer.
func (l *Conv2D) Bind(p, g [][]float32) { l.wt, l.b, l.dw, l.db = p[0], p[1], g[0], g[1] }

// Forward implements Layer.
func (l *Conv2D) Forward(be device.Backend, x []float32, n int) []float32 {
	g := l.geom
	g.N = n
	rows, cc := g.ColRows(), g.ColCols()
	l.col = grow(l.col, rows*cc)
	be.Im2Col(l.col, x, g)
	l.y = grow(l.y, rows*l.Out)
	be.Gemm(false, true, rows, l.Out, cc, 1, l.col, cc, l.wt, cc, 0, l.y, l.Out)
	if l.ReLU {
		be.BiasReLU(l.y, l.b, rows, l.Out)
	} else {
		be.AddRowVector(l.y, l.b, rows, l.Out)
	}
	return l.y
}

// Backward implements Layer.
func (l *Conv2D) Backward(be device.Backend, dy []float32, n int, needDx bool) []float32 {
	g := l.geom
	g.N = n
	rows, cc := g.ColRows(), g.ColCols()
	if l.ReLU {
		be.ReLUBackward(dy, dy, l.y)
	}
	be.Gemm(true, false, l.Out, cc, rows, 1, dy, l.Out, l.col, cc, 0, l.dw, cc)
	clear(l.db)
	be.SumRows(l.db, dy, rows, l.Out)
	if !needDx {
		return nil
	}
	l.dcol = grow(l.dcol, rows*cc)
	be.Gemm(false, false, rows, cc, l.Out, 1, dy, l.Out, l.wt, cc, 0, l.dcol, cc)
	l.dx = grow(l.dx, n*l.h*l.w*l.In)
	clear(l.dx)
	be.Col2Im(l.dx, l.dcol, g)
	return l.dx
}

// MaxPool2D is a K×K max pooling with the given stride over channels-last
// images.
type MaxPool2D struct {
	K, Stride int

	geom  device.PoolGeom
	y, dx []float32
	arg   []int32
}

// Kind implements Layer.
func (l *MaxPool2D) Kind() string { return "MaxPool2d" }

// Setup implements Layer.
func (l *MaxPool2D) Setup(in Shape) (Shape, error) {
	if len(in) != 3 {
		return nil, fmt.Errorf("nn: MaxPool2d needs [H, W, C] input, got %v", in)
	}
	if l.Stride == 0 {
		l.Stride = l.K
	}
	g := device.PoolGeom{N: 1, H: in[0], W: in[1], C: in[2], K: l.K, Stride: l.Stride}
	if err := g.Validate(); err != nil {
		return nil, fmt.Errorf("nn: MaxPool2d: %w", err)
	}
	l.geom = g
	return Shape{g.OutH(), g.OutW(), g.C}, nil
}

// Params implements Layer.
func (l *MaxPool2D) Params() []ParamSpec { return nil }

// Bind implements Layer.
func (l *MaxPool2D) Bind(p, g [][]float32) {}

// Forward implements Layer.
func (l *MaxPool2D) Forward(be device.Backend, x []float32, n int) []float32 {
	g := l.geom
	g.N = n
	out := n * g.OutH() * g.OutW() * g.C
	l.y = grow(l.y, out)
	if cap(l.arg) < out {
		l.arg = make([]int32, out)
	}
	l.arg = l.arg[:out]
	be.MaxPool(l.y, l.arg, x, g)
	return l.y
}

// Backward implements Layer.
func (l *MaxPool2D) Backward(be device.Backend, dy []float32, n int, needDx bool) []float32 {
	if !needDx {
		return nil
	}
	g := l.geom
	l.dx = grow(l.dx, n*g.H*g.W*g.C)
	be.MaxPoolBackward(l.dx, dy[:len(l.arg)], l.arg)
	return l.dx
}

// Flatten turns [H, W, C] images into vectors in channels-first order
// (C, H, W), the order torch.nn.Flatten produces from NCHW tensors, so the
// Linear layer after it has PyTorch's weight layout.
type Flatten struct {
	h, w, c int
	y, dx   []float32
}

// Kind implements Layer.
func (l *Flatten) Kind() string { return "Flatten" }

// Setup implements Layer.
func (l *Flatten) Setup(in Shape) (Shape, error) {
	switch len(in) {
	case 3:
		l.h, l.w, l.c = in[0], in[1], in[2]
	case 1:
		l.h, l.w, l.c = 1, 1, in[0]
	default:
		return nil, fmt.Errorf("nn: Flatten needs [H, W, C] or [D] input, got %v", in)
	}
	return Shape{in.Size()}, nil
}

// Params implements Layer.
func (l *Flatten) Params() []ParamSpec { return nil }

// Bind implements Layer.
func (l *Flatten) Bind(p, g [][]float32) {}

func (l *Flatten) identity() bool { return l.c == 1 || l.h*l.w == 1 }

// Forward implements Layer.
func (l *Flatten) Forward(be device.Backend, x []float32, n int) []float32 {
	if l.identity() {
		return x
	}
	hw, c := l.h*l.w, l.c
	l.y = grow(l.y, n*hw*c)
	for s := 0; s < n; s++ {
		src, dst := x[s*hw*c:(s+1)*hw*c], l.y[s*hw*c:(s+1)*hw*c]
		for p := 0; p < hw; p++ {
			for ch := 0; ch < c; ch++ {
				dst[ch*hw+p] = src[p*c+ch]
			}
		}
	}
	return l.y
}

// Backward implements Layer.
func (l *Flatten) Backward(be device.Backend, dy []float32, n int, needDx bool) []float32 {
	if !needDx {
		return nil
	}
	if l.identity() {
		return dy
	}
	hw, c := l.h*l.w, l.c
	l.dx = grow(l.dx, n*hw*c)
	for s := 0; s < n; s++ {
		src, dst := dy[s*hw*c:(s+1)*hw*c], l.dx[s*hw*c:(s+1)*hw*c]
		for p := 0; p < hw; p++ {
			for ch := 0; ch < c; ch++ {
				dst[p*c+ch] = src[ch*hw+p]
			}
		}
	}
	return l.dx
}

// initBound is PyTorch's default bound for Linear and Conv2d parameters:
// kaiming_uniform(a=√5) for weights and U(±1/√fan_in) for biases both come
// to 1/√fan_in.
func initBound(fanIn int) float32 { return float32(1 / math.Sqrt(float64(fanIn))) }
