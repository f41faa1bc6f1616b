package train_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/starling-ml/starling/peerid"
	"github.com/starling-ml/starling/staleness"
	"github.com/starling-ml/starling/train"
	"github.com/starling-ml/starling/train/traintest"
)

// psWorkers returns k paced test workers on IID shards of 6000 samples.
func psWorkers(t *testing.T, k int) []*train.Worker {
	t.Helper()
	sh := train.Shards(t, 6000, k)
	ws := make([]*train.Worker, k)
	for i := range k {
		wc := train.DefaultWorkerConfig()
		// logreg: the race detector slows the per-value loops of a push
		// (encode, decode, apply, replicate) a lot; fewer values keep the
		// tests short.
		wc.Model, wc.DataSeed = "logreg", uint64(i+1)
		w, err := train.NewWorker(wc, sh[i])
		if err != nil {
			t.Fatal(err)
		}
		train.SetStepTime(w, testStep)
		ws[i] = w
	}
	return ws
}

func psConfig() train.PSConfig {
	cfg := train.DefaultPSConfig()
	cfg.Model, cfg.LR, cfg.CallTimeout, cfg.StartGrace, cfg.SnapshotEvery = "m", 0.1, time.Second, 2*time.Second, 0
	return cfg
}

// killAt is a Recorder that calls kill once the peer's step count reaches
// at and ready (if set) holds, and passes everything on to next (if set).
type killAt struct {
	at    int
	ready func() bool
	once  sync.Once
	kill  func()
	next  train.Recorder
}

func (k *killAt) Snapshot(peer string, at time.Duration, steps int, p []float32) {
	if steps >= k.at && (k.ready == nil || k.ready()) {
		k.once.Do(k.kill)
	}
	if k.next != nil {
		k.next.Snapshot(peer, at, steps, p)
	}
}

func (k *killAt) Event(e train.Event) {
	if k.next != nil {
		k.next.Event(e)
	}
}

// leadRecorder records, at every step of a peer, how many steps the
// fastest peer other than slow is ahead of slow: the SSP gate's bound.
type leadRecorder struct {
	mu    sync.Mutex
	slow  string
	steps map[string]int
	lead  int // the largest
}

func (*leadRecorder) Snapshot(string, time.Duration, int, []float32) {}

func (r *leadRecorder) Event(e train.Event) {
	if e.Kind != "step" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.steps[e.Peer]++
	if e.Peer != r.slow {
		r.lead = max(r.lead, r.steps[e.Peer]-r.steps[r.slow])
	}
}

// runPSPeers runs k peers of RunPS on one fabric in a synctest bubble;
// victim ≥ 0 is killed (unreachable, its run cancelled) at its step
// killStep.
func runPSPeers(t *testing.T, ws []*train.Worker, cfg train.PSConfig, victim, killStep int) ([]*train.PSSummary, []error, []peerid.ID) {
	return runPSPeersWith(t, ws, cfg, psFault{victim: victim, killStep: killStep}, nil)
}

// psFault is what runPSPeersWith does to peer victim (−1: none) at its
// step killStep: kill it (unreachable, its run cancelled) or, with
// freeze, freeze it for the others (their calls to it hang until their
// deadline) while it goes on training and calling them. Unless the
// victim serves nothing (worker), the fault waits until every other peer
// has reached it once: a peer whose first calls found it not serving yet
// would otherwise see a server that never started, which it waits for up
// to StartGrace, not a failed one (the scheduler decides which, and the
// test would not be deterministic).
type psFault struct {
	victim, killStep int
	freeze, worker   bool
}

// runPSPeersWith is runPSPeers with a fault and rec (if not nil) as
// every peer's Recorder.
func runPSPeersWith(t *testing.T, ws []*train.Worker, cfg train.PSConfig, fault psFault, rec train.Recorder) ([]*train.PSSummary, []error, []peerid.ID) {
	t.Helper()
	victim, killStep := fault.victim, fault.killStep
	k := len(ws)
	ids := make([]peerid.ID, k)
	for i := range ids {
		ids[i] = peerid.ID(fmt.Sprint("p", i))
	}
	sums, errs := make([]*train.PSSummary, k), make([]error, k)
	synctest.Test(t, func(t *testing.T) {
		f := traintest.NewPSFabric()
		ctx, cancel := context.WithTimeout(t.Context(), 120*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		reached := func() bool {
			for _, id := range ids {
				if id != ids[victim] && f.CallsFrom(id, ids[victim]) == 0 {
					return false
				}
			}
			return true
		}
		for i := range k {
			net := f.Join(ids[i])
			pctx, pcancel := context.WithCancel(ctx)
			prec := rec
			ready := reached
			if fault.worker {
				ready = nil
			}
			switch {
			case i == victim && fault.freeze:
				prec = &killAt{at: killStep, ready: ready, kill: func() { f.Stall(ids[i]) }, next: rec}
			case i == victim:
				prec = &killAt{at: killStep, ready: ready, kill: func() { f.Kill(ids[i]); pcancel() }, next: rec}
			}
			wg.Go(func() {
				defer pcancel()
				sums[i], errs[i] = train.RunPS(pctx, ws[i], net, ids, cfg, prec)
			})
		}
		wg.Wait()
		if ctx.Err() != nil {
			t.Fatal("the run hit the test's deadline")
		}
	})
	return sums, errs, ids
}

// TestPSTrainsInMemory: four peers, two servers, each worker 150 steps;
// the final model of each classifies well and every peer's final pull
// sees the same shards (all workers were done).
func TestPSTrainsInMemory(t *testing.T) {
	ws := psWorkers(t, 4)
	cfg := psConfig()
	cfg.Servers, cfg.MaxSteps = 2, 150
	sums, errs, _ := runPSPeers(t, ws, cfg, -1, 0)
	_, test := train.MNIST(t)
	var applied, compensated int64
	for i, err := range errs {
		if err != nil {
			t.Fatalf("peer %d: %v", i, err)
		}
		applied += sums[i].Applied
		compensated += sums[i].Compensated
		if sums[i].Steps != 150 || sums[i].Pushes != 2*150 || sums[i].Failovers != 0 {
			t.Errorf("peer %d: %+v", i, sums[i])
		}
	}
	if applied != 4*150*2 {
		t.Errorf("servers applied %d gradients, want %d", applied, 4*150*2)
	}
	// Four workers at one pace: most gradients are a step or so stale,
	// and DC-ASGD corrects them.
	if compensated < applied/2 {
		t.Errorf("%d of %d gradients compensated", compensated, applied)
	}
	// The order of the pushes is the scheduler's, so the accuracy varies
	// from run to run: 0.85-0.90 in 24 runs, once 0.79 under -race. An
	// untrained or broken model is near 0.1.
	if _, acc := train.Evaluate(ws[3].Model, test); acc < 0.7 {
		t.Errorf("accuracy %.3f after 600 asynchronous steps", acc)
	}
}

// TestPSFailoverInMemory: four peers, one server; the server dies at its
// step 60. The other workers move to the backup within the call timeout,
// training continues, and the backup's shard holds every update a worker
// had acknowledged (all but at most the dead peer's own in-flight one),
// each once.
func TestPSFailoverInMemory(t *testing.T) {
	ws := psWorkers(t, 4)
	cfg := psConfig()
	cfg.Servers, cfg.MaxSteps = 1, 200
	// Which peer the election makes the server, and which its backup.
	ids := []peerid.ID{"p0", "p1", "p2", "p3"}
	rank := train.PSRank(ids, cfg.Model)
	victim, backup := int(rank[0][1]-'0'), int(rank[1][1]-'0')
	sums, errs, _ := runPSPeers(t, ws, cfg, victim, 60)
	_, test := train.MNIST(t)
	var acked int
	for i, err := range errs {
		acked += sums[i].Pushes
		if i == victim {
			continue
		}
		if err != nil {
			t.Fatalf("peer %d: %v", i, err)
		}
		if sums[i].Steps != 200 {
			t.Errorf("peer %d stopped at step %d", i, sums[i].Steps)
		}
		if i != backup && sums[i].Failovers != 1 {
			t.Errorf("peer %d failed over %d times", i, sums[i].Failovers)
		}
	}
	if sums[backup].Promoted != 1 {
		t.Fatalf("backup %d took over %d shards", backup, sums[backup].Promoted)
	}
	var final uint64
	for i, s := range sums {
		if i != victim {
			final = max(final, s.Versions[0])
		}
	}
	if final != uint64(acked) {
		t.Errorf("backup's shard at version %d; workers had %d pushes acknowledged", final, acked)
	}
	if _, acc := train.Evaluate(ws[backup].Model, test); acc < 0.8 {
		t.Errorf("accuracy %.3f after the failover", acc)
	}
}

// TestPSRefusesOtherModel: a worker of another architecture (another
// parameter count) than the server's gets a one-line error naming both,
// and so does a gradient of the wrong size; nothing hangs.
func TestPSRefusesOtherModel(t *testing.T) {
	ws := psWorkers(t, 2)
	wc := train.DefaultWorkerConfig()
	wc.Model = "mlp:784-16-10"
	other, err := train.NewWorker(wc, train.Shards(t, 600, 1)[0])
	if err != nil {
		t.Fatal(err)
	}
	cfg := psConfig()
	cfg.Servers, cfg.MaxSteps, cfg.ServeIdle = 1, 50, 500*time.Millisecond
	ids := []peerid.ID{"a", "b", "c"}
	rank := train.PSRank(ids, cfg.Model)
	synctest.Test(t, func(t *testing.T) {
		f := traintest.NewPSFabric()
		ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
		defer cancel()
		// The odd one out is the peer not elected server.
		odd := rank[2]
		var good []peerid.ID
		for _, id := range ids {
			if id != odd {
				good = append(good, id)
			}
		}
		var wg sync.WaitGroup
		for i, id := range good {
			wg.Go(func() { train.RunPS(ctx, ws[i], f.Join(id), ids, cfg, nil) })
		}
		_, err := train.RunPS(ctx, other, f.Join(odd), ids, cfg, nil)
		if !errors.Is(err, train.ErrPSRefused) || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "bad-model") {
			t.Errorf("err = %v", err)
		}
		// A raw push of the wrong size to the server.
		server := f.Join("intruder")
		dim := len(ws[0].Model.Params)
		digest := train.PSLayoutDigest(ids, cfg.Model, dim, 1)
		rep, err := server.Call(ctx, rank[0], &train.PSRequest{Op: train.PSPush, Model: cfg.Model, Dim: dim, Layout: digest,
			Session: 1, Seq: 1, Elems: 3, Payload: make([]byte, 12)})
		if err != nil || rep.Status != train.PSBadShape || !strings.Contains(rep.Detail, "the gradient 3") {
			t.Errorf("wrong-size push: %+v, %v", rep, err)
		}
		// A bad payload with the right size does not touch the shard.
		rep, err = server.Call(ctx, rank[0], &train.PSRequest{Op: train.PSPush, Model: cfg.Model, Dim: dim, Layout: digest,
			Session: 1, Seq: 1, Elems: dim, Payload: make([]byte, 12)})
		if err != nil || rep.Status != train.PSBadRequest {
			t.Errorf("undecodable push: %+v, %v", rep, err)
		}
		wg.Wait()
	})
}

// TestPSSSPHoldsFastWorkers: with an SSP bound of 4 and a worker 8×
// slower than the two others, the gate holds the fast ones: none ever
// completes more than 4+1 steps beyond the straggler (it may start a
// step while 4 ahead), and they do get that far. The straggler is never
// held, and no gradient is dropped: the staleness of what gets past the
// gate stays within the drop bound, 2·(4+1) updates per other worker.
// (Before the gate, the fast workers ran 35 steps ahead and the
// straggler's gradients, τ ≈ 16, were dropped.)
func TestPSSSPHoldsFastWorkers(t *testing.T) {
	ws := psWorkers(t, 3)
	train.SetSlowdown(ws[0], 8)
	cfg := psConfig()
	cfg.Servers, cfg.MaxSteps, cfg.Policy = 1, 40, staleness.SSP(4)
	rec := &leadRecorder{slow: "p0", steps: map[string]int{}}
	sums, errs, _ := runPSPeersWith(t, ws, cfg, psFault{victim: -1}, rec)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("peer %d: %v", i, err)
		}
		// A wait is no failure: nobody fails over.
		if s := sums[i]; s.Steps != 40 || s.Stale != 0 || s.GateTimeouts != 0 || s.Failovers != 0 {
			t.Errorf("peer %d: %d steps, %d stale, %d gate timeouts, %d failovers", i, s.Steps, s.Stale, s.GateTimeouts, s.Failovers)
		}
	}
	if rec.lead != 4+1 {
		t.Errorf("the fast workers got %d steps ahead of the straggler, want 4+1 at most and at least", rec.lead)
	}
	if sums[0].GateWaits != 0 {
		t.Errorf("the straggler was held %d times", sums[0].GateWaits)
	}
	for _, s := range sums[1:] {
		if s.GateWaits == 0 {
			t.Errorf("fast worker %s never held", s.Peer)
		}
	}
}

// TestPSSSPDeadWorkerHoldsUntilStall: with ssp:4, a straggler (a worker
// only, 8× slower) killed at its step 10 holds the others for the stall
// timeout (CallTimeout, 1 s) once: then the servers stop counting it and
// they run their 60 steps without waiting, and without a gate timeout.
func TestPSSSPDeadWorkerHoldsUntilStall(t *testing.T) {
	ws := psWorkers(t, 4)
	cfg := psConfig()
	cfg.Servers, cfg.MaxSteps, cfg.Policy = 1, 60, staleness.SSP(4)
	ids := []peerid.ID{"p0", "p1", "p2", "p3"}
	victim := int(train.PSRank(ids, cfg.Model)[2][1] - '0') // neither server nor backup
	train.SetSlowdown(ws[victim], 8)
	sums, errs, _ := runPSPeersWith(t, ws, cfg, psFault{victim: victim, killStep: 10, worker: true}, nil)
	for i, err := range errs {
		if i == victim {
			continue
		}
		s := sums[i]
		if err != nil {
			t.Fatalf("peer %d: %v", i, err)
		}
		if s.Steps != 60 || s.GateTimeouts != 0 || s.Failovers != 0 {
			t.Errorf("peer %d: %d steps, %d gate timeouts, %d failovers", i, s.Steps, s.GateTimeouts, s.Failovers)
		}
		// Held about the stall timeout for the dead one (from at most a
		// few steps after its last), and a few polls (20 ms) before,
		// while it lived.
		if stall := cfg.CallTimeout.Seconds(); s.GateWaitS < 0.9*stall || s.GateWaitS > stall+0.5 {
			t.Errorf("peer %d held %.2f s in all (%d waits), want the stall timeout %.0f s and a little", i, s.GateWaitS, s.GateWaits, stall)
		}
	}
}

// TestPSFrozenServerInMemory: the server, 10× slower than the others,
// freezes for them at its step 3 but goes on training. Their calls time out and go to the
// backup, which takes over; the frozen server's next replica is refused,
// so it stops serving and its own worker moves to the backup too. Every
// worker finishes, and the shard holds each acknowledged push once.
func TestPSFrozenServerInMemory(t *testing.T) {
	ws := psWorkers(t, 4)
	cfg := psConfig()
	cfg.Servers, cfg.MaxSteps = 1, 200
	ids := []peerid.ID{"p0", "p1", "p2", "p3"}
	rank := train.PSRank(ids, cfg.Model)
	victim, backup := int(rank[0][1]-'0'), int(rank[1][1]-'0')
	// The frozen server trains slower than the others, so that it still
	// pushes after they have moved to the backup.
	train.SetSlowdown(ws[victim], 10)
	sums, errs, _ := runPSPeersWith(t, ws, cfg, psFault{victim: victim, killStep: 3, freeze: true}, nil)
	var acked int
	var final uint64
	for i, err := range errs {
		if err != nil {
			t.Fatalf("peer %d: %v", i, err)
		}
		acked += sums[i].Pushes
		final = max(final, sums[i].Versions[0])
		if sums[i].Steps != 200 {
			t.Errorf("peer %d stopped at step %d", i, sums[i].Steps)
		}
		if i != backup && sums[i].Failovers != 1 {
			t.Errorf("peer %d failed over %d times", i, sums[i].Failovers)
		}
	}
	if sums[backup].Promoted != 1 {
		t.Errorf("backup took over %d shards", sums[backup].Promoted)
	}
	if final != uint64(acked) {
		t.Errorf("shard at version %d; workers had %d pushes acknowledged", final, acked)
	}
}
