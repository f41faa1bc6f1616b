package nn

import (
	"errors"
	"fmt"
	"math"

	"github.com/starling-ml/starling/device"
	"github.com/starling-ml/starling/internal/spec"
)

// ErrOptimizer reports an unknown optimiser or bad optimiser settings.
var ErrOptimizer = errors.New("nn: bad optimizer")

// Optimizer updates a flat parameter vector from its gradient.
type Optimizer interface {
	// Step applies one update with learning rate lr.
	Step(params, grads []float32, lr float32)
	// Name describes the optimiser and its settings.
	Name() string
	// State returns the optimiser's state for checkpoints: the step count
	// and named vectors (views, not copies).
	State() (steps int, vectors map[string][]float32)
	// SetState restores a state returned by State (copying the vectors).
	SetState(steps int, vectors map[string][]float32) error
}

// SGDConfig configures SGD as torch.optim.SGD does.
type SGDConfig struct {
	Momentum    float32 // 0 disables momentum
	Nesterov    bool    // Nesterov momentum (needs Momentum > 0)
	WeightDecay float32 // L2 penalty added to the gradient
}

// SGD is stochastic gradient descent with optional (Nesterov) momentum and
// weight decay.
type SGD struct {
	cfg   SGDConfig
	buf   []float32
	steps int
	be    device.Backend
}

// NewSGD returns an SGD optimiser running on the backend WithBackend names
// (pass the model's: nn.WithBackend(m.Backend())).
func NewSGD(cfg SGDConfig, opts ...Option) *SGD { return &SGD{cfg: cfg, be: resolve(opts).be} }

// Name implements Optimizer.
func (o *SGD) Name() string {
	return fmt.Sprintf("sgd(momentum=%g, nesterov=%v, wd=%g)", o.cfg.Momentum, o.cfg.Nesterov, o.cfg.WeightDecay)
}

// Step implements Optimizer.
func (o *SGD) Step(params, grads []float32, lr float32) {
	if o.cfg.Momentum != 0 && len(o.buf) != len(params) {
		o.buf = device.Alloc(o.be, len(params))
	}
	o.be.SGD(params, grads, o.buf, lr, o.cfg.Momentum, o.cfg.WeightDecay, o.cfg.Nesterov)
	o.steps++
	device.Sync(o.be) // the host reads the parameters next: exchange, checkpoint
}

// State implements Optimizer.
func (o *SGD) State() (int, map[string][]float32) {
	v := map[string][]float32{}
	if o.buf != nil {
		v["momentum"] = o.buf
	}
	return o.steps, v
}

// SetState implements Optimizer.
func (o *SGD) SetState(steps int, v map[string][]float32) error {
	o.steps = steps
	if b, ok := v["momentum"]; ok {
		o.buf = append([]float32(nil), b...)
	} else {
		o.buf = nil
	}
	return nil
}

// AdamConfig configures Adam and AdamW.
type AdamConfig struct {
	Beta1, Beta2 float32 // moment decay rates (0.9, 0.999 when zero)
	Eps          float32 // denominator guard (1e-8 when zero)
	WeightDecay  float32
	// Decoupled applies weight decay to the weights directly (AdamW)
	// instead of adding it to the gradient.
	Decoupled bool
}

// Adam is the Adam optimiser (AdamW with Decoupled).
type Adam struct {
	cfg   AdamConfig
	m, v  []float32
	steps int
	be    device.Backend
}

// NewAdam returns an Adam (or AdamW) optimiser running on the backend
// WithBackend names (pass the model's: nn.WithBackend(m.Backend())).
func NewAdam(cfg AdamConfig, opts ...Option) *Adam {
	if cfg.Beta1 == 0 {
		cfg.Beta1 = 0.9
	}
	if cfg.Beta2 == 0 {
		cfg.Beta2 = 0.999
	}
	if cfg.Eps == 0 {
		cfg.Eps = 1e-8
	}
	return &Adam{cfg: cfg, be: resolve(opts).be}
}

// Name implements Optimizer.
func (o *Adam) Name() string {
	n := "adam"
	if o.cfg.Decoupled {
		n = "adamw"
	}
	return fmt.Sprintf("%s(betas=(%g, %g), eps=%g, wd=%g)", n, o.cfg.Beta1, o.cfg.Beta2, o.cfg.Eps, o.cfg.WeightDecay)
}

// Step implements Optimizer.
func (o *Adam) Step(params, grads []float32, lr float32) {
	if len(o.m) != len(params) {
		o.m, o.v = device.Alloc(o.be, len(params)), device.Alloc(o.be, len(params))
	}
	o.steps++
	c := o.cfg
	o.be.Adam(params, grads, o.m, o.v, o.steps, lr, c.Beta1, c.Beta2, c.Eps, c.WeightDecay, c.Decoupled)
	device.Sync(o.be) // the host reads the parameters next: exchange, checkpoint
}

// State implements Optimizer.
func (o *Adam) State() (int, map[string][]float32) {
	v := map[string][]float32{}
	if o.m != nil {
		v["exp_avg"], v["exp_avg_sq"] = o.m, o.v
	}
	return o.steps, v
}

// SetState implements Optimizer.
func (o *Adam) SetState(steps int, v map[string][]float32) error {
	m, ok1 := v["exp_avg"]
	s, ok2 := v["exp_avg_sq"]
	if ok1 != ok2 || len(m) != len(s) {
		return fmt.Errorf("%w: adam state needs exp_avg and exp_avg_sq of equal length", ErrOptimizer)
	}
	o.steps = steps
	o.m, o.v = append([]float32(nil), m...), append([]float32(nil), s...)
	if !ok1 {
		o.m, o.v = nil, nil
	}
	return nil
}

// NewOptimizer builds an optimiser from a name: "sgd", "momentum" (SGD
// with momentum 0.9), "nesterov", "adam" or "adamw", with weight decay wd,
// on the backend WithBackend names.
func NewOptimizer(name string, wd float32, opts ...Option) (Optimizer, error) {
	switch name {
	case "sgd":
		return NewSGD(SGDConfig{WeightDecay: wd}, opts...), nil
	case "momentum":
		return NewSGD(SGDConfig{Momentum: 0.9, WeightDecay: wd}, opts...), nil
	case "nesterov":
		return NewSGD(SGDConfig{Momentum: 0.9, Nesterov: true, WeightDecay: wd}, opts...), nil
	case "adam":
		return NewAdam(AdamConfig{WeightDecay: wd}, opts...), nil
	case "adamw":
		return NewAdam(AdamConfig{WeightDecay: wd, Decoupled: true}, opts...), nil
	}
	return nil, fmt.Errorf("%w: unknown optimizer %q (want sgd, momentum, nesterov, adam or adamw)", ErrOptimizer, name)
}

// ClipGlobalNorm scales grads so their L2 norm is at most maxNorm and
// returns the norm before clipping. A non-finite norm is returned as is and
// leaves grads untouched so the caller can stop.
func ClipGlobalNorm(be device.Backend, grads []float32, maxNorm float64) float64 {
	norm := math.Sqrt(be.SumSquares(grads))
	if maxNorm > 0 && norm > maxNorm && !math.IsInf(norm, 0) && !math.IsNaN(norm) {
		be.Scale(float32(maxNorm/(norm+1e-6)), grads)
	}
	return norm
}

// Schedule maps a step number (from 0) to a learning rate.
type Schedule interface {
	LR(step int) float32
	String() string
}

// Constant is a fixed learning rate.
type Constant float32

// LR implements Schedule.
func (c Constant) LR(int) float32 { return float32(c) }
func (c Constant) String() string { return fmt.Sprintf("constant(%g)", float32(c)) }

// StepDecay multiplies the rate by Gamma every Every steps.
type StepDecay struct {
	Base  float32
	Every int
	Gamma float32
}

// LR implements Schedule.
func (s StepDecay) LR(step int) float32 {
	return s.Base * float32(math.Pow(float64(s.Gamma), float64(step/max(s.Every, 1))))
}
func (s StepDecay) String() string {
	return fmt.Sprintf("step(%g, every=%d, gamma=%g)", s.Base, s.Every, s.Gamma)
}

// Cosine anneals from Base to Min over Total steps (then stays at Min).
type Cosine struct {
	Base, Min float32
	Total     int
}

// LR implements Schedule.
func (c Cosine) LR(step int) float32 {
	if step >= c.Total {
		return c.Min
	}
	f := 0.5 * (1 + math.Cos(math.Pi*float64(step)/float64(c.Total)))
	return c.Min + (c.Base-c.Min)*float32(f)
}
func (c Cosine) String() string {
	return fmt.Sprintf("cosine(%g→%g over %d)", c.Base, c.Min, c.Total)
}

// Warmup ramps linearly from Base/Steps to the inner schedule over Steps
// steps, then follows the inner schedule shifted by Steps.
type Warmup struct {
	Steps int
	Inner Schedule
}

// LR implements Schedule.
func (w Warmup) LR(step int) float32 {
	if step < w.Steps {
		return w.Inner.LR(0) * float32(step+1) / float32(w.Steps)
	}
	return w.Inner.LR(step - w.Steps)
}
func (w Warmup) String() string { return fmt.Sprintf("warmup(%d)+%v", w.Steps, w.Inner) }

// LinearScaling returns the learning rate for a batch of size batch under
// the linear scaling rule of Goyal et al. 2017: lr grows with the batch.
func LinearScaling(baseLR float32, baseBatch, batch int) float32 {
	return baseLR * float32(batch) / float32(baseBatch)
}

// ErrSchedule reports a schedule spec that does not parse.
var ErrSchedule = errors.New("nn: bad schedule")

// ParseSchedule builds a schedule from a spec for a run of total steps:
// "constant", "step" (×0.1 every total/3 steps) or "step:EVERY,GAMMA",
// "cosine", and any of them after "warmup:N+" (N steps of linear warmup).
// Errors wrap ErrSchedule.
func ParseSchedule(s string, base float32, total int) (Schedule, error) {
	terms, err := spec.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSchedule, err)
	}
	warmup := -1
	if terms[0].Name == "warmup" {
		r := terms[0].Reader()
		r.Require("steps")
		warmup = r.Int("steps", 0, 0, math.MaxInt32)
		if err := r.Done(); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrSchedule, err)
		}
		terms = terms[1:]
		total = max(total-warmup, 1)
	}
	if len(terms) != 1 {
		return nil, fmt.Errorf("%w: %q: want [warmup:N+]constant|step[:EVERY,GAMMA]|cosine", ErrSchedule, s)
	}
	t := terms[0]
	r := t.Reader()
	var out Schedule
	switch t.Name {
	case "constant", "const":
		out = Constant(base)
	case "cosine":
		out = Cosine{Base: base, Total: max(total, 1)}
	case "step":
		st := StepDecay{Base: base, Every: max(total/3, 1), Gamma: 0.1}
		if len(t.Args) > 0 {
			r.Require("every")
			st.Every = r.Int("every", st.Every, 1, math.MaxInt32)
			r.Require("gamma")
			st.Gamma = float32(r.Float("gamma", 0.1, spec.Positive()))
		}
		out = st
	default:
		return nil, fmt.Errorf("%w: %w", ErrSchedule, t.Errorf("unknown schedule %q (want constant, step[:EVERY,GAMMA], cosine, or warmup:N+…)", t.Name))
	}
	if err := r.Done(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSchedule, err)
	}
	if warmup >= 0 {
		out = Warmup{Steps: warmup, Inner: out}
	}
	return out, nil
}
