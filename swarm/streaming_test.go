package swarm

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"

	"github.com/starling-ml/starling/peerid"
	"github.com/starling-ml/starling/train"
)

// cutMidway is a train.Net whose peer vanishes (no goodbye) 60 ms into
// the all-reduce of round at: with 50 ms links, after its first hop's
// chunks left and before the round can complete.
type cutMidway struct {
	train.Net
	at  uint64
	cut func()
}

// AllReduce vanishes the peer as it enters round at: cut off from the
// others before it sends anything, so the others, already in the round or
// about to be with it in their group, must complete it without it. (A cut
// on a timer after the round began raced the round: on a loaded machine
// the timer fired after the round had completed with the peer.)
func (c cutMidway) AllReduce(ctx context.Context, round uint64, group []peerid.ID, dst, src []float32, weight float64) ([]peerid.ID, error) {
	if round == c.at {
		c.cut()
		return nil, fmt.Errorf("cut off at round %d", round)
	}
	return c.Net.AllReduce(ctx, round, group, dst, src, weight)
}

// TestStreamingPeerLeavesMidFragmentOverMocknet: four Streaming DiLoCo
// peers on libp2p's mocknet with 50 ms links; one vanishes as the last
// fragment's all-reduce begins. The other three do not hang: within
// a stall timeout or two they complete that fragment among themselves (or
// two of them do, and the third takes their state) and end with the same
// global model.
func TestStreamingPeerLeavesMidFragmentOverMocknet(t *testing.T) {
	const n = 4
	ps, workers, ctx, mn := fedSwarmNet(t, n, 2000, mocknet.LinkOptions{Latency: 50 * time.Millisecond})
	cfg := train.DefaultFedConfig()
	if err := cfg.ParseStrategy("streaming-diloco:h=4,fragments=2"); err != nil {
		t.Fatal(err)
	}
	cfg.Rounds, cfg.Fraction = 2, 1 // rounds 1…4 of the all-reduce
	cfg.FragmentRetry = 2*testConfig().Aggregate.StallTimeout + time.Second
	const victim = 2
	vctx, vcancel := context.WithCancel(ctx)
	defer vcancel()
	var mu sync.Mutex
	last := make([]train.RoundInfo, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	rec := &train.MemRecorder{}
	start := time.Now()
	defer func() {
		if t.Failed() {
			for _, e := range rec.Events() {
				t.Logf("%v %.8s %s %s", e.At.Round(time.Millisecond), e.Peer, e.Kind, e.Detail)
			}
		}
	}()
	for i, p := range ps {
		net, pctx := p.Net(1), ctx
		if i == victim {
			net, pctx = cutMidway{Net: net, at: 4, cut: func() { cutOff(t, mn, ps, p); vcancel() }}, vctx
		}
		wg.Go(func() {
			errs[i] = train.Federated(pctx, workers[i], net, cfg, rec, func(ri train.RoundInfo) bool {
				mu.Lock()
				defer mu.Unlock()
				ri.Global = slices.Clone(ri.Global)
				last[i] = ri
				return false
			})
		})
	}
	wg.Wait()
	took := time.Since(start)
	var ref []float32
	for i := range ps {
		if i == victim {
			continue
		}
		if errs[i] != nil {
			t.Fatalf("peer %d: %v", i, errs[i])
		}
		// A survivor late by more than a stall timeout (a loaded
		// machine) is left out by the others and takes their state.
		if parts := last[i].Participants; last[i].Round != 2 || slices.Contains(parts, ps[victim].ID()) || len(parts) < 2 && !last[i].Synced {
			t.Fatalf("peer %d ended at outer step %d with %v (synced: %v)", i, last[i].Round, parts, last[i].Synced)
		}
		if ref == nil {
			ref = last[i].Global
		} else if !slices.Equal(ref, last[i].Global) {
			t.Fatalf("peer %d holds another global model", i)
		}
	}
	if stall := testConfig().Aggregate.StallTimeout; took > 4*stall {
		t.Errorf("took %v: the survivors waited for the vanished peer (stall timeout %v)", took, stall)
	}
}
