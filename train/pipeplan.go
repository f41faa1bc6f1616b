package train

import (
	"fmt"
	"math"
)

// The pipeline schedules PipeOps knows.
const (
	// PipeGPipe runs every micro-batch's forward, then every backward
	// (Huang et al. 2019): M activations in flight per stage.
	PipeGPipe = "gpipe"
	// Pipe1F1B is PipeDream-Flush's one-forward-one-backward order
	// (Narayanan et al. 2021): stage s runs K−s−1 forwards to fill the
	// pipe, then alternates forward and backward, then drains; at most
	// K−s activations in flight, the same bubble as GPipe.
	Pipe1F1B = "1f1b"
)

// PipeOp is one operation of a pipeline stage in a step: the forward or
// the backward pass of one micro-batch.
type PipeOp struct {
	Backward bool
	MB       int
}

func (o PipeOp) String() string {
	if o.Backward {
		return fmt.Sprintf("B%d", o.MB)
	}
	return fmt.Sprintf("F%d", o.MB)
}

// PipeOps returns the order in which stage runs its forward and backward
// passes over micro micro-batches in a pipeline of stages stages under
// schedule (PipeGPipe or Pipe1F1B). It is pure. Every micro-batch gets
// its F before its B, and micro-batches go through each kind of pass in
// order, so the stages' orders never wait on one another in a cycle.
func PipeOps(schedule string, stage, stages, micro int) ([]PipeOp, error) {
	if stages < 1 || stage < 0 || stage >= stages || micro < 1 {
		return nil, fmt.Errorf("train: pipeline stage %d of %d with %d micro-batches", stage, stages, micro)
	}
	ops := make([]PipeOp, 0, 2*micro)
	switch schedule {
	case PipeGPipe:
		for i := range micro {
			ops = append(ops, PipeOp{MB: i})
		}
		for i := range micro {
			ops = append(ops, PipeOp{Backward: true, MB: i})
		}
	case Pipe1F1B:
		warm := min(stages-stage-1, micro)
		for i := range warm {
			ops = append(ops, PipeOp{MB: i})
		}
		for j := range micro - warm {
			ops = append(ops, PipeOp{MB: warm + j}, PipeOp{Backward: true, MB: j})
		}
		for j := micro - warm; j < micro; j++ {
			ops = append(ops, PipeOp{Backward: true, MB: j})
		}
	default:
		return nil, fmt.Errorf("train: unknown pipeline schedule %q (want %s or %s)", schedule, PipeGPipe, Pipe1F1B)
	}
	return ops, nil
}

// PipeBubbleBound is the idle share of a pipeline of k stages over m
// micro-batches with every stage equally fast: (k−1)/(m+k−1).
func PipeBubbleBound(k, m int) float64 { return float64(k-1) / float64(m+k-1) }

// PipeSim is what SimulatePipe found.
type PipeSim struct {
	// Makespan is the time from the first forward to the last backward.
	Makespan float64
	// Bubble is the idle share of the stages over the makespan:
	// 1 − Σ busy / (stages × makespan).
	Bubble float64
	// InFlight[s] is the most micro-batches stage s held between their
	// forward and their backward.
	InFlight []int
}

// SimulatePipe runs the schedule's ops on stages stages with every
// forward taking fwd and every backward bwd time units and messages
// taking none, and reports the makespan, the bubble and the activations
// held. It fails if the stages' orders deadlock. It is pure.
func SimulatePipe(schedule string, stages, micro int, fwd, bwd float64) (PipeSim, error) {
	ops := make([][]PipeOp, stages)
	for s := range ops {
		var err error
		if ops[s], err = PipeOps(schedule, s, stages, micro); err != nil {
			return PipeSim{}, err
		}
	}
	fDone := make([][]float64, stages) // finish times, NaN until run
	bDone := make([][]float64, stages)
	for s := range stages {
		fDone[s], bDone[s] = nanSlice(micro), nanSlice(micro)
	}
	next := make([]int, stages)
	free := make([]float64, stages)
	held := make([]int, stages)
	sim := PipeSim{InFlight: make([]int, stages)}
	busy := 0.0
	for left := stages * 2 * micro; left > 0; {
		progressed := false
		for s := range stages {
			for next[s] < len(ops[s]) {
				op := ops[s][next[s]]
				ready := 0.0
				switch {
				case !op.Backward && s > 0:
					ready = fDone[s-1][op.MB]
				case op.Backward && s < stages-1:
					ready = bDone[s+1][op.MB]
				}
				if math.IsNaN(ready) {
					break
				}
				start := max(free[s], ready)
				if op.Backward {
					free[s] = start + bwd
					bDone[s][op.MB] = free[s]
					held[s]--
					busy += bwd
				} else {
					free[s] = start + fwd
					fDone[s][op.MB] = free[s]
					held[s]++
					sim.InFlight[s] = max(sim.InFlight[s], held[s])
					busy += fwd
				}
				next[s]++
				left--
				progressed = true
			}
		}
		if !progressed {
			return sim, fmt.Errorf("train: pipeline schedule %s deadlocks with %d stages and %d micro-batches", schedule, stages, micro)
		}
	}
	for s := range stages {
		sim.Makespan = max(sim.Makespan, free[s])
	}
	sim.Bubble = 1 - busy/(float64(stages)*sim.Makespan)
	return sim, nil
}

func nanSlice(n int) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = math.NaN()
	}
	return v
}
