package train_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"

	"github.com/starling-ml/starling/aggregate"
	"github.com/starling-ml/starling/aggregate/aggtest"
	"github.com/starling-ml/starling/data"
	"github.com/starling-ml/starling/node"
	"github.com/starling-ml/starling/peerid"
	"github.com/starling-ml/starling/swarm"
	"github.com/starling-ml/starling/train"
	"github.com/starling-ml/starling/train/traintest"
)

var (
	mnistOnce             sync.Once
	mnistTrain, mnistTest *data.Set
	mnistErr              error
	syncWorkerModel       = "mlp:784-32-10"
)

func mnist(t testing.TB) (*data.Set, *data.Set) {
	t.Helper()
	mnistOnce.Do(func() { mnistTrain, mnistTest, mnistErr = data.LoadMNIST("") })
	if mnistErr != nil {
		t.Fatalf("MNIST: %v", mnistErr)
	}
	return mnistTrain, mnistTest
}

func trainSet(t testing.TB) *data.Set {
	tr, _ := mnist(t)
	return tr
}

// order returns the sample order in which a worker with the given batch
// and data seed walks a shard of n samples in its first epoch: it runs the
// same iterator over a set whose single feature is the sample's index.
func order(n, batch int, seed uint64) []int {
	idx := &data.Set{X: make([]float32, n), Y: make([]int32, n), Dim: 1, Classes: 1}
	for i := range idx.X {
		idx.X[i] = float32(i)
	}
	it := data.NewIterator(idx, batch, seed)
	out := make([]int, 0, n)
	for it.Next() {
		x, _ := it.Batch()
		for _, v := range x {
			out = append(out, int(v))
		}
	}
	return out
}

// equivalentShards builds n shards of per samples each from big (of
// n·per samples) such that, in their first epoch, step t's batches of the
// n workers (batch b, data seeds seeds[k]) together hold exactly the
// samples of step t's batch of one worker with batch n·b and bigSeed.
func equivalentShards(big *data.Set, n, b int, bigSeed uint64, seeds []uint64) []*data.Set {
	per := big.Len() / n
	P := order(big.Len(), n*b, bigSeed)
	shards := make([]*data.Set, n)
	for k := range n {
		Q := order(per, b, seeds[k])
		idx := make([]int, per)
		for pos, m := range Q {
			t, j := pos/b, pos%b
			idx[m] = P[t*n*b+k*b+j]
		}
		shards[k] = big.Subset(idx)
	}
	return shards
}

func syncWorker(t testing.TB, shard *data.Set, batch int, seed uint64) *train.Worker {
	t.Helper()
	cfg := train.DefaultWorkerConfig()
	cfg.Model, cfg.Optimizer, cfg.LR, cfg.Batch, cfg.DataSeed = syncWorkerModel, "momentum", 0.05, batch, seed
	w, err := train.NewWorker(cfg, shard)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// memJob is n in-process peers on an aggtest network. Tests build it, and
// run its peers, inside a synctest bubble (bubble), where a loaded CPU
// cannot make a stall timeout or a join wait fire.
type memJob struct {
	netw  *aggtest.Network
	board *traintest.Board
	acfg  aggregate.Config
}

func newMemJob(stall time.Duration) *memJob {
	acfg := aggregate.DefaultConfig()
	acfg.StallTimeout = stall
	return &memJob{netw: aggtest.NewNetwork(aggtest.Config{}), board: traintest.NewBoard(), acfg: acfg}
}

func (j *memJob) net(t testing.TB, id peerid.ID) *traintest.Net {
	t.Helper()
	r, err := aggregate.NewRunner(id, j.netw.Join(id), j.acfg)
	if err != nil {
		t.Fatal(err)
	}
	j.board.Join(id)
	return &traintest.Net{ID: id, Runner: r, Board: j.board}
}

// bubble returns f run in a synctest bubble, for t.Run.
func bubble(f func(t *testing.T)) func(t *testing.T) {
	return func(t *testing.T) { synctest.Test(t, f) }
}

// logRec logs a peer's events (shown with -v or on failure).
type logRec struct{ t testing.TB }

func (l logRec) Snapshot(string, time.Duration, int, []float32) {}
func (l logRec) Event(e train.Event) {
	l.t.Logf("%v %s %s %s", e.At.Round(time.Millisecond), e.Peer, e.Kind, e.Detail)
}

// relErr returns ‖a−b‖₂/‖b‖₂.
func relErr(a, b []float32) float64 {
	var d, n float64
	for i := range a {
		x := float64(a[i]) - float64(b[i])
		d += x * x
		n += float64(b[i]) * float64(b[i])
	}
	return math.Sqrt(d / n)
}

// TestSyncMatchesBigBatch: n peers with batch b end where one peer with
// batch n·b does (same model seed, the same samples per step).
func TestSyncMatchesBigBatch(t *testing.T) {
	tr := trainSet(t)
	for _, n := range []int{3, 4} {
		t.Run(fmt.Sprintf("n=%d", n), bubble(func(t *testing.T) {
			const b, steps, epochSteps = 8, 6, 8
			big := tr.Head(n * b * epochSteps)
			seeds := make([]uint64, n)
			for k := range seeds {
				seeds[k] = uint64(100 + k)
			}
			shards := equivalentShards(big, n, b, 7, seeds)

			ref := syncWorker(t, big, n*b, 7)
			init := slices.Clone(ref.Model.Params)
			for range steps {
				if _, err := ref.Step(context.Background()); err != nil {
					t.Fatal(err)
				}
			}

			job := newMemJob(5 * time.Second)
			cfg := train.DefaultSyncConfig()
			cfg.Steps = steps
			workers := make([]*train.Worker, n)
			nets := make([]*traintest.Net, n)
			for k := range n {
				workers[k] = syncWorker(t, shards[k], b, seeds[k])
				nets[k] = job.net(t, peerid.ID(fmt.Sprintf("peer%d", k)))
			}
			var wg sync.WaitGroup
			errs := make([]error, n)
			groups := make([][]int, n)
			for k := range n {
				wg.Go(func() {
					errs[k] = train.Sync(context.Background(), workers[k], nets[k], cfg, nil, func(si train.StepInfo) bool {
						groups[k] = append(groups[k], len(si.Group))
						return false
					})
				})
			}
			wg.Wait()
			for k := range n {
				if errs[k] != nil {
					t.Fatalf("peer %d: %v", k, errs[k])
				}
				if workers[k].Steps != steps || slices.ContainsFunc(groups[k], func(g int) bool { return g != n }) {
					t.Fatalf("peer %d: %d steps, group sizes %v", k, workers[k].Steps, groups[k])
				}
				if !slices.Equal(workers[k].Model.Params, workers[0].Model.Params) {
					t.Fatalf("peer %d holds other parameters than peer 0", k)
				}
			}
			got := workers[0].Model.Params
			e := relErr(got, ref.Model.Params)
			// The updates themselves, which are much smaller than the
			// parameters, agree to rounding too.
			du, dr := make([]float32, len(got)), make([]float32, len(got))
			for i := range got {
				du[i], dr[i] = got[i]-init[i], ref.Model.Params[i]-init[i]
			}
			eu := relErr(du, dr)
			t.Logf("n=%d b=%d, %d steps: parameters %.2e relative, updates %.2e", n, b, steps, e, eu)
			if e > 1e-5 || eu > 1e-4 {
				t.Fatalf("parameters differ by %.2e relative (updates %.2e) from one peer with batch %d", e, eu, n*b)
			}
		}))
	}
}

// runMem runs peers until they stop; onStep(k, si) may stop peer k.
func runMem(t *testing.T, workers []*train.Worker, nets []*traintest.Net, cfg train.SyncConfig, throttle time.Duration, onStep func(k int, si train.StepInfo) bool) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	errs := make([]error, len(workers))
	var wg sync.WaitGroup
	for k := range workers {
		wg.Go(func() {
			errs[k] = train.Sync(ctx, workers[k], nets[k], cfg, logRec{t}, func(si train.StepInfo) bool {
				if throttle > 0 {
					time.Sleep(throttle) // a pace at which joining is worth it
				}
				return onStep(k, si)
			})
		})
	}
	wg.Wait()
	return errs
}

func memPeers(t *testing.T, job *memJob, n, per int, first uint64) ([]*train.Worker, []*traintest.Net) {
	tr := trainSet(t)
	workers := make([]*train.Worker, n)
	nets := make([]*traintest.Net, n)
	for k := range n {
		i := int(first) + k
		workers[k] = syncWorker(t, tr.Subset(seq(i*per, per)), 16, uint64(i+1))
		nets[k] = job.net(t, peerid.ID(fmt.Sprintf("peer%d", i)))
	}
	return workers, nets
}

func seq(from, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = from + i
	}
	return out
}

// TestSyncSurvivesAKilledPeer: a peer that dies mid-job is left out by
// the all-reduce; the survivors finish with the same parameters.
func TestSyncSurvivesAKilledPeer(t *testing.T) { synctest.Test(t, syncSurvivesAKilledPeer) }

func syncSurvivesAKilledPeer(t *testing.T) {
	job := newMemJob(300 * time.Millisecond)
	workers, nets := memPeers(t, job, 4, 256, 0)
	cfg := train.DefaultSyncConfig()
	cfg.Steps = 30
	last := make([]train.StepInfo, 4)
	errs := runMem(t, workers, nets, cfg, 0, func(k int, si train.StepInfo) bool {
		last[k] = si
		if k == 2 && si.Step == 10 {
			job.netw.Kill(peerid.ID(nets[k].ID))
			job.board.Leave(nets[k].ID)
			return true
		}
		return false
	})
	for _, k := range []int{0, 1, 3} {
		if errs[k] != nil {
			t.Fatalf("peer %d: %v", k, errs[k])
		}
		if last[k].Step != 30 || len(last[k].Group) != 3 || slices.Contains(last[k].Group, "peer2") {
			t.Fatalf("peer %d ended at step %d with group %v", k, last[k].Step, last[k].Group)
		}
		if !slices.Equal(workers[k].Model.Params, workers[0].Model.Params) {
			t.Fatalf("peer %d holds other parameters than peer 0", k)
		}
	}
}

// TestSyncPeerStops: a peer whose Sync returns while its network stays up
// (a library user's node, not closed) says so; the others go on without
// it. In a pair, whose quorum needs both, the survivor used to try every
// step with it again, a stall timeout each, forever.
func TestSyncPeerStops(t *testing.T) {
	for _, n := range []int{2, 4} {
		t.Run(fmt.Sprintf("%d peers", n), bubble(func(t *testing.T) {
			job := newMemJob(300 * time.Millisecond)
			workers, nets := memPeers(t, job, n, 256, 0)
			cfg := train.DefaultSyncConfig()
			cfg.Steps = 30
			last := make([]train.StepInfo, n)
			errs := runMem(t, workers, nets, cfg, 0, func(k int, si train.StepInfo) bool {
				last[k] = si
				return k == 1 && si.Step == 10
			})
			if st := nets[0].Statuses()["peer1"]; !st.Done || st.Version != 10 {
				t.Errorf("the stopped peer's status is %+v, want done at step 10", st)
			}
			for k := range n {
				if k == 1 {
					continue
				}
				if errs[k] != nil {
					t.Fatalf("peer %d: %v", k, errs[k])
				}
				if last[k].Step != 30 || slices.Contains(last[k].Group, "peer1") {
					t.Fatalf("peer %d ended at step %d with group %v", k, last[k].Step, last[k].Group)
				}
				if !slices.Equal(workers[k].Model.Params, workers[0].Model.Params) {
					t.Fatalf("peer %d holds other parameters than peer 0", k)
				}
			}
		}))
	}
}

// TestSyncOverSwarmPeerStops is TestSyncPeerStops's pair over swarm
// peers: the status goes out in a heartbeat, and the stopped peer's node
// keeps answering heartbeats.
func TestSyncOverSwarmPeerStops(t *testing.T) {
	tr := trainSet(t)
	peers, add := syncSwarm(t, 2, time.Second)
	add(0)
	add(1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, p := range peers {
		if err := p.WaitPeers(ctx, 2); err != nil {
			t.Fatal(err)
		}
	}
	scfg := train.DefaultSyncConfig()
	scfg.Steps = 40
	errs := make([]error, 2)
	workers := make([]*train.Worker, 2)
	var wg sync.WaitGroup
	for k := range workers {
		workers[k] = syncWorker(t, tr.Subset(seq(k*256, 256)), 16, uint64(k+1))
		wg.Go(func() {
			errs[k] = train.Sync(ctx, workers[k], peers[k].Net(16), scfg, logRec{t}, func(si train.StepInfo) bool {
				return k == 1 && si.Step == 10
			})
		})
	}
	wg.Wait()
	if errs[0] != nil || errs[1] != nil {
		t.Fatalf("errors %v", errs)
	}
	if workers[0].Steps != scfg.Steps || workers[1].Steps != 10 {
		t.Fatalf("peers ended at steps %d and %d, want %d and 10", workers[0].Steps, workers[1].Steps, scfg.Steps)
	}
	if st := peers[0].Net(16).Statuses()[peers[1].ID()]; !st.Done || st.Version != 10 {
		t.Fatalf("peer 0 sees peer 1 as %+v, want done at step 10", st)
	}
}

// TestSyncLateJoiner: a peer that starts while the others run fetches
// their state, joins at the step it declared, and ends with the same
// parameters, having contributed to the last steps.
func TestSyncLateJoiner(t *testing.T) { synctest.Test(t, syncLateJoiner) }

func syncLateJoiner(t *testing.T) {
	job := newMemJob(2 * time.Second)
	workers, nets := memPeers(t, job, 3, 256, 0)
	cfg := train.DefaultSyncConfig()
	cfg.Steps = 400
	cfg.JoinLead = 100 * time.Millisecond
	started := make(chan struct{})
	var once sync.Once
	var joinedAt, lastGroup uint64
	var late *train.Worker
	var lateErr error
	var lateLast train.StepInfo
	var wg sync.WaitGroup
	wg.Go(func() {
		select {
		case <-started:
		case <-time.After(30 * time.Second):
			lateErr = errors.New("the others never got going")
			return
		}
		ws, ns := memPeers(t, job, 1, 256, 3)
		late = ws[0]
		lateErr = train.Sync(context.Background(), late, ns[0], cfg, logRec{t}, func(si train.StepInfo) bool {
			time.Sleep(time.Millisecond)
			if si.Joined {
				joinedAt = si.Step
			}
			lateLast = si
			return false
		})
	})
	errs := runMem(t, workers, nets, cfg, time.Millisecond, func(k int, si train.StepInfo) bool {
		if si.Step == 20 {
			once.Do(func() { close(started) })
		}
		if k == 0 && si.Step == uint64(cfg.Steps) {
			lastGroup = uint64(len(si.Group))
		}
		return false
	})
	wg.Wait()
	for k, err := range errs {
		if err != nil {
			t.Fatalf("peer %d: %v", k, err)
		}
	}
	if lateErr != nil {
		t.Fatalf("late peer: %v", lateErr)
	}
	t.Logf("late peer joined at step %d; last group %d", joinedAt, lastGroup)
	if joinedAt == 0 || joinedAt >= uint64(cfg.Steps) || lastGroup != 4 || lateLast.Step != uint64(cfg.Steps) {
		t.Fatalf("late peer joined at %d, last step %d, final group size %d", joinedAt, lateLast.Step, lastGroup)
	}
	for k, w := range append(workers, late) {
		if !slices.Equal(w.Model.Params, workers[0].Model.Params) {
			t.Fatalf("peer %d holds other parameters than peer 0", k)
		}
		if w.Steps != cfg.Steps {
			t.Fatalf("peer %d at step %d", k, w.Steps)
		}
	}
}

// TestSyncRejoinsAfterStall: a peer that stalls past the stall timeout is
// left out of a step; once it thaws it rejoins and the job ends in step.
func TestSyncRejoinsAfterStall(t *testing.T) { synctest.Test(t, syncRejoinsAfterStall) }

func syncRejoinsAfterStall(t *testing.T) {
	job := newMemJob(300 * time.Millisecond)
	workers, nets := memPeers(t, job, 4, 256, 0)
	cfg := train.DefaultSyncConfig()
	cfg.Steps = 800
	cfg.JoinLead = 100 * time.Millisecond
	var mu sync.Mutex
	var failed, joined bool
	var lastGroup int
	errs := runMem(t, workers, nets, cfg, time.Millisecond, func(k int, si train.StepInfo) bool {
		mu.Lock()
		defer mu.Unlock()
		if k == 1 && si.Step == 15 && !failed {
			job.netw.Stall(peerid.ID(nets[k].ID))
			time.AfterFunc(time.Second, func() { job.netw.Resume(peerid.ID(nets[k].ID)) })
		}
		if k == 1 && si.Failed {
			failed = true
		}
		if k == 1 && si.Joined {
			joined = true
		}
		if k == 0 && si.Step == uint64(cfg.Steps) {
			lastGroup = len(si.Group)
		}
		return false
	})
	for k, err := range errs {
		if err != nil {
			t.Fatalf("peer %d: %v", k, err)
		}
	}
	if !failed || !joined || lastGroup != 4 {
		t.Fatalf("stalled peer: left out %v, rejoined %v; final group %d", failed, joined, lastGroup)
	}
	for k, w := range workers {
		if !slices.Equal(w.Model.Params, workers[0].Model.Params) || w.Steps != cfg.Steps {
			t.Fatalf("peer %d: step %d, same parameters %v", k, w.Steps, slices.Equal(w.Model.Params, workers[0].Model.Params))
		}
	}
}

func TestSyncConfigValidate(t *testing.T) {
	for _, mut := range []func(*train.SyncConfig){
		func(c *train.SyncConfig) { c.Steps = 0 },
		func(c *train.SyncConfig) { c.StepTimeout = 0 },
		func(c *train.SyncConfig) { c.JoinLead = -1 },
		func(c *train.SyncConfig) { c.SnapshotEvery = -1 },
	} {
		c := train.DefaultSyncConfig()
		mut(&c)
		if err := c.Validate(); !errors.Is(err, train.ErrSync) {
			t.Errorf("%+v: %v, want ErrSync", c, err)
		}
	}
}

// TestSyncOverSwarm runs the job on libp2p peers (mocknet): statuses ride
// the gossip heartbeats and a late peer joins through the state service.
// syncSwarm returns n slots for swarm peers on one mocknet and add(i),
// which starts peer i and connects it to peers 0..i−1.
func syncSwarm(t *testing.T, n int, stall time.Duration) (peers []*swarm.Peer, add func(i int)) {
	mn := mocknet.New()
	t.Cleanup(func() { mn.Close() })
	cfg := swarm.DefaultConfig()
	cfg.Node = node.TestConfig()
	cfg.Gossip.Namespace = "sync-test"
	cfg.Gossip.HeartbeatInterval = 100 * time.Millisecond
	cfg.Gossip.PeerTTL = time.Second
	cfg.Aggregate.StallTimeout = stall
	peers = make([]*swarm.Peer, n)
	return peers, func(i int) {
		h, err := mn.GenPeer()
		if err != nil {
			t.Fatal(err)
		}
		if peers[i], err = swarm.Attach(h, cfg); err != nil {
			t.Fatal(err)
		}
		p := peers[i]
		t.Cleanup(func() { p.Close() })
		if err := mn.LinkAll(); err != nil {
			t.Fatal(err)
		}
		for _, q := range peers[:i] {
			if _, err := mn.ConnectPeers(h.ID(), q.Node.ID()); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func TestSyncOverSwarm(t *testing.T) {
	tr := trainSet(t)
	const n = 4
	peers, add := syncSwarm(t, n, 3*time.Second)
	for i := range n - 1 {
		add(i)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, p := range peers[:n-1] {
		if err := p.WaitPeers(ctx, n-1); err != nil {
			t.Fatal(err)
		}
	}
	scfg := train.DefaultSyncConfig()
	scfg.Steps = 300
	scfg.JoinLead = 300 * time.Millisecond
	workers := make([]*train.Worker, n)
	for k := range workers {
		workers[k] = syncWorker(t, tr.Subset(seq(k*256, 256)), 16, uint64(k+1))
	}
	errs := make([]error, n)
	started := make(chan struct{})
	var once sync.Once
	var joined bool
	var lastGroup int
	var wg sync.WaitGroup
	for k := range n {
		wg.Go(func() {
			if k == n-1 {
				// The last peer comes up once the others are training.
				select {
				case <-started:
				case <-ctx.Done():
					errs[k] = ctx.Err()
					return
				}
				add(k)
				if err := peers[k].WaitPeers(ctx, n); err != nil {
					errs[k] = err
					return
				}
			}
			errs[k] = train.Sync(ctx, workers[k], peers[k].Net(16), scfg, logRec{t}, func(si train.StepInfo) bool {
				time.Sleep(2 * time.Millisecond)
				if si.Step >= 10 {
					once.Do(func() { close(started) })
				}
				if k == n-1 && si.Joined {
					joined = true
				}
				if k == 0 && si.Step == uint64(scfg.Steps) {
					lastGroup = len(si.Group)
				}
				return false
			})
		})
	}
	wg.Wait()
	for k, err := range errs {
		if err != nil {
			t.Fatalf("peer %d: %v", k, err)
		}
	}
	if !joined || lastGroup != n {
		t.Fatalf("late peer fetched the state: %v; the last step's group has %d peers", joined, lastGroup)
	}
	for k, w := range workers {
		if w.Steps != scfg.Steps || !slices.Equal(w.Model.Params, workers[0].Model.Params) {
			t.Fatalf("peer %d: step %d, same parameters %v", k, w.Steps, slices.Equal(w.Model.Params, workers[0].Model.Params))
		}
	}
}

// TestSyncBothLeftOut: in a group of two, a stall leaves both peers out of
// the same step (the survivor alone is below the quorum); they must find
// each other again and end together.
func TestSyncBothLeftOut(t *testing.T) { synctest.Test(t, syncBothLeftOut) }

func syncBothLeftOut(t *testing.T) {
	job := newMemJob(300 * time.Millisecond)
	workers, nets := memPeers(t, job, 2, 256, 0)
	stalled := false
	runPairLeftOut(t, workers, nets, func(k int, si train.StepInfo) {
		if k == 1 && si.Step == 15 && !stalled {
			stalled = true
			job.netw.Stall(peerid.ID(nets[k].ID))
			time.AfterFunc(time.Second, func() { job.netw.Resume(peerid.ID(nets[k].ID)) })
		}
	})
}

// TestSyncBothLeftOutAtOnce: a group of two fails one step on both sides
// at the same moment (one sent a NaN: it is excluded, and the other is
// below the quorum); each then sees the other at its own step. They must
// run on together, not as two jobs.
func TestSyncBothLeftOutAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) { syncBothLeftOutAtOnce(t, 0) })
}

// TestSyncBothLeftOutAtOnceSlowStatuses is TestSyncBothLeftOutAtOnce with
// statuses that take 500 ms to arrive, as gossip's do: both peers declare
// a join at a step of the other, both miss it, and must then form one job,
// not two.
func TestSyncBothLeftOutAtOnceSlowStatuses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) { syncBothLeftOutAtOnce(t, 500*time.Millisecond) })
}

func syncBothLeftOutAtOnce(t *testing.T, statusDelay time.Duration) {
	job := newMemJob(300 * time.Millisecond)
	workers, nets := memPeers(t, job, 2, 256, 0)
	for _, n := range nets {
		n.StatusDelay = statusDelay
	}
	var once sync.Once
	job.netw.SetHook(func(from, _ peerid.ID, tag aggregate.Tag, data []float32) aggtest.Action {
		if from == peerid.ID(nets[1].ID) && tag.Round == 16 && len(data) > 0 {
			once.Do(func() { data[0] = float32(math.NaN()) })
		}
		return aggtest.Deliver
	})
	runPairLeftOut(t, workers, nets, func(int, train.StepInfo) {})
}

// runPairLeftOut runs a 400-step job of two peers, calling onStep (under
// a lock) after each of their steps; both must be left out of a step at
// least once and end together.
func runPairLeftOut(t *testing.T, workers []*train.Worker, nets []*traintest.Net, onStep func(k int, si train.StepInfo)) {
	cfg := train.DefaultSyncConfig()
	cfg.Steps = 400
	cfg.JoinLead = 100 * time.Millisecond
	cfg.JoinTimeout = 20 * time.Second
	var mu sync.Mutex
	failed := map[int]bool{}
	errs := runMem(t, workers, nets, cfg, time.Millisecond, func(k int, si train.StepInfo) bool {
		mu.Lock()
		defer mu.Unlock()
		onStep(k, si)
		if si.Failed {
			failed[k] = true
		}
		return false
	})
	for k, err := range errs {
		if err != nil {
			t.Fatalf("peer %d: %v", k, err)
		}
	}
	if !failed[0] || !failed[1] {
		t.Fatalf("left out: %v, want both", failed)
	}
	for k, w := range workers {
		if !slices.Equal(w.Model.Params, workers[0].Model.Params) || w.Steps != cfg.Steps {
			t.Fatalf("peer %d: step %d, same parameters %v", k, w.Steps, slices.Equal(w.Model.Params, workers[0].Model.Params))
		}
	}
}

// spread returns the peers' mean squared distance to their mean vector.
func spread(vs [][]float32) float64 {
	mean := make([]float64, len(vs[0]))
	for _, v := range vs {
		for i, x := range v {
			mean[i] += float64(x) / float64(len(vs))
		}
	}
	var s float64
	for _, v := range vs {
		for i, x := range v {
			d := float64(x) - mean[i]
			s += d * d
		}
	}
	return s / float64(len(vs))
}

// TestSyncBoundedGroups: 20 peers with groups of at most 8 average in
// three groups re-drawn every step; every peer takes every step, and the
// models stay close (their spread a small fraction of how far they moved).
func TestSyncBoundedGroups(t *testing.T) {
	synctest.Test(t, func(t *testing.T) { syncBoundedGroups(t, -1) })
}

// TestSyncBoundedGroupsKilledPeer: a peer killed mid-job stays in the set
// the groups are drawn from until the next agreement step; the groups it
// is drawn into go on without it (or their peers step alone), and every
// survivor ends with the job, the models close.
func TestSyncBoundedGroupsKilledPeer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) { syncBoundedGroups(t, 7) })
}

func syncBoundedGroups(t *testing.T, kill int) {
	const n, steps, at = 20, 16, 5
	job := newMemJob(300 * time.Millisecond)
	workers, nets := memPeers(t, job, n, 64, 0)
	init := slices.Clone(workers[0].Model.Params)
	cfg := train.DefaultSyncConfig()
	cfg.Steps, cfg.GroupSize, cfg.AgreeEvery = steps, 8, 8 // agreement at steps 1 and 9
	var mu sync.Mutex
	groups := map[uint64]map[string]bool{} // step → distinct groups
	last := make([]train.StepInfo, n)
	errs := runMem(t, workers, nets, cfg, 0, func(k int, si train.StepInfo) bool {
		mu.Lock()
		defer mu.Unlock()
		last[k] = si
		if si.Step == 1 || si.Step == 9 {
			// With a peer killed, laggards of the failed groups may miss
			// the agreement step and rejoin.
			if len(si.Group) < n-1 && (kill < 0 || len(si.Group) < n/2) {
				t.Errorf("peer %d step %d (agreement): group of %d", k, si.Step, len(si.Group))
			}
		} else if kill < 0 || si.Step < at {
			if si.Failed || si.Joined || len(si.Group) > 8 || len(si.Group) < 6 {
				t.Errorf("peer %d step %d: group of %d (failed %v, joined %v)", k, si.Step, len(si.Group), si.Failed, si.Joined)
			}
			if groups[si.Step] == nil {
				groups[si.Step] = map[string]bool{}
			}
			groups[si.Step][fmt.Sprint(si.Group)] = true
		}
		if k == kill && si.Step == at {
			job.netw.Kill(nets[k].ID)
			job.board.Leave(nets[k].ID)
			return true
		}
		return false
	})
	var finals [][]float32
	for k := range n {
		if k == kill {
			continue
		}
		if errs[k] != nil {
			t.Fatalf("peer %d: %v", k, errs[k])
		}
		if last[k].Step != steps {
			t.Fatalf("peer %d ended at step %d", k, last[k].Step)
		}
		finals = append(finals, workers[k].Model.Params)
	}
	for s := uint64(2); s < at; s++ {
		if len(groups[s]) != 3 {
			t.Errorf("step %d: %d distinct groups, want 3", s, len(groups[s]))
		}
	}
	if fmt.Sprint(groups[3]) == fmt.Sprint(groups[4]) {
		t.Error("steps 3 and 4 had the same groups")
	}
	var moved float64
	for i, x := range workers[0].Model.Params {
		d := float64(x - init[i])
		moved += d * d
	}
	sp := spread(finals)
	t.Logf("spread %.3g, squared distance moved %.3g (ratio %.2g)", sp, moved, sp/moved)
	if sp > 0.03*moved { // 0.1 when groups average gradients only
		t.Errorf("the models drifted apart: spread %.3g against %.3g moved", sp, moved)
	}
}
