package swarm

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/starling-ml/starling/data"
	"github.com/starling-ml/starling/nn"
	"github.com/starling-ml/starling/peerid"
	"github.com/starling-ml/starling/train"
)

// TestPipelineOverMocknet trains the tiny CharLM for two steps as a
// 3-stage 1F1B pipeline over libp2p streams on a mocknet (5 ms links) and
// checks the loss and every stage's gradient against a single node's to
// 1e-5; then a stage is cut off and its neighbours stop by the deadline.
func TestPipelineOverMocknet(t *testing.T) {
	cfgLM := nn.CharLMConfig{Vocab: 11, Context: 6, Dim: 8, Heads: 2, Layers: 2, MLPRatio: 2}
	r := rand.New(rand.NewPCG(7, 7))
	tok := make([]int32, 64*6+1)
	for i := range tok {
		tok[i] = int32(r.IntN(cfgLM.Vocab))
	}
	ds, err := data.NewWindows(tok, cfgLM.Vocab, cfgLM.Context, 0)
	if err != nil {
		t.Fatal(err)
	}
	worker := func() *train.Worker {
		w, err := train.NewWorker(train.WorkerConfig{Model: cfgLM.String(), Batch: 8, LR: 0.05, Optimizer: "momentum", ModelSeed: 3, DataSeed: 4}, ds,
			train.WithModel(func(seed uint64) (*nn.Model, error) { return nn.NewCharLM(cfgLM, seed) }))
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	const k = 3
	ps, mn := newSwarmNet(t, k)
	ids := make([]peerid.ID, k)
	for i, p := range ps {
		ids[i] = p.ID()
	}
	pcfg := train.PipeConfig{Micro: 4, Schedule: train.Pipe1F1B, Timeout: 2 * time.Second}
	pipes := make([]*train.Pipeline, k)
	byStage := make([]*Peer, k)
	sorted := peerid.Sorted(slices.Clone(ids))
	for _, p := range ps {
		s := slices.Index(sorted, p.ID())
		var prev, next peerid.ID
		if s > 0 {
			prev = sorted[s-1]
		}
		if s < k-1 {
			next = sorted[s+1]
		}
		link, err := NewPipeLink(p.Node, prev, next)
		if err != nil {
			t.Fatal(err)
		}
		w := worker()
		sts, err := w.Model.Stages(k)
		if err != nil {
			t.Fatal(err)
		}
		if pipes[s], err = train.NewPipeline(w, sts[s], link, pcfg); err != nil {
			t.Fatal(err)
		}
		byStage[s] = p
	}
	step := func() ([]train.PipeStep, []error) {
		res, errs := make([]train.PipeStep, k), make([]error, k)
		var wg sync.WaitGroup
		for i, p := range pipes {
			wg.Go(func() { res[i], errs[i] = p.Step(context.Background()) })
		}
		wg.Wait()
		return res, errs
	}
	ref := worker()
	for range 2 {
		want, _, err := ref.Grad(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		res, errs := step()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		if math.Abs(res[k-1].Loss-want) > 1e-5 {
			t.Errorf("pipeline loss %v, single node %v", res[k-1].Loss, want)
		}
		for s, p := range pipes {
			st := p.Stage()
			for i, g := range st.Grads {
				if d := math.Abs(float64(g - ref.Model.Grads[st.Offset+i])); d > 1e-5 {
					t.Fatalf("stage %d grad %d: %v, single node %v", s, i, g, ref.Model.Grads[st.Offset+i])
				}
			}
		}
		ref.Apply(8)
	}

	cutOff(t, mn, ps, byStage[2])
	start := time.Now()
	_, errs := step()
	if el := time.Since(start); el > 3*pcfg.Timeout {
		t.Errorf("stopping took %v, deadline %v", el, pcfg.Timeout)
	}
	if !errors.Is(errs[1], train.ErrPipeline) {
		t.Errorf("stage 1 after stage 2 was cut off: %v, want ErrPipeline", errs[1])
	}
	t.Logf("stage 1: %v", errs[1])
}

func TestPipeAssignDeclared(t *testing.T) {
	ps, _ := newSwarmNet(t, 3)
	ids := []peerid.ID{ps[0].ID(), ps[1].ID(), ps[2].ID()}
	declared := []int{2, 0, 1}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	type got struct {
		stage      int
		prev, next peerid.ID
		min        uint64
		err        error
	}
	res := make([]got, 3)
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Go(func() {
			pl, err := PipeAssign(ctx, p.Node, p.ID(), ids, 3, 1, declared[i], uint64(10+i))
			if err != nil {
				res[i] = got{err: err}
				return
			}
			res[i] = got{pl.Stage, pl.Prev, pl.Next, pl.MinStep(), nil}
		})
	}
	wg.Wait()
	want := []got{{2, ids[2], "", 10, nil}, {0, "", ids[2], 10, nil}, {1, ids[1], ids[0], 10, nil}}
	for i := range res {
		if res[i] != want[i] {
			t.Errorf("peer %d: %+v, want %+v", i, res[i], want[i])
		}
	}

	// Two peers claiming one stage: both see the clash.
	declared = []int{1, 1, 0}
	for i, p := range ps {
		wg.Go(func() {
			_, err := PipeAssign(ctx, p.Node, p.ID(), ids, 3, 1, declared[i], 0)
			res[i] = got{err: err}
		})
	}
	wg.Wait()
	for i := range 2 {
		if res[i].err == nil || !strings.Contains(res[i].err.Error(), "taken") {
			t.Errorf("peer %d declaring a taken stage: %v", i, res[i].err)
		}
	}
}

// TestPipeAssignReplicas places 4 peers by their sorted IDs in 2
// pipelines of 2 stages: rank r is stage r mod 2, and each stage's peers
// are numbered into pipelines by ID.
func TestPipeAssignReplicas(t *testing.T) {
	ps, _ := newSwarmNet(t, 4)
	ids := make([]peerid.ID, 4)
	for i, p := range ps {
		ids[i] = p.ID()
	}
	sorted := peerid.Sorted(slices.Clone(ids))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	places := make(map[peerid.ID]PipePlace)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Go(func() {
			pl, err := PipeAssign(ctx, p.Node, p.ID(), ids, 2, 2, -1, 5)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			places[p.ID()] = pl
			mu.Unlock()
		})
	}
	wg.Wait()
	for r, id := range sorted {
		pl := places[id]
		want := PipePlace{Stage: r % 2, Pipeline: r / 2, Replicas: []peerid.ID{sorted[r%2], sorted[r%2+2]}}
		if r%2 == 0 {
			want.Next = sorted[r+1]
		} else {
			want.Prev = sorted[r-1]
		}
		if pl.Stage != want.Stage || pl.Pipeline != want.Pipeline || pl.Prev != want.Prev || pl.Next != want.Next || !slices.Equal(pl.Replicas, want.Replicas) || pl.MinStep() != 5 {
			t.Errorf("rank %d: %+v, want %+v", r, pl, want)
		}
	}
}
