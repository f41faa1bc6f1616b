package swarm

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/starling-ml/starling/peerid"
	"github.com/starling-ml/starling/train"
)

// psKillAt cuts its peer off the swarm (no goodbye) once it has taken at
// steps.
type psKillAt struct {
	at   int
	once sync.Once
	kill func()
}

func (k *psKillAt) Snapshot(_ string, _ time.Duration, steps int, _ []float32) {
	if steps >= k.at {
		k.once.Do(k.kill)
	}
}
func (*psKillAt) Event(train.Event) {}

// TestPSServerKilledOverMocknet: four peers in the parameter-server mode
// on libp2p's mocknet, one server; the server vanishes at its step 40.
// The other workers fail over to the backup within the call timeout, the
// backup takes the shard over, and training goes on to the end with a
// model that classifies well.
func TestPSServerKilledOverMocknet(t *testing.T) {
	const n, steps = 4, 150
	ps, workers, ctx, mn := fedSwarmNet(t, n, 2000)
	_, test := testMNIST(t)
	members := ps[0].Members()
	cfg := train.DefaultPSConfig()
	cfg.Model, cfg.Servers, cfg.MaxSteps, cfg.LR = "logreg", 1, steps, 0.1
	cfg.CallTimeout, cfg.StartGrace, cfg.ServeIdle = time.Second, 5*time.Second, 2*time.Second
	dim := len(workers[0].Model.Params)
	servers, backups, err := train.PSElect(members, cfg.Model, dim, 1)
	if err != nil {
		t.Fatal(err)
	}
	victim, backup := -1, -1
	for i, p := range ps {
		switch p.ID() {
		case servers[0]:
			victim = i
		case backups[0]:
			backup = i
		}
	}
	sums, errs := make([]*train.PSSummary, n), make([]error, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i, p := range ps {
		tr := NewPSTransport(p.Node, 4*dim+1024, 2*time.Second)
		t.Cleanup(tr.Close)
		pctx, cancel := context.WithCancel(ctx)
		var rec train.Recorder
		if i == victim {
			rec = &psKillAt{at: 40, kill: func() { cutOff(t, mn, ps, p); cancel() }}
		}
		wg.Go(func() {
			defer cancel()
			sums[i], errs[i] = train.RunPS(pctx, workers[i], tr, members, cfg, rec)
		})
	}
	wg.Wait()
	took := time.Since(start)
	for i := range ps {
		if i == victim {
			continue
		}
		if errs[i] != nil {
			t.Fatalf("peer %d: %v", i, errs[i])
		}
		if sums[i].Steps != steps {
			t.Errorf("peer %d stopped at step %d", i, sums[i].Steps)
		}
		if i != backup && sums[i].Failovers != 1 {
			t.Errorf("peer %d failed over %d times", i, sums[i].Failovers)
		}
	}
	if sums[backup].Promoted != 1 || sums[backup].Applied == 0 {
		t.Errorf("backup: %+v", sums[backup])
	}
	if _, acc := train.Evaluate(workers[backup].Model, test); acc < 0.8 {
		t.Errorf("accuracy %.3f", acc)
	}
	t.Logf("%v; backup applied %d, victim %d", took, sums[backup].Applied, sums[victim].Applied)
}

// TestPSTransportRefusesBadFrames: a frame with a payload over the limit
// or a bad magic is refused with an error, not read into memory.
func TestPSTransportRefusesBadFrames(t *testing.T) {
	var b strings.Builder
	if err := writePSFrame(&b, &train.PSRequest{Op: train.PSPush}, make([]byte, 100)); err != nil {
		t.Fatal(err)
	}
	var r train.PSRequest
	if _, err := readPSFrame(strings.NewReader(b.String()), &r, 99); err == nil || !strings.Contains(err.Error(), "at most 99") {
		t.Errorf("payload over the limit: %v", err)
	}
	if p, err := readPSFrame(strings.NewReader(b.String()), &r, 100); err != nil || len(p) != 100 || r.Op != train.PSPush {
		t.Errorf("a good frame: %v", err)
	}
	if _, err := readPSFrame(strings.NewReader("XXXX"+b.String()[4:]), &r, 100); err == nil {
		t.Error("bad magic accepted")
	}
}

// TestPSTransportCallDeadline: a call to a peer whose handler does not
// answer ends at ctx's deadline; one to a peer that serves nothing yet
// says PSNotReady.
func TestPSTransportCallDeadline(t *testing.T) {
	ps := newSwarm(t, 2)
	a := NewPSTransport(ps[0].Node, 1<<20, 5*time.Second)
	b := NewPSTransport(ps[1].Node, 1<<20, 5*time.Second)
	t.Cleanup(a.Close)
	t.Cleanup(b.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rep, err := a.Call(ctx, b.Self(), &train.PSRequest{Op: train.PSPull})
	if err != nil || rep.Status != train.PSNotReady {
		t.Fatalf("%+v, %v", rep, err)
	}
	b.Serve(func(ctx context.Context, _ peerid.ID, _ *train.PSRequest) *train.PSReply {
		<-ctx.Done()
		return &train.PSReply{}
	})
	cctx, ccancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer ccancel()
	start := time.Now()
	if _, err := a.Call(cctx, b.Self(), &train.PSRequest{Op: train.PSPull}); err == nil {
		t.Fatal("a call nobody answered succeeded")
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("call took %v past a 300 ms deadline", el)
	}
	b.Serve(func(_ context.Context, from peerid.ID, r *train.PSRequest) *train.PSReply {
		return &train.PSReply{Status: train.PSOK, Version: 7, Detail: string(from), Payload: r.Payload}
	})
	rep, err = a.Call(ctx, b.Self(), &train.PSRequest{Op: train.PSPull, Payload: []byte{1, 2, 3}})
	if err != nil || rep.Version != 7 || rep.Detail != string(a.Self()) || len(rep.Payload) != 3 {
		t.Fatalf("%+v, %v", rep, err)
	}
}

// TestPSTransportCallBeforeServing: a peer whose host is up but that has
// not registered the ps protocol yet (its run starts later, or it ended)
// answers PSNotReady, which a worker retries, not a transport error,
// which fails it over.
func TestPSTransportCallBeforeServing(t *testing.T) {
	ps := newSwarm(t, 2)
	a := NewPSTransport(ps[0].Node, 1<<20, 5*time.Second)
	t.Cleanup(a.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for range 2 {
		rep, err := a.Call(ctx, peerid.ID(ps[1].Node.ID().String()), &train.PSRequest{Op: train.PSPush, Payload: make([]byte, 1<<16)})
		if err != nil || rep.Status != train.PSNotReady {
			t.Fatalf("%+v, %v", rep, err)
		}
	}
	b := NewPSTransport(ps[1].Node, 1<<20, 5*time.Second)
	b.Close()
	rep, err := a.Call(ctx, b.Self(), &train.PSRequest{Op: train.PSPull})
	if err != nil || rep.Status != train.PSNotReady {
		t.Fatalf("after the peer stopped serving: %+v, %v", rep, err)
	}
}
