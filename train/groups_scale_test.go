package train_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/starling-ml/starling/data"
	"github.com/starling-ml/starling/peerid"
	"github.com/starling-ml/starling/train"
)

// spreadNet is a train.Net that records every successful all-reduce's
// input and result by round, for the spread of the models before and
// after it.
type spreadNet struct {
	train.Net
	mu     *sync.Mutex
	before map[uint64][][]float32
	after  map[uint64][][]float32
	groups map[uint64]map[string]bool
}

func (n spreadNet) AllReduce(ctx context.Context, round uint64, group []peerid.ID, dst, src []float32, weight float64) ([]peerid.ID, error) {
	used, err := n.Net.AllReduce(ctx, round, group, dst, src, weight)
	if err == nil {
		n.mu.Lock()
		n.before[round] = append(n.before[round], slices.Clone(src))
		n.after[round] = append(n.after[round], slices.Clone(dst))
		if n.groups[round] == nil {
			n.groups[round] = map[string]bool{}
		}
		n.groups[round][fmt.Sprint(used)] = true
		n.mu.Unlock()
	}
	return used, err
}

// groupsRun runs FedAvg with n peers, every peer in every round, over the
// in-memory all-reduce (aggregate.Runner on aggtest: the code a swarm
// peer runs, without libp2p), and returns per round the spread before and
// after averaging, the number of groups, and every peer's final test
// accuracy.
func groupsRun(t *testing.T, n, groupSize, rounds int, tr, te *data.Set) (before, after []float64, groups []int, accs []float64) {
	shards, _ := data.IID(tr.Len(), n, 1)
	cfg := train.DefaultFedConfig()
	cfg.Rounds, cfg.Fraction, cfg.GroupSize, cfg.LocalEpochs = rounds, 1, groupSize, 1
	wcfg := train.DefaultWorkerConfig()
	wcfg.Model, wcfg.Optimizer, wcfg.Batch, wcfg.LR = "logreg", "sgd", 10, 0.05
	mu := &sync.Mutex{}
	sn := spreadNet{mu: mu, before: map[uint64][][]float32{}, after: map[uint64][][]float32{}, groups: map[uint64]map[string]bool{}}
	finals := runFedWrapped(t, n, shards, tr, cfg, wcfg, "", nil, func(_ peerid.ID, net train.Net) train.Net {
		s := sn
		s.Net = net
		return s
	})
	for r := 1; r <= rounds; r++ {
		before = append(before, spread(sn.before[uint64(r)]))
		after = append(after, spread(sn.after[uint64(r)]))
		groups = append(groups, len(sn.groups[uint64(r)]))
		if len(sn.after[uint64(r)]) != n {
			t.Fatalf("round %d: %d of %d peers averaged", r, len(sn.after[uint64(r)]), n)
		}
	}
	m, _ := train.NewWorker(wcfg, tr)
	for _, f := range finals {
		copy(m.Model.Params, f)
		_, a := m.Evaluate(te)
		accs = append(accs, a)
	}
	return before, after, groups, accs
}

// TestGroupsScale: STARLING_SCALE=N (e.g. 256) peers in bounded groups of
// 16 against one global group, FedAvg with logistic regression on MNIST:
// the spread each round's averaging leaves against (k−1)/(n−1), and the
// peers' final accuracy against the global group's. Long: only with the
// variable set (docs/results/groups256).
func TestGroupsScale(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("STARLING_SCALE"))
	if n == 0 {
		t.Skip("set STARLING_SCALE=256 to run")
	}
	rounds := 10
	if r, _ := strconv.Atoi(os.Getenv("STARLING_SCALE_ROUNDS")); r > 0 {
		rounds = r
	}
	tr, te := mnist(t)
	start := time.Now()
	_, _, _, accG := groupsRun(t, n, 0, rounds, tr, te)
	globalWall := time.Since(start)
	start = time.Now()
	before, after, groups, accs := groupsRun(t, n, 16, rounds, tr, te)
	groupWall := time.Since(start)
	fmt.Printf("%d peers, %d rounds; wall %v (one group) %v (groups of 16)\n", n, rounds, globalWall.Round(time.Second), groupWall.Round(time.Second))
	fmt.Println("| round | groups | spread before | spread after | after/before | theory (k−1)/(n−1) |")
	fmt.Println("|---:|---:|---:|---:|---:|---:|")
	for r := range before {
		fmt.Printf("| %d | %d | %.4g | %.4g | %.4f | %.4f |\n", r+1, groups[r], before[r], after[r], after[r]/before[r], float64(groups[r]-1)/float64(n-1))
	}
	mean := func(a []float64) float64 {
		var s float64
		for _, x := range a {
			s += x
		}
		return s / float64(len(a))
	}
	fmt.Printf("final test accuracy: one group %.4f; groups of 16 mean %.4f (min %.4f, max %.4f); Δ %+.2f pp\n",
		accG[0], mean(accs), slices.Min(accs), slices.Max(accs), 100*(mean(accs)-accG[0]))
	if d := mean(accs) - accG[0]; d < -0.005 || d > 0.005 {
		t.Errorf("groups of 16 end %.2f pp from one group", 100*d)
	}
	for r := range before {
		th := float64(groups[r]-1) / float64(n-1)
		if q := after[r] / before[r]; q > 1.5*th || q < th/1.5 {
			t.Errorf("round %d keeps %.4f of the spread, theory %.4f", r+1, q, th)
		}
	}
}
