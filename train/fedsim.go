package train

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/starling-ml/starling/aggregate"
	"github.com/starling-ml/starling/aggregate/aggtest"
	"github.com/starling-ml/starling/data"
	"github.com/starling-ml/starling/peerid"
)

// FedSimConfig configures a federation of many clients simulated in one
// process: every client is a full peer (its own Worker and all-reduce
// Runner) on an in-memory network.
type FedSimConfig struct {
	Clients   int
	Partition string // "iid", "shards" (McMahan's 2 label shards each) or "dirichlet:α"
	Fed       FedConfig
	Worker    WorkerConfig
	// Target stops the run once the global model reaches this test
	// accuracy (0: run all rounds).
	Target float64
	// EvalEvery evaluates the global model every that many rounds (1).
	EvalEvery int
	// Net shapes the in-memory links.
	Net aggtest.Config
	// Seed drives the partition.
	Seed uint64
}

// FedSimResult is the outcome of a simulated federation.
type FedSimResult struct {
	RoundsToTarget int           `json:"rounds_to_target"` // -1 if not reached
	TimeToTarget   float64       `json:"seconds_to_target"`
	FinalAccuracy  float64       `json:"final_accuracy"`
	Rounds         int           `json:"rounds"`
	WallS          float64       `json:"wall_s"`
	Curve          []RoundPoint  `json:"curve"`
	Strategy       string        `json:"strategy"`
	Clients        int           `json:"clients"`
	Fraction       float64       `json:"fraction"`
	Partition      string        `json:"partition"`
	Elapsed        time.Duration `json:"-"`
}

// RoundPoint is the global model's test accuracy after a round.
type RoundPoint struct {
	Round    int     `json:"round"`
	Seconds  float64 `json:"seconds"`
	Accuracy float64 `json:"accuracy"`
	Loss     float64 `json:"loss"`
}

// Partition splits train between clients as spec says.
func Partition(train *data.Set, clients int, spec string, seed uint64) ([][]int, error) {
	switch {
	case spec == "iid":
		return data.IID(train.Len(), clients, seed)
	case spec == "shards":
		return data.Shards(train.Y, clients, 2, seed)
	default:
		var alpha float64
		if _, err := fmt.Sscanf(spec, "dirichlet:%g", &alpha); err != nil {
			return nil, fmt.Errorf("train: unknown partition %q (want iid, shards or dirichlet:α)", spec)
		}
		return data.Dirichlet(train.Y, clients, alpha, 10, seed)
	}
}

// SimulateFederation runs a federation of cfg.Clients peers over trainSet
// and evaluates the global model on testSet after every EvalEvery rounds.
// progress, if not nil, sees every evaluated point.
func SimulateFederation(ctx context.Context, cfg FedSimConfig, trainSet, testSet *data.Set, progress func(RoundPoint)) (*FedSimResult, error) {
	if cfg.Clients <= 0 {
		return nil, fmt.Errorf("train: need at least one client")
	}
	if err := cfg.Fed.Validate(); err != nil {
		return nil, err
	}
	if cfg.EvalEvery <= 0 {
		cfg.EvalEvery = 1
	}
	parts, err := Partition(trainSet, cfg.Clients, cfg.Partition, cfg.Seed)
	if err != nil {
		return nil, err
	}
	ids := make([]string, cfg.Clients)
	for i := range ids {
		ids[i] = fmt.Sprintf("client%03d", i)
	}
	netw := aggtest.NewNetwork(cfg.Net)
	board := NewStateBoard()
	acfg := aggregate.DefaultConfig()
	eval, err := NewWorker(cfg.Worker, testSet.Head(1))
	if err != nil {
		return nil, err
	}

	res := &FedSimResult{RoundsToTarget: -1, Strategy: cfg.Fed.Strategy, Clients: cfg.Clients, Fraction: cfg.Fed.Fraction, Partition: cfg.Partition}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	var mu sync.Mutex
	evaluated := map[uint64]bool{}
	onRound := func(ri RoundInfo) bool {
		mu.Lock()
		defer mu.Unlock()
		if evaluated[ri.Round] {
			return false
		}
		evaluated[ri.Round] = true
		if int(ri.Round)%cfg.EvalEvery != 0 && int(ri.Round) != cfg.Fed.Rounds {
			return false
		}
		copy(eval.Model.Params, ri.Global)
		loss, acc := eval.Evaluate(testSet)
		pt := RoundPoint{Round: int(ri.Round), Seconds: time.Since(start).Seconds(), Accuracy: acc, Loss: loss}
		res.Curve = append(res.Curve, pt)
		res.FinalAccuracy = acc
		res.Rounds = int(ri.Round)
		if progress != nil {
			progress(pt)
		}
		if cfg.Target > 0 && acc >= cfg.Target && res.RoundsToTarget < 0 {
			res.RoundsToTarget = int(ri.Round)
			res.TimeToTarget = pt.Seconds
			cancel()
			return true
		}
		return false
	}
	var wg sync.WaitGroup
	errs := make([]error, cfg.Clients)
	for i, id := range ids {
		ep := netw.Join(peerid.ID(id))
		r, err := aggregate.NewRunner(peerid.ID(id), ep, acfg)
		if err != nil {
			return nil, err
		}
		wc := cfg.Worker
		wc.DataSeed = cfg.Seed*1000 + uint64(i) + 1
		w, err := NewWorker(wc, trainSet.Subset(parts[i]))
		if err != nil {
			return nil, fmt.Errorf("client %d: %w", i, err)
		}
		net := &RunnerNet{ID: id, Runner: r, Board: board, Static: ids}
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			errs[i] = Federated(ctx, w, net, cfg.Fed, nil, onRound)
		}(i)
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	res.WallS = res.Elapsed.Seconds()
	for _, err := range errs {
		if err != nil && !errors.Is(err, context.Canceled) {
			return res, err
		}
	}
	return res, nil
}
