package nn

import (
	"fmt"
	"math"

	"github.com/starling-ml/starling/device"
)

// Shape is a per-sample activation shape: [D] for vectors, [T, D] for
// sequences, [H, W, C] for images (channels last).
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
	Suffix string // "weight" or "bias" (may hold dots: "c_attn.weight")
	Shape  []int  // PyTorch layout
	FanIn  int    // for the default initialisation bound 1/√FanIn
	// Init fills the tensor at initialisation; nil means PyTorch's default
	// for Linear and Conv2d, U(±1/√FanIn).
	Init Initializer
}

// Initializer fills a parameter tensor x with values derived from seed
// alone (a model gives each tensor its own seed).
type Initializer func(be device.Backend, x []float32, seed uint64)

// InitUniform draws from U[−bound, bound).
func InitUniform(bound float32) Initializer {
	return func(be device.Backend, x []float32, seed uint64) { be.RandUniform(x, -bound, bound, seed) }
}

// InitNormal draws from N(0, std²).
func InitNormal(std float32) Initializer {
	return func(be device.Backend, x []float32, seed uint64) { be.RandNormal(x, 0, std, seed) }
}

// InitConst sets every value to v.
func InitConst(v float32) Initializer {
	return func(_ device.Backend, x []float32, _ uint64) {
		for i := range x {
			x[i] = v
		}
	}
}

// Layer is one module of a model: a leaf such as Dense, or a Container of
// other layers. Activations are row-major batches of n samples of the
// shape Setup returned. A layer owns its scratch buffers and belongs to
// one model: Forward's result is valid until the next Forward, Backward's
// until the next Backward. Forward must not modify x; Backward may
// overwrite dy.
type Layer interface {
	// Kind names the layer type, e.g. "Linear".
	Kind() string
	// Setup fixes the per-sample input shape and returns the output shape;
	// errors wrap ErrShape.
	Setup(in Shape) (Shape, error)
	// Params declares the layer's own parameters (may be empty), valid
	// after Setup.
	Params() []ParamSpec
	// Bind gives the layer its parameter and gradient views, in Params order.
	Bind(p, g [][]float32)
	// Forward computes the output for a batch of n samples.
	Forward(be device.Backend, x []float32, n int) []float32
	// Backward takes dL/dy and writes the parameter gradients (overwriting
	// them); it returns dL/dx when needDx is set, else nil.
	Backward(be device.Backend, dy []float32, n int, needDx bool) []float32
}

// noParams gives a layer without parameters of its own its Params and
// Bind.
type noParams struct{}

// Params implements Layer: none.
func (noParams) Params() []ParamSpec { return nil }

// Bind implements Layer: nothing to bind.
func (noParams) Bind(p, g [][]float32) {}

// flopser is implemented by layers that count the multiply-add FLOPs (2
// per MAC) of one sample's forward pass, excluding their children's.
type flopser interface {
	flops() float64
}

// grow is device.Grow: a layer's buffers live in its backend's memory.
func grow(be device.Backend, buf []float32, n int) []float32 { return device.Grow(be, buf, n) }

// lastAxis checks that the last axis of in is d and returns how many
// vectors of d values one sample holds.
func lastAxis(kind string, d int, in Shape) (int, error) {
	if len(in) == 0 || in[len(in)-1] != d {
		return 0, fmt.Errorf("%w: %s needs input [..., %d], got %v", ErrShape, kind, d, in)
	}
	return in.Size() / d, nil
}

// withLast returns in with its last axis replaced by d.
func withLast(in Shape, d int) Shape {
	out := append(Shape(nil), in...)
	out[len(out)-1] = d
	return out
}

// Dense is a fully connected layer y = x·Wᵀ + b (torch.nn.Linear) with W
// of shape [Out, In], applied to the last axis of its input (so to every
// position of a sequence), optionally followed by a fused ReLU.
type Dense struct {
	In, Out int
	ReLU    bool // fuse a ReLU after the affine map
	NoBias  bool // no bias (torch's bias=False)

	pos          int // vectors per sample
	w, b, dw, db []float32
	wh           []uint16 // BF16: the bfloat16 copy of w
	x, y, dx     []float32
}

func (l *Dense) useBF16(h [][]uint16) { l.wh = h[0] }

// Kind implements Layer.
func (l *Dense) Kind() string { return "Linear" }

// Setup implements Layer.
func (l *Dense) Setup(in Shape) (Shape, error) {
	pos, err := lastAxis(fmt.Sprintf("Linear(%d, %d)", l.In, l.Out), l.In, in)
	if err != nil {
		return nil, err
	}
	l.pos = pos
	return withLast(in, l.Out), nil
}

// Params implements Layer.
func (l *Dense) Params() []ParamSpec {
	w := ParamSpec{Suffix: "weight", Shape: []int{l.Out, l.In}, FanIn: l.In}
	if l.NoBias {
		return []ParamSpec{w}
	}
	return []ParamSpec{w, {Suffix: "bias", Shape: []int{l.Out}, FanIn: l.In}}
}

// Bind implements Layer.
func (l *Dense) Bind(p, g [][]float32) {
	l.w, l.dw = p[0], g[0]
	if !l.NoBias {
		l.b, l.db = p[1], g[1]
	}
}

func (l *Dense) flops() float64 { return 2 * float64(l.pos) * float64(l.In) * float64(l.Out) }

// Forward implements Layer.
func (l *Dense) Forward(be device.Backend, x []float32, n int) []float32 {
	rows := n * l.pos
	l.x = x
	l.y = grow(be, l.y, rows*l.Out)
	device.GemmMixed(be, false, true, rows, l.Out, l.In, 1, device.F32(x, l.In), weightMat(l.w, l.wh, l.In), 0, l.y, l.Out)
	switch {
	case l.NoBias && l.ReLU:
		be.ReLU(l.y, l.y)
	case l.NoBias:
	case l.ReLU:
		be.BiasReLU(l.y, l.b, rows, l.Out)
	default:
		be.AddRowVector(l.y, l.b, rows, l.Out)
	}
	return l.y
}

// Backward implements Layer. With a fused ReLU, dy is masked in place.
func (l *Dense) Backward(be device.Backend, dy []float32, n int, needDx bool) []float32 {
	rows := n * l.pos
	if l.ReLU {
		be.ReLUBackward(dy, dy, l.y)
	}
	be.Gemm(true, false, l.Out, l.In, rows, 1, dy, l.Out, l.x, l.In, 0, l.dw, l.In)
	if !l.NoBias {
		clear(l.db)
		be.SumRows(l.db, dy, rows, l.Out)
	}
	if !needDx {
		return nil
	}
	l.dx = grow(be, l.dx, rows*l.In)
	device.GemmMixed(be, false, false, rows, l.In, l.Out, 1, device.F32(dy, l.Out), weightMat(l.w, l.wh, l.In), 0, l.dx, l.In)
	return l.dx
}

// ReLU is a standalone rectifier (models fuse it into the layer before it
// where they can; this form serves layers that cannot fuse).
type ReLU struct {
	noParams
	size  int
	y, dx []float32
}

// Kind implements Layer.
func (l *ReLU) Kind() string { return "ReLU" }

// Setup implements Layer.
func (l *ReLU) Setup(in Shape) (Shape, error) { l.size = in.Size(); return in, nil }

// Forward implements Layer.
func (l *ReLU) Forward(be device.Backend, x []float32, n int) []float32 {
	l.y = grow(be, l.y, n*l.size)
	be.ReLU(l.y, x[:n*l.size])
	return l.y
}

// Backward implements Layer.
func (l *ReLU) Backward(be device.Backend, dy []float32, n int, needDx bool) []float32 {
	if !needDx {
		return nil
	}
	l.dx = grow(be, l.dx, n*l.size)
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
	// BF16: the bfloat16 weights, the im2col matrix in bfloat16 (kept for
	// the weight gradient) and one sample's float32 im2col on the way.
	wth, colh []uint16
	colx      []float32
}

func (l *Conv2D) useBF16(h [][]uint16) { l.wth = h[0] }

// im2col fills the im2col matrix of the batch x (n samples) and returns it
// as a GEMM operand: float32, or in BF16 mode bfloat16, rounded one
// sample at a time so that no float32 copy of the whole matrix exists.
func (l *Conv2D) im2col(be device.Backend, x []float32, n int) device.Mat {
	g := l.geom
	g.N = n
	rows, cc := g.ColRows(), g.ColCols()
	if l.wth == nil {
		l.col = grow(be, l.col, rows*cc)
		be.Im2Col(l.col, x, g)
		return device.F32(l.col, cc)
	}
	l.colh = growHalf(l.colh, rows*cc)
	g.N = 1
	per, in := g.ColRows()*cc, l.h*l.w*l.In
	l.colx = grow(be, l.colx, per)
	for s := 0; s < n; s++ {
		be.Im2Col(l.colx, x[s*in:(s+1)*in], g)
		device.EncodeBF16(l.colh[s*per:(s+1)*per], l.colx)
	}
	return device.BF16(l.colh, cc)
}

// colMat is the im2col matrix of the last Forward as a GEMM operand.
func (l *Conv2D) colMat() device.Mat {
	if l.wth != nil {
		return device.BF16(l.colh, l.geom.ColCols())
	}
	return device.F32(l.col, l.geom.ColCols())
}

// Kind implements Layer.
func (l *Conv2D) Kind() string { return "Conv2d" }

// Setup implements Layer.
func (l *Conv2D) Setup(in Shape) (Shape, error) {
	if len(in) != 3 || in[2] != l.In {
		return nil, fmt.Errorf("%w: Conv2d(%d, %d) needs [H, W, %d] input, got %v", ErrShape, l.In, l.Out, l.In, in)
	}
	if l.Stride == 0 {
		l.Stride = 1
	}
	l.h, l.w = in[0], in[1]
	g := device.ConvGeom{N: 1, H: l.h, W: l.w, C: l.In, KH: l.K, KW: l.K, StrideH: l.Stride, StrideW: l.Stride, PadH: l.Pad, PadW: l.Pad}
	if err := g.Validate(); err != nil {
		return nil, fmt.Errorf("%w: Conv2d: %w", ErrShape, err)
	}
	l.geom = g
	return Shape{g.OutH(), g.OutW(), l.Out}, nil
}

// Params implements Layer.
func (l *Conv2D) Params() []ParamSpec {
	fan := l.In * l.K * l.K
	return []ParamSpec{{Suffix: "weight", Shape: []int{l.Out, l.In, l.K, l.K}, FanIn: fan}, {Suffix: "bias", Shape: []int{l.Out}, FanIn: fan}}
}

func (l *Conv2D) flops() float64 {
	return 2 * float64(l.geom.OutH()*l.geom.OutW()) * float64(l.geom.ColCols()) * float64(l.Out)
}

// Bind implements Layer.
func (l *Conv2D) Bind(p, g [][]float32) { l.wt, l.b, l.dw, l.db = p[0], p[1], g[0], g[1] }

// Forward implements Layer.
func (l *Conv2D) Forward(be device.Backend, x []float32, n int) []float32 {
	g := l.geom
	g.N = n
	rows, cc := g.ColRows(), g.ColCols()
	col := l.im2col(be, x, n)
	l.y = grow(be, l.y, rows*l.Out)
	device.GemmMixed(be, false, true, rows, l.Out, cc, 1, col, weightMat(l.wt, l.wth, cc), 0, l.y, l.Out)
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
	device.GemmMixed(be, true, false, l.Out, cc, rows, 1, device.F32(dy, l.Out), l.colMat(), 0, l.dw, cc)
	clear(l.db)
	be.SumRows(l.db, dy, rows, l.Out)
	if !needDx {
		return nil
	}
	l.dcol = grow(be, l.dcol, rows*cc)
	device.GemmMixed(be, false, false, rows, cc, l.Out, 1, device.F32(dy, l.Out), weightMat(l.wt, l.wth, cc), 0, l.dcol, cc)
	l.dx = grow(be, l.dx, n*l.h*l.w*l.In)
	clear(l.dx)
	be.Col2Im(l.dx, l.dcol, g)
	return l.dx
}

// MaxPool2D is a K×K max pooling with the given stride over channels-last
// images.
type MaxPool2D struct {
	K, Stride int

	noParams
	geom  device.PoolGeom
	y, dx []float32
	arg   []int32
}

// Kind implements Layer.
func (l *MaxPool2D) Kind() string { return "MaxPool2d" }

// Setup implements Layer.
func (l *MaxPool2D) Setup(in Shape) (Shape, error) {
	return poolSetup("MaxPool2d", in, l.K, &l.Stride, &l.geom)
}

// Forward implements Layer.
func (l *MaxPool2D) Forward(be device.Backend, x []float32, n int) []float32 {
	g := l.geom
	g.N = n
	out := n * g.OutH() * g.OutW() * g.C
	l.y = grow(be, l.y, out)
	l.arg = device.GrowInt32(be, l.arg, out)
	be.MaxPool(l.y, l.arg, x, g)
	return l.y
}

// Backward implements Layer.
func (l *MaxPool2D) Backward(be device.Backend, dy []float32, n int, needDx bool) []float32 {
	if !needDx {
		return nil
	}
	g := l.geom
	l.dx = grow(be, l.dx, n*g.H*g.W*g.C)
	be.MaxPoolBackward(l.dx, dy[:len(l.arg)], l.arg)
	return l.dx
}

// poolSetup fixes a pooling layer's geometry (the stride defaults to k)
// and returns its output shape.
func poolSetup(kind string, in Shape, k int, stride *int, geom *device.PoolGeom) (Shape, error) {
	if len(in) != 3 {
		return nil, fmt.Errorf("%w: %s needs [H, W, C] input, got %v", ErrShape, kind, in)
	}
	if *stride == 0 {
		*stride = k
	}
	g := device.PoolGeom{N: 1, H: in[0], W: in[1], C: in[2], K: k, Stride: *stride}
	if err := g.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrShape, kind, err)
	}
	*geom = g
	return Shape{g.OutH(), g.OutW(), g.C}, nil
}

// AvgPool2D is a K×K average pooling with the given stride (K when zero)
// over channels-last images, without padding (torch.nn.AvgPool2d).
type AvgPool2D struct {
	K, Stride int

	noParams
	geom  device.PoolGeom
	y, dx []float32
}

// Kind implements Layer.
func (l *AvgPool2D) Kind() string { return "AvgPool2d" }

// Setup implements Layer.
func (l *AvgPool2D) Setup(in Shape) (Shape, error) {
	return poolSetup("AvgPool2d", in, l.K, &l.Stride, &l.geom)
}

// windows calls f for every output pixel with its offset in the output
// and the offset of each window position's pixel in the input, per sample.
func (l *AvgPool2D) windows(n int, f func(o, i int)) {
	g := l.geom
	oh, ow := g.OutH(), g.OutW()
	for s := 0; s < n; s++ {
		for oy := 0; oy < oh; oy++ {
			for ox := 0; ox < ow; ox++ {
				o := ((s*oh+oy)*ow + ox) * g.C
				for ky := 0; ky < g.K; ky++ {
					for kx := 0; kx < g.K; kx++ {
						f(o, ((s*g.H+oy*g.Stride+ky)*g.W+ox*g.Stride+kx)*g.C)
					}
				}
			}
		}
	}
}

// Forward implements Layer.
func (l *AvgPool2D) Forward(be device.Backend, x []float32, n int) []float32 {
	g := l.geom
	l.y = grow(be, l.y, n*g.OutH()*g.OutW()*g.C)
	clear(l.y)
	l.windows(n, func(o, i int) { be.Axpy(1, x[i:i+g.C], l.y[o:o+g.C]) })
	be.Scale(1/float32(g.K*g.K), l.y)
	return l.y
}

// Backward implements Layer.
func (l *AvgPool2D) Backward(be device.Backend, dy []float32, n int, needDx bool) []float32 {
	if !needDx {
		return nil
	}
	g := l.geom
	inv := 1 / float32(g.K*g.K)
	l.dx = grow(be, l.dx, n*g.H*g.W*g.C)
	clear(l.dx)
	l.windows(n, func(o, i int) { be.Axpy(inv, dy[o:o+g.C], l.dx[i:i+g.C]) })
	return l.dx
}

// Flatten turns each sample into a vector. [H, W, C] images come out in
// channels-first order (C, H, W), the order torch.nn.Flatten produces from
// NCHW tensors, so the Linear layer after it has PyTorch's weight layout;
// any other shape is already in torch's order and passes unchanged.
type Flatten struct {
	noParams
	h, w, c int
	y, dx   []float32
}

// Kind implements Layer.
func (l *Flatten) Kind() string { return "Flatten" }

// Setup implements Layer.
func (l *Flatten) Setup(in Shape) (Shape, error) {
	if len(in) == 3 {
		l.h, l.w, l.c = in[0], in[1], in[2]
	} else {
		l.h, l.w, l.c = 1, 1, in.Size()
	}
	return Shape{in.Size()}, nil
}

func (l *Flatten) identity() bool { return l.c == 1 || l.h*l.w == 1 }

// Forward implements Layer.
func (l *Flatten) Forward(be device.Backend, x []float32, n int) []float32 {
	if l.identity() {
		return x
	}
	l.y = grow(be, l.y, n*l.h*l.w*l.c)
	l.permute(l.y, x, n, true)
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
	l.dx = grow(be, l.dx, n*l.h*l.w*l.c)
	l.permute(l.dx, dy, n, false)
	return l.dx
}

// permute copies n samples between channels-last (src when toCHW) and
// channels-first order.
func (l *Flatten) permute(dst, src []float32, n int, toCHW bool) {
	hw, c := l.h*l.w, l.c
	for s := 0; s < n; s++ {
		in, out := src[s*hw*c:(s+1)*hw*c], dst[s*hw*c:(s+1)*hw*c]
		for p := 0; p < hw; p++ {
			for ch := 0; ch < c; ch++ {
				if toCHW {
					out[ch*hw+p] = in[p*c+ch]
				} else {
					out[p*c+ch] = in[ch*hw+p]
				}
			}
		}
	}
}

// initBound is PyTorch's default bound for Linear and Conv2d parameters:
// kaiming_uniform(a=√5) for weights and U(±1/√fan_in) for biases both come
// to 1/√fan_in.
func initBound(fanIn int) float32 { return float32(1 / math.Sqrt(float64(fanIn))) }
