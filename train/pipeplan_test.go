package train

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

func opsString(ops []PipeOp) string {
	s := make([]string, len(ops))
	for i, o := range ops {
		s[i] = o.String()
	}
	return strings.Join(s, " ")
}

func TestPipeOpsTable(t *testing.T) {
	for _, tc := range []struct {
		sched              string
		stage, stages, mbs int
		want               string
	}{
		{PipeGPipe, 0, 2, 3, "F0 F1 F2 B0 B1 B2"},
		{PipeGPipe, 1, 2, 3, "F0 F1 F2 B0 B1 B2"},
		{Pipe1F1B, 0, 4, 6, "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5"},
		{Pipe1F1B, 1, 4, 6, "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5"},
		{Pipe1F1B, 3, 4, 6, "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5"},
		{Pipe1F1B, 0, 4, 2, "F0 F1 B0 B1"}, // fewer micro-batches than stages
		{Pipe1F1B, 0, 1, 3, "F0 B0 F1 B1 F2 B2"},
	} {
		ops, err := PipeOps(tc.sched, tc.stage, tc.stages, tc.mbs)
		if err != nil {
			t.Fatal(err)
		}
		if got := opsString(ops); got != tc.want {
			t.Errorf("%s stage %d/%d, %d micro-batches: %s, want %s", tc.sched, tc.stage, tc.stages, tc.mbs, got, tc.want)
		}
	}
}

// TestPipeOpsInvariants checks every schedule for every small shape: each
// micro-batch gets one F then one B, F and B each in micro-batch order,
// 1F1B holds at most K−s activations (GPipe M), no deadlock, and the
// bubble with equal stages is (K−1)/(M+K−1) for both.
func TestPipeOpsInvariants(t *testing.T) {
	for _, sched := range []string{PipeGPipe, Pipe1F1B} {
		for k := 1; k <= 4; k++ {
			for m := 1; m <= 9; m++ {
				for s := range k {
					ops, err := PipeOps(sched, s, k, m)
					if err != nil {
						t.Fatal(err)
					}
					if len(ops) != 2*m {
						t.Fatalf("%s %d/%d m=%d: %d ops", sched, s, k, m, len(ops))
					}
					nextF, nextB, held, most := 0, 0, 0, 0
					for _, o := range ops {
						if o.Backward {
							if o.MB != nextB || o.MB >= nextF {
								t.Fatalf("%s %d/%d m=%d: %v out of order in %s", sched, s, k, m, o, opsString(ops))
							}
							nextB++
							held--
						} else {
							if o.MB != nextF {
								t.Fatalf("%s %d/%d m=%d: %v out of order in %s", sched, s, k, m, o, opsString(ops))
							}
							nextF++
							held++
							most = max(most, held)
						}
					}
					limit := m
					if sched == Pipe1F1B {
						limit = min(k-s, m)
					}
					if most > limit {
						t.Errorf("%s %d/%d m=%d: %d activations in flight, want ≤ %d", sched, s, k, m, most, limit)
					}
				}
				for _, bwd := range []float64{1, 2} {
					sim, err := SimulatePipe(sched, k, m, 1, bwd)
					if err != nil {
						t.Fatal(err)
					}
					want := PipeBubbleBound(k, m)
					if math.Abs(sim.Bubble-want) > 1e-9 {
						t.Errorf("%s k=%d m=%d bwd=%v: bubble %.4f, want %.4f", sched, k, m, bwd, sim.Bubble, want)
					}
				}
			}
		}
	}
}

func TestSimulatePipeDeadlock(t *testing.T) {
	if _, err := SimulatePipe("gpipe", 2, 0, 1, 1); err == nil {
		t.Fatal("0 micro-batches accepted")
	}
	if _, err := PipeOps("zigzag", 0, 2, 2); err == nil || !strings.Contains(err.Error(), "zigzag") {
		t.Fatalf("unknown schedule: %v", err)
	}
}

func ExamplePipeOps() {
	for s := range 3 {
		ops, _ := PipeOps(Pipe1F1B, s, 3, 4)
		fmt.Printf("stage %d: %s\n", s, opsString(ops))
	}
	// Output:
	// stage 0: F0 F1 F2 B0 F3 B1 B2 B3
	// stage 1: F0 F1 B0 F2 B1 F3 B2 B3
	// stage 2: F0 B0 F1 B1 F2 B2 F3 B3
}
