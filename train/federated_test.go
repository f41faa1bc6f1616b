package train

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/starling-ml/starling/aggregate"
	"github.com/starling-ml/starling/aggregate/aggtest"
	"github.com/starling-ml/starling/data"
	"github.com/starling-ml/starling/peerid"
)

func TestSampleDeterministic(t *testing.T) {
	members := make([]string, 100)
	for i := range members {
		members[i] = fmt.Sprintf("p%03d", i)
	}
	a := Sample(1, 7, members, 0.1)
	b := Sample(1, 7, slices.Clone(members), 0.1)
	if len(a) != 10 || !slices.Equal(a, b) || !slices.IsSorted(a) {
		t.Fatalf("sample %v vs %v", a, b)
	}
	if c := Sample(1, 8, members, 0.1); slices.Equal(a, c) {
		t.Fatal("different rounds gave the same sample")
	}
	if got := Sample(1, 1, members[:3], 0.01); len(got) != 1 {
		t.Fatalf("at least one peer: got %v", got)
	}
	if got := Sample(1, 1, members[:3], 1); len(got) != 3 {
		t.Fatalf("C=1: got %v", got)
	}
	// Every peer is sampled about as often as the others.
	count := map[string]int{}
	for r := uint64(1); r <= 1000; r++ {
		for _, p := range Sample(3, r, members, 0.1) {
			count[p]++
		}
	}
	for p, c := range count {
		if c < 60 || c > 140 {
			t.Fatalf("%s sampled %d times in 1000 rounds, want about 100", p, c)
		}
	}
}

func TestParseStrategy(t *testing.T) {
	var c FedConfig
	if err := c.ParseStrategy("fedprox:mu=0.1"); err != nil || c.Mu != 0.1 || c.ServerLR != 1 {
		t.Fatalf("%+v %v", c, err)
	}
	if err := c.ParseStrategy("diloco:h=20"); err != nil || c.LocalSteps != 20 || c.LocalEpochs != 0 || c.ServerLR != 0.7 || c.ResetClientOpt {
		t.Fatalf("%+v %v", c, err)
	}
	for _, bad := range []string{"fedsgdx", "fedprox:mu", "fedadam:beta=3", "fedavg:lr=nan"} {
		if err := c.ParseStrategy(bad); err == nil {
			t.Errorf("%q: want error", bad)
		}
	}
}

func TestServerOpts(t *testing.T) {
	// FedAvg with η=1 turns the global model into the mean of the clients'.
	g := []float32{1, 2}
	(&FedAvgServer{LR: 1}).Apply(g, []float32{0.5, -1})
	if g[0] != 1.5 || g[1] != 1 {
		t.Fatalf("fedavg: %v", g)
	}
	// FedAdam's first step is η·(1−β1)Δ/(√((1−β2)Δ²)+τ) per coordinate.
	s, _ := NewFedOptServer("adam", 0.01, 1)
	g = []float32{0}
	s.Apply(g, []float32{0.2})
	want := 0.01 * 0.1 * 0.2 / (math.Sqrt(0.01*0.04) + 1e-3)
	if math.Abs(float64(g[0])-want) > 1e-7 {
		t.Fatalf("fedadam: %v want %v", g[0], want)
	}
	y, _ := NewFedOptServer("yogi", 0.01, 1)
	y.Apply([]float32{0}, []float32{0.2})
	if v := y.State()[1]; math.Abs(float64(v)-0.01*0.04) > 1e-9 {
		t.Fatalf("fedyogi v after one step from 0: %v", v)
	}
	nv := NewNesterovServer(0.5, 0.9, 1)
	g = []float32{1}
	nv.Apply(g, []float32{-0.2}) // outer gradient 0.2: buf 0.2, step 0.5·(0.2+0.18)
	if math.Abs(float64(g[0])-(1-0.5*0.38)) > 1e-6 {
		t.Fatalf("nesterov: %v", g[0])
	}
}

// runFed runs a federation of n peers in one process over aggtest and
// returns the participants' final global models.
func runFed(t *testing.T, n int, shards [][]int, tr *data.Set, cfg FedConfig, wcfg WorkerConfig, kill string) map[string][]float32 {
	return runFedWrapped(t, n, shards, tr, cfg, wcfg, kill, nil, nil)
}

// runFedWrapped is runFed with each peer's FedNet passed through wrap (if
// not nil), and events recorded in rec (if not nil).
func runFedWrapped(t *testing.T, n int, shards [][]int, tr *data.Set, cfg FedConfig, wcfg WorkerConfig, kill string, rec Recorder, wrap func(id string, net FedNet) FedNet) map[string][]float32 {
	t.Helper()
	netw := aggtest.NewNetwork(aggtest.Config{})
	board := NewStateBoard()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("peer%02d", i)
	}
	acfg := aggregate.DefaultConfig()
	acfg.StallTimeout = 2 * time.Second
	var mu sync.Mutex
	finals := map[string][]float32{}
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i, id := range ids {
		ep := netw.Join(peerid.ID(id))
		r, err := aggregate.NewRunner(peerid.ID(id), ep, acfg)
		if err != nil {
			t.Fatal(err)
		}
		wc := wcfg
		wc.DataSeed = uint64(i + 1)
		w, err := NewWorker(wc, tr.Subset(shards[i]))
		if err != nil {
			t.Fatal(err)
		}
		var net FedNet = &RunnerNet{ID: id, Runner: r, Board: board, Static: ids}
		if wrap != nil {
			net = wrap(id, net)
		}
		wg.Add(1)
		go func(i int, id string) {
			defer wg.Done()
			ctx := context.Background()
			errs[i] = Federated(ctx, w, net, cfg, rec, func(ri RoundInfo) bool {
				if id == kill {
					if ri.Round == 2 {
						netw.Kill(peerid.ID(id))
						return true
					}
					return false
				}
				mu.Lock()
				finals[id] = append([]float32(nil), ri.Global...)
				mu.Unlock()
				return false
			})
		}(i, id)
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil && ids[i] != kill {
			t.Fatalf("%s: %v", ids[i], err)
		}
	}
	return finals
}

func TestFederatedLearnsAndAgrees(t *testing.T) {
	tr, te := mnist(t)
	small := tr.Head(6000)
	shards, _ := data.IID(small.Len(), 6, 1)
	cfg := DefaultFedConfig()
	cfg.Rounds, cfg.Fraction = 6, 0.5
	wcfg := DefaultWorkerConfig()
	wcfg.Model, wcfg.Optimizer, wcfg.Batch = "mlp:784-64-10", "sgd", 20
	finals := runFed(t, 6, shards, small, cfg, wcfg, "")
	// The last round's participants hold the same bits.
	var ref []float32
	for _, g := range finals {
		ref = g
	}
	m, _ := NewWorker(wcfg, small)
	copy(m.Model.Params, ref)
	_, acc := m.Evaluate(te.Head(2000))
	if acc < 0.85 {
		t.Fatalf("FedAvg after 6 rounds of C=0.5 on 6k samples: accuracy %.3f", acc)
	}
}

// logregFed sets up n peers with IID shares of the first samples MNIST
// images, training logistic regression with SGD for rounds rounds of
// FedAvg with every peer in every round.
func logregFed(t *testing.T, n, samples, rounds int, roundTimeout time.Duration) (*data.Set, [][]int, FedConfig, WorkerConfig) {
	t.Helper()
	tr, _ := mnist(t)
	small := tr.Head(samples)
	shards, _ := data.IID(small.Len(), n, 2)
	cfg := DefaultFedConfig()
	cfg.Rounds, cfg.Fraction, cfg.RoundTimeout = rounds, 1, roundTimeout
	wcfg := DefaultWorkerConfig()
	wcfg.Model, wcfg.Optimizer = "logreg", "sgd"
	return small, shards, cfg, wcfg
}

func TestFederatedSurvivesAKilledPeer(t *testing.T) {
	small, shards, cfg, wcfg := logregFed(t, 4, 1200, 4, 20*time.Second)
	finals := runFed(t, 4, shards, small, cfg, wcfg, "peer01")
	if len(finals) != 3 {
		t.Fatalf("survivors finishing: %d", len(finals))
	}
	var ref []float32
	for id, g := range finals {
		if ref == nil {
			ref = g
		} else if !slices.Equal(ref, g) {
			t.Fatalf("%s ended with a different global model", id)
		}
	}
}

// lateNet enters the all-reduce of round too late for the others, who
// complete the round without it.
type lateNet struct {
	FedNet
	round uint64
	delay time.Duration
}

func (n lateNet) AllReduce(ctx context.Context, round uint64, group []string, dst, src []float32, weight float64) ([]string, error) {
	if round == n.round {
		time.Sleep(n.delay)
	}
	return n.FedNet.AllReduce(ctx, round, group, dst, src, weight)
}

// TestFederatedLastRoundLate: a peer that fails the last round, which the
// others complete without it, ends with their final state, not its own
// previous one relabelled as final.
func TestFederatedLastRoundLate(t *testing.T) {
	small, shards, cfg, wcfg := logregFed(t, 3, 900, 3, 30*time.Second)
	finals := runFedWrapped(t, 3, shards, small, cfg, wcfg, "", nil, func(id string, net FedNet) FedNet {
		if id != "peer02" {
			return net
		}
		return lateNet{FedNet: net, round: 3, delay: 5 * time.Second} // > 2 stall timeouts
	})
	if len(finals) != 3 {
		t.Fatalf("%d peers finished", len(finals))
	}
	if !slices.Equal(finals["peer00"], finals["peer01"]) {
		t.Fatal("the on-time peers disagree")
	}
	if !slices.Equal(finals["peer00"], finals["peer02"]) {
		t.Fatal("the late peer ended with another final state")
	}
}

func TestFedConfigValidate(t *testing.T) {
	for _, mut := range []func(*FedConfig){
		func(c *FedConfig) { c.Rounds = 0 },
		func(c *FedConfig) { c.Fraction = 0 },
		func(c *FedConfig) { c.Fraction = 1.5 },
		func(c *FedConfig) { c.LocalEpochs, c.LocalSteps = 0, 0 },
		func(c *FedConfig) { c.Mu = -1 },
	} {
		c := DefaultFedConfig()
		mut(&c)
		if c.Validate() == nil {
			t.Errorf("%+v: want error", c)
		}
	}
}

// TestStrategiesLearn runs every federated strategy briefly and checks
// that each improves on the initial model and ends identical on the
// participants (the stateful server optimisers included).
func TestStrategiesLearn(t *testing.T) {
	tr, te := mnist(t)
	small := tr.Head(3000)
	shards, _ := data.IID(small.Len(), 4, 3)
	for _, spec := range []string{"fedprox:mu=0.01", "fedadam:lr=0.01", "fedyogi:lr=0.01", "fedadagrad:lr=0.05", "diloco:h=20"} {
		t.Run(spec, func(t *testing.T) {
			cfg := DefaultFedConfig()
			if err := cfg.ParseStrategy(spec); err != nil {
				t.Fatal(err)
			}
			cfg.Rounds, cfg.Fraction = 5, 1
			wcfg := DefaultWorkerConfig()
			wcfg.Model, wcfg.Optimizer, wcfg.Batch = "logreg", "sgd", 32
			if cfg.Strategy == "diloco" {
				wcfg.Optimizer, wcfg.LR = "adamw", 0.001
			}
			finals := runFed(t, 4, shards, small, cfg, wcfg, "")
			var ref []float32
			for id, g := range finals {
				if ref == nil {
					ref = g
				} else if !slices.Equal(ref, g) {
					t.Fatalf("%s holds another global model", id)
				}
			}
			w, _ := NewWorker(wcfg, small)
			_, before := w.Evaluate(te.Head(2000))
			copy(w.Model.Params, ref)
			_, after := w.Evaluate(te.Head(2000))
			if after < 0.8 || after < before+0.3 {
				t.Fatalf("accuracy %.3f → %.3f after 5 rounds", before, after)
			}
		})
	}
}

// partNet cuts its peer off from the others while *cut is set (peer02
// then sees only itself; the others see each other): membership,
// versions and state fetches all stop at the cut. It counts the
// all-reduces its peer starts with a group of one.
type partNet struct {
	FedNet
	self  string
	cut   *atomic.Bool
	from  func(round uint64) // peer00 calls it with each round it starts
	solos *atomic.Int64
}

func (n partNet) side(all []string) []string {
	if !n.cut.Load() {
		return all
	}
	return slices.DeleteFunc(slices.Clone(all), func(p string) bool { return (p == "peer02") != (n.self == "peer02") })
}

func (n partNet) Members(ctx context.Context, round uint64) ([]string, error) {
	if n.from != nil {
		defer n.from(round)
	}
	m, err := n.FedNet.Members(ctx, round)
	return n.side(m), err
}

func (n partNet) Versions() map[string]uint64 {
	vs := n.FedNet.(Versioned).Versions()
	for p := range vs {
		if !slices.Contains(n.side([]string{p}), p) {
			delete(vs, p)
		}
	}
	return vs
}

func (n partNet) Fetch(ctx context.Context, peers []string, version uint64, dst []float32) (uint64, error) {
	if peers = n.side(peers); len(peers) == 0 {
		<-ctx.Done()
		return 0, fmt.Errorf("%w: %w", ErrNoState, ctx.Err())
	}
	return n.FedNet.Fetch(ctx, peers, version, dst)
}

func (n partNet) AllReduce(ctx context.Context, round uint64, group []string, dst, src []float32, weight float64) ([]string, error) {
	if len(group) < 2 {
		n.solos.Add(1)
	}
	return n.FedNet.AllReduce(ctx, round, group, dst, src, weight)
}

// TestFederatedMinorityWaits cuts one peer of three off from the others
// for about ten of the majority's rounds: from the majority's round 5, or
// from the start of the cut-off peer's first round (before any round
// completed). The majority goes on; the cut-off peer, a minority of the
// group it last saw, must not train rounds of its own (a divergent state
// with higher version numbers, which the majority took as the newest when
// the cut healed, throwing its own rounds away), but wait and then take
// the majority's state. All three end on the same final state.
func TestFederatedMinorityWaits(t *testing.T) {
	for _, c := range []struct {
		name      string
		who       string // whose Members call at round from cuts (after it returns)
		from, end uint64 // the cut spans [from, end) of peer00's rounds
	}{{"mid-run", "peer00", 5, 12}, {"first-round", "peer02", 1, 10}} {
		t.Run(c.name, func(t *testing.T) {
			// The cut-off peer waits up to the round timeout before it
			// goes on alone: far longer than the cut lasts, even on a
			// loaded machine (20 s was not, once, in CI).
			small, shards, cfg, wcfg := logregFed(t, 3, 900, 30, 90*time.Second)
			var cut, began atomic.Bool
			var solos atomic.Int64
			finals := runFedWrapped(t, 3, shards, small, cfg, wcfg, "", nil, func(id string, net FedNet) FedNet {
				pn := partNet{FedNet: net, self: id, cut: &cut, solos: &solos}
				pn.from = func(round uint64) {
					if id == c.who && round == c.from && !began.Swap(true) {
						cut.Store(true)
					}
					if id == "peer00" && round == c.end {
						cut.Store(false)
					}
				}
				return pn
			})
			if n := solos.Load(); n > 0 {
				t.Errorf("%d all-reduces with a group of one: the cut-off peer trained alone", n)
			}
			if len(finals) != 3 || !slices.Equal(finals["peer00"], finals["peer01"]) || !slices.Equal(finals["peer00"], finals["peer02"]) {
				t.Fatalf("the peers end on different states (%d finished)", len(finals))
			}
		})
	}
}

// goneNet drops a peer from Members once dead is set, as a control plane
// does when the peer's heartbeats stop.
type goneNet struct {
	FedNet
	gone string
	dead *atomic.Bool
}

func (n goneNet) Members(ctx context.Context, round uint64) ([]string, error) {
	m, err := n.FedNet.Members(ctx, round)
	if n.dead.Load() {
		m = slices.DeleteFunc(slices.Clone(m), func(p string) bool { return p == n.gone })
	}
	return m, err
}

// TestFederatedSampledPeerDies: with Fraction < 1, a peer that dies right
// after a round it was sampled for is one of the members its partner saw
// in that round, not half of the round's sample of two: the partner, with
// 4 of 5 left, is no minority and does not wait the round timeout for a
// majority (it did when the sample was the reference).
func TestFederatedSampledPeerDies(t *testing.T) {
	const n = 5
	small, shards, cfg, wcfg := logregFed(t, n, 1500, 6, 20*time.Second)
	cfg.Fraction = 0.4
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("peer%02d", i)
	}
	pair := Sample(cfg.Seed, 2, ids, cfg.Fraction)
	if len(pair) != 2 {
		t.Fatalf("round 2 samples %v", pair)
	}
	victim := pair[0]
	var dead atomic.Bool
	rec := &MemRecorder{}
	finals := runFedWrapped(t, n, shards, small, cfg, wcfg, victim, rec, func(id string, net FedNet) FedNet {
		if id == victim {
			return dieNet{FedNet: net, round: 2, dead: &dead}
		}
		return goneNet{FedNet: net, gone: victim, dead: &dead}
	})
	if !dead.Load() {
		t.Fatal("the victim never completed round 2")
	}
	for _, e := range rec.Events() {
		if e.Kind == "minority" {
			t.Errorf("%s at %v: %s", e.Peer, e.At, e.Detail)
		}
	}
	if _, ok := finals[pair[1]]; !ok {
		t.Fatalf("the victim's partner %s took part in no round", pair[1])
	}
}

// dieNet sets dead once its peer's all-reduce of round completes (the
// peer is killed when it reports the round).
type dieNet struct {
	FedNet
	round uint64
	dead  *atomic.Bool
}

func (n dieNet) AllReduce(ctx context.Context, round uint64, group []string, dst, src []float32, weight float64) ([]string, error) {
	used, err := n.FedNet.AllReduce(ctx, round, group, dst, src, weight)
	if round == n.round && err == nil {
		n.dead.Store(true)
	}
	return used, err
}

// departedNet is a FedNet whose Departures are a fixed set.
type departedNet struct {
	FedNet
	gone []string
}

func (d departedNet) Departed(p string) bool { return slices.Contains(d.gone, p) }

func TestQuorate(t *testing.T) {
	all := []string{"a", "b", "c", "d", "e"}
	for _, c := range []struct {
		members, ref, gone []string
		want               bool
	}{
		{[]string{"a"}, nil, nil, true},                                // no reference yet
		{[]string{"a", "b", "c"}, all, nil, true},                      // 3 of 5
		{[]string{"a", "b"}, all, nil, false},                          // 2 of 5
		{[]string{"a", "b"}, all, []string{"d", "e"}, true},            // 2 of 3 once two left
		{[]string{"a"}, []string{"a", "b"}, nil, false},                // 1 of 2: a partner lost
		{[]string{"a"}, []string{"a", "b"}, []string{"b"}, true},       // 1 of 1: the partner left
		{[]string{"a", "x", "y"}, []string{"a", "b", "c"}, nil, false}, // newcomers do not make a majority of the old
	} {
		net := departedNet{FedNet: &RunnerNet{ID: "a"}, gone: c.gone}
		if got := quorate(net, c.members, c.ref); got != c.want {
			t.Errorf("members %v of %v (gone %v): quorate %v, want %v", c.members, c.ref, c.gone, got, c.want)
		}
	}
}
