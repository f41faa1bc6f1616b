package train

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/starling-ml/starling/compression"
	"github.com/starling-ml/starling/peerid"
)

// flakyPSNet delivers calls to handlers in process; the first fail calls
// to the backup get no answer (a backup whose handler is not set yet, a
// lost call).
type flakyPSNet struct {
	self peerid.ID
	to   map[peerid.ID]PSHandler
	fail *int
}

func (n flakyPSNet) Self() peerid.ID   { return n.self }
func (n flakyPSNet) Serve(h PSHandler) {}
func (n flakyPSNet) Call(ctx context.Context, to peerid.ID, r *PSRequest) (*PSReply, error) {
	if *n.fail > 0 {
		*n.fail--
		return nil, errors.New("no answer")
	}
	return n.to[to](ctx, n.self, r), nil
}

// psPairDim is the length of psPair's model.
const psPairDim = 8

// psPairPush returns worker "w"'s push number seq (session 1) to psPair's
// shard: a gradient of ones computed at version seq−1.
func psPairPush(l psLayout, seq uint64) *PSRequest {
	grad := compression.FP32{}.Encode(nil, []float32{1, 1, 1, 1, 1, 1, 1, 1})
	return &PSRequest{Op: PSPush, Model: "m", Dim: psPairDim, Layout: l.digest(), Shard: 0, Session: 1, Seq: seq,
		Base: seq - 1, Codec: uint8(compression.IDFP32), Elems: psPairDim, Payload: grad}
}

// psPair returns a one-shard layout over two peers and its primary and
// backup servers, connected by flakyPSNet: the primary's next *fail
// calls to the backup fail.
func psPair(t *testing.T, fail *int) (psLayout, *psServer, *psServer) {
	t.Helper()
	cfg := DefaultPSConfig()
	cfg.Model, cfg.LR, cfg.Servers = "m", 0.1, 1
	l, err := planLayout([]peerid.ID{"a", "b"}, "m", psPairDim, 1)
	if err != nil {
		t.Fatal(err)
	}
	primary, backup := l.Servers[0], l.Backups[0]
	handlers := map[peerid.ID]PSHandler{}
	srvP := newPSServer(primary, flakyPSNet{primary, handlers, fail}, cfg, &l, make([]float32, psPairDim))
	srvB := newPSServer(backup, flakyPSNet{backup, handlers, new(int)}, cfg, &l, make([]float32, psPairDim))
	handlers[primary], handlers[backup] = srvP.handle, srvB.handle
	return l, srvP, srvB
}

// TestPSBackupCaughtUpAfterFailedReplicas: replicas that fail do not
// cost the shard its backup for good. The primary tries again after a
// backoff, and the first replica that gets through brings the backup to
// the primary's version, so a failover finds the acknowledged updates.
// (Before, one failed replica dropped the backup: a worker that failed
// over found it at version 0 and was refused, "gradient at version 2948
// of shard 0, which is at 0".)
func TestPSBackupCaughtUpAfterFailedReplicas(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fail := 2
		l, srvP, srvB := psPair(t, &fail)
		push := func(seq uint64) *PSReply {
			rep := srvP.handle(t.Context(), "w", psPairPush(l, seq))
			if rep.Status != PSOK {
				t.Fatalf("push %d: %v %s", seq, rep.Status, rep.Detail)
			}
			return rep
		}
		push(1) // its replica fails: retried after 50 ms
		push(2) // within the backoff: no replica tried
		if fail != 1 {
			t.Fatalf("%d replicas tried in the backoff", 1-fail)
		}
		time.Sleep(60 * time.Millisecond)
		push(3) // fails again: 100 ms
		time.Sleep(110 * time.Millisecond)
		push(4) // gets through, with the whole shard
		sh := srvB.shards[0]
		if sh.version != 4 || sh.params[0] != srvP.shards[0].params[0] {
			t.Fatalf("backup at version %d (param %g), primary at 4 (%g)", sh.version, sh.params[0], srvP.shards[0].params[0])
		}
	})
}

// A push acknowledged by a primary whose replica failed is not on the
// backup; the worker that then fails over sends a gradient based on a
// version the backup never saw. The backup takes the shard over and
// applies it as a fresh gradient instead of refusing it (which ended
// the worker's run: "gradient at version 131 of shard 0, which is at
// 130", seen in CI with a server killed mid-replication).
func TestPSFailoverAheadOfBackup(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fail := 1
		l, srvP, srvB := psPair(t, &fail)
		if rep := srvP.handle(t.Context(), "w", psPairPush(l, 1)); rep.Status != PSOK || rep.Version != 1 {
			t.Fatalf("push 1 at the primary: %v %s, version %d", rep.Status, rep.Detail, rep.Version)
		}
		if srvB.shards[0].version != 0 {
			t.Fatal("the failed replica reached the backup")
		}
		// The primary is gone: the worker's next push goes to the backup.
		rep := srvB.handle(t.Context(), "w", psPairPush(l, 2))
		if rep.Status != PSOK || rep.Version != 1 || rep.Tau != 0 || srvB.promoted.Load() != 1 {
			t.Fatalf("push 2 at the backup: %v %s, version %d, τ %d, promoted %d", rep.Status, rep.Detail, rep.Version, rep.Tau, srvB.promoted.Load())
		}
	})
}

// pastDeadline is a context whose deadline has passed but whose timer has
// not fired yet: Err is still nil.
type pastDeadline struct{ context.Context }

func (pastDeadline) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

// TestPSCallAtRunDeadlineDoesNotFailOver: a call that fails because the
// run's deadline passed (the stream's deadline is the run's, and can fire
// before ctx.Err() is set) ends the call with the deadline; it does not
// fail over to the backup, which would take the shard over from a
// primary that is alive. (Before, every run of --duration could end in
// such a failover, and the primary, told "moved", failed its run.)
func TestPSCallAtRunDeadlineDoesNotFailOver(t *testing.T) {
	l, err := planLayout([]peerid.ID{"a", "b"}, "m", psPairDim, 1)
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultPSConfig()
	cfg.Model, cfg.LR = "m", 0.1
	fail := 1
	ok := func(context.Context, peerid.ID, *PSRequest) *PSReply { return &PSReply{Status: PSOK} }
	net := flakyPSNet{self: "w", to: map[peerid.ID]PSHandler{"a": ok, "b": ok}, fail: &fail}
	pw := newPSWorker("w", net, cfg, &l, nil, nil)
	pw.calls[0].started = true
	r := pw.request(PSPull, 0)
	_, err = pw.call(pastDeadline{context.Background()}, 0, &r)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("call at the run's deadline: %v, want the deadline", err)
	}
	if pw.calls[0].onBackup || pw.failovers != 0 {
		t.Errorf("failed over at the run's deadline: %+v, %d failovers", pw.calls[0], pw.failovers)
	}
}
