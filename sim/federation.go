package sim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/starling-ml/starling/data"
	"github.com/starling-ml/starling/peerid"
	"github.com/starling-ml/starling/train"
)

// FedConfig configures a federation simulated in one process: Clients
// peers on the in-memory libp2p network, each a swarm.Peer as `peer run`
// builds it, running train.Federated round by round.
type FedConfig struct {
	Clients   int
	Partition string // "iid", "shards" (McMahan's 2 label shards each) or "dirichlet:α"
	Fed       train.FedConfig
	Worker    train.WorkerConfig
	// Target stops the run once the global model reaches this test
	// accuracy (0: run all rounds).
	Target float64
	// EvalEvery evaluates the global model every that many rounds (1).
	EvalEvery int
	// Bandwidth (bytes/s, 0: unlimited) and Latency shape every link.
	Bandwidth float64
	Latency   time.Duration
	// Seed drives the partition and the peers' identities.
	Seed uint64
	// Log, if not nil, receives the peers' logs.
	Log *slog.Logger
	// Consensus measures, every round, the spread of the participants'
	// models before their all-reduce (the local models) and after it (the
	// groups' results), and evaluates every participant's final model
	// (FedResult.Consensus, FinalMean, FinalMin): with bounded groups
	// (Fed.GroupSize) the groups' models differ.
	Consensus bool
	// Events, if not nil, receives every peer's train events (joins,
	// catch-ups, failed rounds and why) as they happen; it must be safe
	// for concurrent use and must not block.
	Events func(train.Event)
}

// FedResult is the outcome of a simulated federation.
type FedResult struct {
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
	GroupSize      int           `json:"group_size"`
	Elapsed        time.Duration `json:"-"`
	// With FedConfig.Consensus: the spread of each round, and the mean and
	// lowest test accuracy of the participants' final models.
	Consensus []ConsensusPoint `json:"consensus,omitempty"`
	FinalMean float64          `json:"final_mean_accuracy,omitempty"`
	FinalMin  float64          `json:"final_min_accuracy,omitempty"`
}

// ConsensusPoint is the spread of one round's models: the mean squared
// distance of the participants' vectors to their mean, before the round's
// all-reduce (the local models) and after it. Ratio is After/Before; one
// round of averaging in k random groups of n peers leaves (k−1)/(n−1) of
// the spread in expectation (Theory).
type ConsensusPoint struct {
	Round        int     `json:"round"`
	Participants int     `json:"participants"`
	Groups       int     `json:"groups"`
	Before       float64 `json:"before"`
	After        float64 `json:"after"`
	Ratio        float64 `json:"ratio"`
	Theory       float64 `json:"theory"`
}

// spreadAcc accumulates vectors for their mean squared distance to their
// mean; it is safe for concurrent use.
type spreadAcc struct {
	mu     sync.Mutex
	rounds map[uint64]*[2]moments // before, after
}

type moments struct {
	n      int
	sum    []float64
	sumSq  float64
	groups map[string]bool
}

func (a *spreadAcc) add(round uint64, after bool, v []float32, group string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	r := a.rounds[round]
	if r == nil {
		r = &[2]moments{}
		a.rounds[round] = r
	}
	m := &r[0]
	if after {
		m = &r[1]
	}
	if m.sum == nil {
		m.sum, m.groups = make([]float64, len(v)), map[string]bool{}
	}
	m.n++
	m.groups[group] = true
	for i, x := range v {
		m.sum[i] += float64(x)
		m.sumSq += float64(x) * float64(x)
	}
}

func (m *moments) spread() float64 {
	if m.n == 0 {
		return 0
	}
	var sq float64
	for _, s := range m.sum {
		sq += s * s
	}
	return max(0, m.sumSq/float64(m.n)-sq/float64(m.n*m.n))
}

func (a *spreadAcc) points() []ConsensusPoint {
	var out []ConsensusPoint
	for r, m := range a.rounds {
		p := ConsensusPoint{Round: int(r), Participants: m[1].n, Groups: len(m[1].groups), Before: m[0].spread(), After: m[1].spread()}
		if p.Before > 0 {
			p.Ratio = p.After / p.Before
		}
		if p.Participants > 1 {
			p.Theory = float64(p.Groups-1) / float64(p.Participants-1)
		}
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b ConsensusPoint) int { return a.Round - b.Round })
	return out
}

// observed is a train.Net that hands every successful all-reduce's input
// and result to a spreadAcc.
type observed struct {
	train.Net
	acc *spreadAcc
	n   int // the model's parameters: the vectors' first n values
}

func (o observed) AllReduce(ctx context.Context, round uint64, group []peerid.ID, dst, src []float32, weight float64) ([]peerid.ID, error) {
	used, err := o.Net.AllReduce(ctx, round, group, dst, src, weight)
	if err == nil {
		g := fmt.Sprint(used)
		o.acc.add(round, false, src[:o.n], g)
		o.acc.add(round, true, dst[:o.n], g)
	}
	return used, err
}

// RoundPoint is the global model's test accuracy after a round.
type RoundPoint struct {
	Round    int     `json:"round"`
	Seconds  float64 `json:"seconds"`
	Accuracy float64 `json:"accuracy"`
	Loss     float64 `json:"loss"`
}

// Federation runs a federation of cfg.Clients peers over trainSet and
// evaluates the global model on testSet after every EvalEvery rounds.
// progress, if not nil, sees every evaluated point.
func Federation(ctx context.Context, cfg FedConfig, trainSet, testSet *data.Set, progress func(RoundPoint)) (*FedResult, error) {
	if cfg.Clients <= 0 || cfg.Clients > 1024 {
		return nil, fmt.Errorf("%w: %d clients not in 1..1024", ErrConfig, cfg.Clients)
	}
	if err := cfg.Fed.Validate(); err != nil {
		return nil, err
	}
	if cfg.EvalEvery <= 0 {
		cfg.EvalEvery = 1
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	parts, err := data.Partition(trainSet, cfg.Clients, cfg.Partition, cfg.Seed)
	if err != nil {
		return nil, err
	}
	eval, err := train.NewWorker(cfg.Worker, testSet.Head(1))
	if err != nil {
		return nil, err
	}
	nc := DefaultConfig()
	nc.Peers, nc.Bandwidth, nc.Latency, nc.Seed, nc.Worker = cfg.Clients, cfg.Bandwidth, cfg.Latency, cfg.Seed, cfg.Worker
	nc.SyncAlgorithm = "auto" // the all-reduce as `peer run` runs it
	netw, err := newNetwork(ctx, &nc, log, formation{loose: true})
	if err != nil {
		return nil, err
	}
	defer netw.close()

	res := &FedResult{RoundsToTarget: -1, Strategy: cfg.Fed.Strategy, Clients: cfg.Clients, Fraction: cfg.Fed.Fraction, Partition: cfg.Partition,
		GroupSize: cfg.Fed.GroupSize}
	acc := &spreadAcc{rounds: map[uint64]*[2]moments{}}
	finals := make([][]float32, cfg.Clients) // with Consensus: each peer's last global model
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	var mu sync.Mutex
	evaluated := map[uint64]bool{}
	onRound := func(ri train.RoundInfo) bool {
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
		if pt.Round > res.Rounds { // participants of different rounds report concurrently
			res.Rounds, res.FinalAccuracy = pt.Round, acc
		}
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
	// Every client's worker is built before any client starts, and the
	// board says every client started but has not chosen its first round
	// (train.JoinPending) until it says otherwise: a client with no status
	// yet would count as a member of round 1 for the others (no JoinAt),
	// be sampled and never answer. Built one by one beside the running
	// peers, 256 clients' workers took 50 s to start on 2 loaded cores,
	// rounds 1 and 2 lost their groups ("peers disagree on the group",
	// stalls), and the last 45 clients joined at round 4.
	ids := make([]peerid.ID, len(netw.peers))
	workers := make([]*train.Worker, len(netw.peers))
	for i, p := range netw.peers {
		wc := cfg.Worker
		wc.DataSeed = cfg.Seed*1000 + uint64(i) + 1
		w, err := train.NewWorker(wc, trainSet.Subset(parts[i]))
		if err != nil {
			return nil, fmt.Errorf("client %d: %w", i, err)
		}
		ids[i], workers[i] = p.Swarm.ID(), w
	}
	board := pendingBoard(ids)
	var wg sync.WaitGroup
	errs := make([]error, cfg.Clients)
	for i, p := range netw.peers {
		w := workers[i]
		var net train.Net = fixedMembers{Net: p.Swarm.Net(cfg.Worker.Batch), group: p.Group, board: board}
		on := onRound
		if cfg.Consensus {
			net = observed{Net: net, acc: acc, n: len(w.Model.Params)}
			on = func(ri train.RoundInfo) bool {
				if int(ri.Round) == cfg.Fed.Rounds {
					finals[i] = slices.Clone(ri.Global)
				}
				return onRound(ri)
			}
		}
		wg.Go(func() {
			var rec train.Recorder
			if cfg.Events != nil {
				rec = eventsOnly(cfg.Events)
			}
			errs[i] = train.Federated(ctx, w, net, cfg.Fed, rec, on)
		})
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	res.WallS = res.Elapsed.Seconds()
	if cfg.Consensus {
		res.Consensus = acc.points()
		res.FinalMin = 1
		var k int
		for _, f := range finals {
			if f == nil {
				continue
			}
			copy(eval.Model.Params, f)
			_, a := eval.Evaluate(testSet)
			res.FinalMean += a
			res.FinalMin = min(res.FinalMin, a)
			k++
		}
		if k > 0 {
			res.FinalMean /= float64(k)
		} else {
			res.FinalMin = 0
		}
	}
	for _, err := range errs {
		if err != nil && !errors.Is(err, context.Canceled) {
			return res, err
		}
	}
	if err := ended(res, cfg.Fed.Rounds); err != nil {
		return res, err
	}
	return res, nil
}

// ErrEndedEarly reports a federation whose peers all stopped before its
// last round without reaching the target.
var ErrEndedEarly = errors.New("sim: the federation ended early")

// ended checks that a federation that did not reach its target reported
// its last round: every round's participants report it, even a round that
// failed (as the previous state), so a missing last round means the
// peers stopped without finishing.
func ended(res *FedResult, rounds int) error {
	if res.RoundsToTarget > 0 || res.Rounds >= rounds {
		return nil
	}
	return fmt.Errorf("%w: the peers stopped after round %d of %d without reporting a later one (those rounds were left without a result; see the peers' round-failed events)", ErrEndedEarly, res.Rounds, rounds)
}

// fixedMembers is a train.Net whose members are the whole federation and
// whose statuses are every client's latest, as in McMahan et al.'s
// simulation, where every client is always available and starts its
// round from the newest global model: a simulated peer whose heartbeats a
// loaded CPU delays must not drop out of the others' views, where it
// would change their samples, and a 100-peer swarm's heartbeats (every
// 10 s, heartbeat) would start sampled clients from stale models.
type fixedMembers struct {
	train.Net
	group []peerid.ID
	board *statusBoard
}

func (n fixedMembers) Members() []peerid.ID { return slices.Clone(n.group) }

// SetStatus records st on the board, where the other clients read it,
// and gives the swarm its version (and a Done), which go out with the
// next periodic heartbeat. The swarm would send a status that names a
// JoinAt at once: one such status from each of n clients is n(n−1)
// GossipSub deliveries, 16–39 s of CPU at 256 clients (240–600 µs a
// delivery), and the clients' first rounds were spread over that time.
func (n fixedMembers) SetStatus(ctx context.Context, st train.Status) error {
	n.board.set(n.Self(), st)
	return n.Net.SetStatus(ctx, swarmStatus(st))
}

// swarmStatus is the part of st a federation's client gives its swarm:
// everything but JoinAt, which only the board carries.
func swarmStatus(st train.Status) train.Status {
	st.JoinAt = 0
	return st
}

// Statuses returns the board's statuses of the other clients.
func (n fixedMembers) Statuses() map[peerid.ID]train.Status { return n.board.others(n.Self()) }

// statusBoard holds each client's latest status; it is safe for
// concurrent use.
type statusBoard struct {
	mu sync.Mutex
	st map[peerid.ID]train.Status
}

// pendingBoard returns a board on which every one of ids has started and
// not chosen its first round yet (train.JoinPending).
func pendingBoard(ids []peerid.ID) *statusBoard {
	b := &statusBoard{st: make(map[peerid.ID]train.Status, len(ids))}
	for _, id := range ids {
		b.st[id] = train.Status{JoinAt: train.JoinPending}
	}
	return b
}

func (b *statusBoard) set(id peerid.ID, st train.Status) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.st[id] = st
}

func (b *statusBoard) others(self peerid.ID) map[peerid.ID]train.Status {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[peerid.ID]train.Status, len(b.st))
	for id, st := range b.st {
		if id != self {
			out[id] = st
		}
	}
	return out
}

// eventsOnly is a train.Recorder that passes events on and drops
// snapshots.
type eventsOnly func(train.Event)

func (f eventsOnly) Snapshot(string, time.Duration, int, []float32) {}
func (f eventsOnly) Event(e train.Event)                            { f(e) }
