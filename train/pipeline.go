package train

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/starling-ml/starling/data"
	"github.com/starling-ml/starling/device"
	"github.com/starling-ml/starling/nn"
)

// ErrPipeline reports a pipeline that cannot go on: a neighbour stage
// that sent nothing within the deadline, or a message that does not fit.
var ErrPipeline = errors.New("train: pipeline")

// PipeKind says what a PipeMsg carries.
type PipeKind uint8

const (
	// PipeAct is a forward activation, sent to the next stage (as is
	// PipeNormTotal; the other kinds go to the previous one).
	PipeAct PipeKind = iota + 1
	// PipeGrad is the gradient of an activation, sent to the previous
	// stage.
	PipeGrad
	// PipeNorm is the sum of the squared gradients of a stage and those
	// after it (one value), sent to the previous stage, for clipping by
	// the global norm.
	PipeNorm
	// PipeNormTotal is the whole model's squared gradient norm (one
	// value), which the first stage sends down the pipeline.
	PipeNormTotal
	// PipeEval is an activation of an evaluation batch (Pipeline.Evaluate),
	// sent to the next stage; MB numbers the batch and Total counts them.
	PipeEval
	// PipeEvalDone goes from the last stage back to the first when an
	// evaluation is over, so that no stage leaves (or goes on) while its
	// sends may still be on the way.
	PipeEvalDone
)

// Backward reports whether messages of kind k go to the previous stage.
func (k PipeKind) Backward() bool { return k == PipeGrad || k == PipeNorm || k == PipeEvalDone }

func (k PipeKind) String() string {
	switch k {
	case PipeAct:
		return "activation"
	case PipeGrad:
		return "gradient"
	case PipeNorm, PipeNormTotal:
		return "gradient norm"
	case PipeEval:
		return "evaluation activation"
	case PipeEvalDone:
		return "end of the evaluation"
	}
	return fmt.Sprintf("PipeKind(%d)", uint8(k))
}

// PipeMsg is one micro-batch's tensor between neighbour stages.
type PipeMsg struct {
	Kind PipeKind
	// Step is the optimiser step (Worker.Steps before it) and MB the
	// micro-batch within it.
	Step uint64
	MB   int
	// N is the micro-batch's samples; Total the step's (so the last stage
	// can weigh each micro-batch's loss before it has seen them all).
	N, Total int
	// Data is the activation (N × the stage's In or Out size) or its
	// gradient.
	Data []float32
	// Y is the micro-batch's targets; activations carry them to the last
	// stage, which scores them.
	Y []int32
}

// PipeLink is a stage's connection to its neighbours: activations go to
// the next stage, gradients to the previous one. Send does not retain m
// or its slices once it returns; Recv's message is the caller's. Both
// honour ctx's deadline, which the driver always sets. Safe for use by
// one stage's driver (one call at a time).
type PipeLink interface {
	// Send delivers m to the previous stage if m.Kind.Backward(), else
	// to the next one.
	Send(ctx context.Context, m *PipeMsg) error
	// Recv waits for the message of kind for (step, mb): from the next
	// stage if kind.Backward(), else from the previous one.
	Recv(ctx context.Context, kind PipeKind, step uint64, mb int) (*PipeMsg, error)
}

// PipeConfig configures a pipeline stage.
type PipeConfig struct {
	// Micro is M, the micro-batches a step's batch is split into: more
	// shrink the bubble ((K−1)/(M+K−1)) but make each GEMM smaller. The
	// batch must hold at least M samples.
	Micro int
	// Schedule is PipeGPipe or Pipe1F1B.
	Schedule string
	// Timeout bounds every wait on a neighbour: a stage that sent nothing
	// for this long is taken for dead and the pipeline stops.
	Timeout time.Duration
	// EvalBatch is the samples per batch of Evaluate (0: EvalBatch(ds)).
	EvalBatch int
	// Replica numbers this pipeline among several that train the same
	// model on the same data (pipeline × data parallelism): the first
	// stage of replica r draws its batches with the worker's data seed
	// mixed with r, so the replicas see different batches.
	Replica int
	// Average, when set, replaces the stage's gradient of a step (summed
	// over the micro-batches, before clipping) by its mean over the
	// replicas' same stage; it must return an error unless every replica
	// took part. Nil for a single pipeline.
	Average func(ctx context.Context, step uint64, grads []float32) error `json:"-"`
}

// DefaultPipeConfig returns 4 micro-batches under 1F1B with 30 s to hear
// from a neighbour (a CharLM stage step on a loaded 2-core machine takes
// under a few seconds).
func DefaultPipeConfig() PipeConfig {
	return PipeConfig{Micro: 4, Schedule: Pipe1F1B, Timeout: 30 * time.Second}
}

// Validate checks the config.
func (c PipeConfig) Validate() error {
	if c.Micro < 1 {
		return fmt.Errorf("%w: %d micro-batches, want ≥ 1", ErrPipeline, c.Micro)
	}
	if c.Schedule != PipeGPipe && c.Schedule != Pipe1F1B {
		return fmt.Errorf("%w: unknown schedule %q (want %s or %s)", ErrPipeline, c.Schedule, PipeGPipe, Pipe1F1B)
	}
	if c.Timeout <= 0 {
		return fmt.Errorf("%w: timeout %v, want > 0", ErrPipeline, c.Timeout)
	}
	if c.EvalBatch < 0 {
		return fmt.Errorf("%w: evaluation batch %d, want ≥ 0", ErrPipeline, c.EvalBatch)
	}
	return nil
}

// PipeStep is what one step of a stage did.
type PipeStep struct {
	// Loss is the step's mean training loss (the last stage only; NaN
	// elsewhere) and Correct its correct predictions.
	Loss    float64
	Correct int
	// Samples is the step's batch.
	Samples int
	// Busy is the time the stage computed; Wall the step's time at this
	// stage, waits included. 1 − Busy/Wall is the stage's idle share.
	Busy, Wall time.Duration
	// Recomputed counts the forwards run again to restore a micro-batch's
	// activations before its backward.
	Recomputed int
	// Averaging is the time Config.Average took (part of Wall, not Busy).
	Averaging time.Duration
}

// Pipeline is one stage of a pipeline-parallel model: it owns the stage's
// slice of the worker's model and optimiser state and drives the stage's
// schedule over a PipeLink. The first stage draws the batches from the
// worker's shard; the last scores them. Each stage keeps the input of
// every micro-batch in flight and runs its forward again before the
// backward when another micro-batch's forward ran since (GPipe's
// re-materialisation); 1F1B's last stage never needs to. Not safe for
// concurrent use.
type Pipeline struct {
	cfg   PipeConfig
	w     *Worker
	st    *nn.Stage
	link  PipeLink
	ops   []PipeOp
	acc   []float32
	in    [][]float32 // per micro-batch: the stage's input
	ys    [][]int32
	ns    []int
	dlog  [][]float32 // the last stage's logit gradients
	total int
	skip  int // batches the first stage passes over before its first step
}

// NewPipeline makes w's model's stage st (from w.Model.Stages) a pipeline
// stage over link.
func NewPipeline(w *Worker, st *nn.Stage, link PipeLink, cfg PipeConfig) (*Pipeline, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if st.Model() != w.Model {
		return nil, fmt.Errorf("%w: the stage is not of the worker's model", ErrPipeline)
	}
	if st.First() && w.cfg.Batch < cfg.Micro {
		return nil, fmt.Errorf("%w: batch %d cannot be split into %d micro-batches", ErrPipeline, w.cfg.Batch, cfg.Micro)
	}
	ops, err := PipeOps(cfg.Schedule, st.Index, st.Count, cfg.Micro)
	if err != nil {
		return nil, err
	}
	if cfg.Replica < 0 {
		return nil, fmt.Errorf("%w: replica %d", ErrPipeline, cfg.Replica)
	}
	if cfg.Replica > 0 {
		w.it = data.NewIterator(w.shard, w.cfg.Batch, w.cfg.DataSeed^device.Hash64(pipeReplicaSalt, uint64(cfg.Replica)))
	}
	w.it.DropLast = true // every step's batch splits into Micro parts
	return &Pipeline{skip: w.Steps,
		cfg: cfg, w: w, st: st, link: link, ops: ops, acc: device.Alloc(w.Model.Backend(), len(st.Params)),
		in: make([][]float32, cfg.Micro), ys: make([][]int32, cfg.Micro), ns: make([]int, cfg.Micro),
		dlog: make([][]float32, cfg.Micro),
	}, nil
}

// pipeReplicaSalt mixes a replica's number into its data seed.
const pipeReplicaSalt = 0x7069706572706c63

// Stage returns the model stage the pipeline runs.
func (p *Pipeline) Stage() *nn.Stage { return p.st }

// wait runs f with the config's deadline and names what was awaited when
// it fails.
func (p *Pipeline) wait(ctx context.Context, what string, f func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	if err := f(ctx); err != nil {
		if ctx.Err() != nil && errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("%w: stage %d/%d: %s: nothing within %v (is that stage down, or at another step?): %w", ErrPipeline, p.st.Index, p.st.Count, what, p.cfg.Timeout, err)
		}
		return fmt.Errorf("%w: stage %d/%d: %s: %w", ErrPipeline, p.st.Index, p.st.Count, what, err)
	}
	return nil
}

// Step runs one optimiser step of the stage: its schedule's forward and
// backward passes over the step's micro-batches, then the optimiser on
// the stage's parameters with their gradients summed over the
// micro-batches (which the last stage weighs by their share of the batch,
// so the sum is the batch's gradient). Every stage of the pipeline must
// be at the same step (Worker.Steps).
func (p *Pipeline) Step(ctx context.Context) (PipeStep, error) {
	if err := ctx.Err(); err != nil {
		return PipeStep{}, err
	}
	start := time.Now()
	var busy time.Duration
	step := uint64(p.w.Steps)
	st := p.st
	res := PipeStep{Loss: math.NaN()}
	var x []float32
	var y []int32
	if st.First() {
		// A stage resumed at step s draws the batch an unbroken run
		// would: the data order depends on the data seed alone.
		for ; p.skip > 0; p.skip-- {
			if !p.w.it.Next() && !p.w.it.Next() {
				return res, fmt.Errorf("%w: shard smaller than one batch of %d", ErrPipeline, p.w.cfg.Batch)
			}
		}
		if !p.w.it.Next() && !p.w.it.Next() {
			return res, fmt.Errorf("%w: shard smaller than one batch of %d", ErrPipeline, p.w.cfg.Batch)
		}
		x, y = p.w.it.Batch()
		p.total = len(y) / p.w.Model.Targets()
	}
	if st.Last() {
		res.Loss = 0
	}
	clear(p.acc)
	cur := -1 // the micro-batch whose activations the layers hold
	draw := func(mb int) uint64 { return step<<16 | uint64(mb) }
	for _, op := range p.ops {
		mb := op.MB
		if !op.Backward {
			var n int
			if st.First() {
				d, tg := st.In.Size(), p.w.Model.Targets()
				lo, hi := mb*p.total/p.cfg.Micro, (mb+1)*p.total/p.cfg.Micro
				n = hi - lo
				p.in[mb] = append(p.in[mb][:0], x[lo*d:hi*d]...)
				p.ys[mb] = append(p.ys[mb][:0], y[lo*tg:hi*tg]...)
			} else {
				var m *PipeMsg
				err := p.wait(ctx, fmt.Sprintf("activation of step %d micro-batch %d from stage %d", step, mb, st.Index-1), func(ctx context.Context) (err error) {
					m, err = p.link.Recv(ctx, PipeAct, step, mb)
					return err
				})
				if err != nil {
					return res, err
				}
				if err := p.check(m, PipeAct, step, mb, st.In.Size()); err != nil {
					return res, err
				}
				n, p.total = m.N, m.Total
				p.in[mb], p.ys[mb] = m.Data, m.Y
			}
			p.ns[mb] = n
			t0 := time.Now()
			out := st.Forward(p.in[mb], n, true, draw(mb))
			cur = mb
			if st.Last() {
				l, c, dl := st.Loss(out, p.ys[mb], float32(n)/float32(p.total))
				res.Loss += l * float64(n) / float64(p.total)
				res.Correct += c
				p.dlog[mb] = append(p.dlog[mb][:0], dl...)
			}
			busy += time.Since(t0)
			if !st.Last() {
				m := &PipeMsg{Kind: PipeAct, Step: step, MB: mb, N: n, Total: p.total, Data: out, Y: p.ys[mb]}
				if err := p.wait(ctx, fmt.Sprintf("sending the activation of step %d micro-batch %d to stage %d", step, mb, st.Index+1), func(ctx context.Context) error {
					return p.link.Send(ctx, m)
				}); err != nil {
					return res, err
				}
			}
			continue
		}
		n := p.ns[mb]
		var dy []float32
		if st.Last() {
			dy = p.dlog[mb]
		} else {
			var m *PipeMsg
			err := p.wait(ctx, fmt.Sprintf("gradient of step %d micro-batch %d from stage %d", step, mb, st.Index+1), func(ctx context.Context) (err error) {
				m, err = p.link.Recv(ctx, PipeGrad, step, mb)
				return err
			})
			if err != nil {
				return res, err
			}
			if err := p.check(m, PipeGrad, step, mb, st.Out.Size()); err != nil {
				return res, err
			}
			dy = m.Data
		}
		t0 := time.Now()
		if cur != mb {
			st.Forward(p.in[mb], n, true, draw(mb))
			res.Recomputed++
		}
		dx := st.Backward(dy, n)
		cur = -1
		p.w.Model.Backend().Axpy(1, st.Grads, p.acc)
		busy += time.Since(t0)
		if !st.First() {
			m := &PipeMsg{Kind: PipeGrad, Step: step, MB: mb, N: n, Total: p.total, Data: dx}
			if err := p.wait(ctx, fmt.Sprintf("sending the gradient of step %d micro-batch %d to stage %d", step, mb, st.Index-1), func(ctx context.Context) error {
				return p.link.Send(ctx, m)
			}); err != nil {
				return res, err
			}
		}
	}
	if st.Last() && (math.IsNaN(res.Loss) || math.IsInf(res.Loss, 0)) {
		return res, fmt.Errorf("%w: loss is %v at step %d", ErrDiverged, res.Loss, step+1)
	}
	if p.cfg.Average != nil {
		t0 := time.Now()
		if err := p.cfg.Average(ctx, step, p.acc); err != nil {
			return res, fmt.Errorf("%w: stage %d/%d: averaging step %d's gradient with the other pipelines: %w", ErrPipeline, st.Index, st.Count, step, err)
		}
		res.Averaging = time.Since(t0)
	}
	if p.w.cfg.ClipNorm > 0 {
		if err := p.clip(ctx, step); err != nil {
			return res, err
		}
	}
	t0 := time.Now()
	copy(st.Grads, p.acc)
	p.w.Opt.Step(st.Params, st.Grads, p.w.Sched.LR(p.w.Steps))
	p.w.Steps++
	p.w.Samples += p.total
	busy += time.Since(t0)
	res.Samples, res.Busy, res.Wall = p.total, busy, time.Since(start)
	return res, nil
}

// clip scales the step's gradient to the worker's ClipNorm by the norm of
// the whole model's gradient, as Worker.Grad does on one node: the squared
// norms are summed from the last stage to the first, which sends the
// total back down.
func (p *Pipeline) clip(ctx context.Context, step uint64) error {
	st, be := p.st, p.w.Model.Backend()
	sq := be.SumSquares(p.acc)
	one := func(kind PipeKind, from int) (float64, error) {
		var m *PipeMsg
		err := p.wait(ctx, fmt.Sprintf("%v of step %d from stage %d", kind, step, from), func(ctx context.Context) (err error) {
			m, err = p.link.Recv(ctx, kind, step, 0)
			return err
		})
		if err != nil {
			return 0, err
		}
		if m == nil || m.Kind != kind || m.Step != step || len(m.Data) != 1 {
			return 0, fmt.Errorf("%w: stage %d: asked for the %v of step %d, got another message", ErrPipeline, st.Index, kind, step)
		}
		return float64(m.Data[0]), nil
	}
	send := func(kind PipeKind, v float64, to int) error {
		m := &PipeMsg{Kind: kind, Step: step, Data: []float32{float32(v)}}
		return p.wait(ctx, fmt.Sprintf("sending the %v of step %d to stage %d", kind, step, to), func(ctx context.Context) error {
			return p.link.Send(ctx, m)
		})
	}
	if !st.Last() {
		after, err := one(PipeNorm, st.Index+1)
		if err != nil {
			return err
		}
		sq += after
	}
	if !st.First() {
		if err := send(PipeNorm, sq, st.Index-1); err != nil {
			return err
		}
		var err error
		if sq, err = one(PipeNormTotal, st.Index-1); err != nil {
			return err
		}
	}
	if !st.Last() {
		if err := send(PipeNormTotal, sq, st.Index+1); err != nil {
			return err
		}
	}
	norm, most := math.Sqrt(sq), p.w.cfg.ClipNorm
	if math.IsNaN(norm) || math.IsInf(norm, 0) {
		return fmt.Errorf("%w: gradient norm is %v at step %d", ErrDiverged, norm, step+1)
	}
	if norm > most {
		be.Scale(float32(most/(norm+1e-6)), p.acc)
	}
	return nil
}

// check reports a message that is not the one asked for or whose sizes
// do not fit the stage (bytes from a peer: never a panic).
func (p *Pipeline) check(m *PipeMsg, kind PipeKind, step uint64, mb, size int) error {
	switch {
	case m == nil || m.Kind != kind || m.Step != step || m.MB != mb:
		return fmt.Errorf("%w: stage %d: asked for the %v of step %d micro-batch %d, got another message", ErrPipeline, p.st.Index, kind, step, mb)
	case m.N < 1 || m.Total < m.N || len(m.Data) != m.N*size:
		return fmt.Errorf("%w: stage %d: %v of step %d micro-batch %d holds %d values for %d samples of %d (batch %d)", ErrPipeline, p.st.Index, kind, step, mb, len(m.Data), m.N, size, m.Total)
	case kind == PipeGrad && m.N != p.ns[mb]:
		return fmt.Errorf("%w: stage %d: gradient of step %d micro-batch %d is for %d samples, the activation had %d", ErrPipeline, p.st.Index, step, mb, m.N, p.ns[mb])
	case kind == PipeAct && len(m.Y) != m.N*p.w.Model.Targets():
		return fmt.Errorf("%w: stage %d: activation of step %d micro-batch %d carries %d targets for %d samples", ErrPipeline, p.st.Index, step, mb, len(m.Y), m.N)
	}
	if kind == PipeAct && p.st.Last() {
		return p.targetsOK(m.Y)
	}
	return nil
}

// maxEvalBatches bounds the batches of one Evaluate (the links number
// them in 12 bits).
const maxEvalBatches = 4096

// Evaluate runs the samples of ds (the first stage's; the others pass
// nil) through the pipeline in evaluation mode, in batches of
// EvalBatch(ds) (at most 4096 of them), and returns the mean loss over
// every target and the accuracy, as Evaluate does on one node; only the
// last stage's figures are meaningful (the others return 0, 0). Every
// stage must call it at the same step, between two Steps. It returns on
// a stage once every later stage has received all it was sent, so a
// stage may stop after its last Evaluate.
func (p *Pipeline) Evaluate(ctx context.Context, ds data.Dataset) (loss, acc float64, err error) {
	st := p.st
	step := uint64(p.w.Steps)
	var x []float32
	var y []int32
	var idx []int
	n, batch, batches := 0, 0, 0
	if st.First() {
		if ds == nil || ds.Len() == 0 {
			return 0, 0, fmt.Errorf("%w: stage 0 has no evaluation data", ErrPipeline)
		}
		n, batch = ds.Len(), cmp.Or(p.cfg.EvalBatch, EvalBatch(ds))
		batch = max(batch, (n+maxEvalBatches-1)/maxEvalBatches)
		batches = (n + batch - 1) / batch
		x, y, idx = make([]float32, batch*st.In.Size()), make([]int32, batch*ds.Targets()), make([]int, batch)
	}
	var sum float64
	correct, targets := 0, 0
	for b := 0; b == 0 || b < batches; b++ {
		var k int
		var in []float32
		var ys []int32
		if st.First() {
			k = min(batch, n-b*batch)
			for j := range k {
				idx[j] = b*batch + j
			}
			ds.Batch(idx[:k], x[:k*st.In.Size()], y[:k*ds.Targets()])
			in, ys = x[:k*st.In.Size()], y[:k*ds.Targets()]
		} else {
			var m *PipeMsg
			err := p.wait(ctx, fmt.Sprintf("evaluation batch %d at step %d from stage %d", b, step, st.Index-1), func(ctx context.Context) (err error) {
				m, err = p.link.Recv(ctx, PipeEval, step, b)
				return err
			})
			if err != nil {
				return 0, 0, err
			}
			if m.Kind != PipeEval || m.Step != step || m.MB != b || m.N < 1 || m.Total < 1 || m.Total > maxEvalBatches ||
				len(m.Data) != m.N*st.In.Size() || len(m.Y) != m.N*p.w.Model.Targets() {
				return 0, 0, fmt.Errorf("%w: stage %d: evaluation batch %d at step %d does not fit (%d samples, %d values, %d targets)", ErrPipeline, st.Index, b, step, m.N, len(m.Data), len(m.Y))
			}
			k, in, ys, batches = m.N, m.Data, m.Y, m.Total
		}
		out := st.Forward(in, k, false, 0)
		if st.Last() {
			if err := p.targetsOK(ys); err != nil {
				return 0, 0, err
			}
			l, c, _ := st.Loss(out, ys, 1)
			sum += l * float64(len(ys))
			correct, targets = correct+c, targets+len(ys)
			continue
		}
		m := &PipeMsg{Kind: PipeEval, Step: step, MB: b, N: k, Total: batches, Data: out, Y: ys}
		if err := p.wait(ctx, fmt.Sprintf("sending evaluation batch %d at step %d to stage %d", b, step, st.Index+1), func(ctx context.Context) error {
			return p.link.Send(ctx, m)
		}); err != nil {
			return 0, 0, err
		}
	}
	if !st.Last() {
		err := p.wait(ctx, fmt.Sprintf("the end of the evaluation at step %d from stage %d", step, st.Index+1), func(ctx context.Context) error {
			m, err := p.link.Recv(ctx, PipeEvalDone, step, 0)
			if err == nil && (m == nil || m.Kind != PipeEvalDone || m.Step != step) {
				err = fmt.Errorf("another message")
			}
			return err
		})
		if err != nil {
			return 0, 0, err
		}
	}
	if !st.First() {
		m := &PipeMsg{Kind: PipeEvalDone, Step: step}
		if err := p.wait(ctx, fmt.Sprintf("sending the end of the evaluation at step %d to stage %d", step, st.Index-1), func(ctx context.Context) error {
			return p.link.Send(ctx, m)
		}); err != nil {
			return 0, 0, err
		}
	}
	if targets == 0 {
		return 0, 0, nil
	}
	return sum / float64(targets), float64(correct) / float64(targets), nil
}

// targetsOK reports a target outside the model's classes.
func (p *Pipeline) targetsOK(ys []int32) error {
	for _, c := range ys {
		if c < 0 || int(c) >= p.w.Model.Classes {
			return fmt.Errorf("%w: stage %d: target %d outside [0, %d)", ErrPipeline, p.st.Index, c, p.w.Model.Classes)
		}
	}
	return nil
}

// Worker returns the worker whose model and optimiser the stage trains.
func (p *Pipeline) Worker() *Worker { return p.w }
