package sim

import (
	"context"
	"errors"
	"testing"

	"github.com/starling-ml/starling/peerid"
	"github.com/starling-ml/starling/train"
)

// selfNet is a train.Net that knows only its own ID and drops statuses,
// as a swarm whose heartbeats have not yet arrived.
type selfNet struct {
	train.Net
	id peerid.ID
}

func (n selfNet) Self() peerid.ID                               { return n.id }
func (n selfNet) SetStatus(context.Context, train.Status) error { return nil }
func (n selfNet) Statuses() map[peerid.ID]train.Status          { return nil }

// TestFixedMembersStatuses checks that a federation's clients see each
// other's latest status at once, not when heartbeats bring it: sampled
// clients align on it and would otherwise start from stale models.
func TestFixedMembersStatuses(t *testing.T) {
	board := &statusBoard{st: map[peerid.ID]train.Status{}}
	a := fixedMembers{Net: selfNet{id: "a"}, group: []peerid.ID{"a", "b"}, board: board}
	b := fixedMembers{Net: selfNet{id: "b"}, group: []peerid.ID{"a", "b"}, board: board}
	if err := a.SetStatus(context.Background(), train.Status{Version: 7}); err != nil {
		t.Fatal(err)
	}
	if got := b.Statuses(); len(got) != 1 || got["a"].Version != 7 {
		t.Errorf("b sees %v, want a at version 7", got)
	}
	if got := a.Statuses(); len(got) != 0 {
		t.Errorf("a sees %v, want no one (itself left out)", got)
	}
}

// TestFederationBoundedGroups: 12 clients in groups of at most 4 (three
// groups, re-drawn each round) over mocknet. Each round's averaging keeps
// about (k−1)/(n−1) = 2/11 of the spread of the local models, the groups'
// models differ after it, and the clients learn.
func TestFederationBoundedGroups(t *testing.T) {
	tr, te := mnist(t)
	fed := train.DefaultFedConfig()
	fed.Rounds, fed.Fraction, fed.GroupSize, fed.LocalEpochs = 2, 1, 4, 1
	wc := train.DefaultWorkerConfig()
	wc.Model, wc.Batch, wc.LR, wc.Optimizer = "logreg", 10, 0.05, "sgd"
	cfg := FedConfig{Clients: 12, Partition: "iid", Fed: fed, Worker: wc, Seed: 1, Consensus: true}
	res, err := Federation(context.Background(), cfg, tr.Head(2400), te.Head(1000), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Consensus) != 2 {
		t.Fatalf("consensus of %d rounds: %+v", len(res.Consensus), res.Consensus)
	}
	for _, c := range res.Consensus {
		t.Logf("%+v", c)
		if c.Participants != 12 || c.Groups != 3 {
			t.Errorf("round %d: %d participants in %d groups, want 12 in 3", c.Round, c.Participants, c.Groups)
		}
		if !(c.After > 0) || c.Ratio > 0.6 {
			t.Errorf("round %d: spread %.3g before, %.3g after", c.Round, c.Before, c.After)
		}
	}
	if res.FinalMean < 0.7 {
		t.Errorf("final mean accuracy %.3f", res.FinalMean)
	}
}

// TestEndedEarly: a federation that stopped before its last round without
// reaching its target is an error naming the round, not a result.
func TestEndedEarly(t *testing.T) {
	for _, c := range []struct {
		res    FedResult
		rounds int
		early  bool
	}{
		{FedResult{RoundsToTarget: -1, Rounds: 20}, 20, false},
		{FedResult{RoundsToTarget: 5, Rounds: 5}, 20, false}, // stopped at the target
		{FedResult{RoundsToTarget: -1, Rounds: 7}, 20, true},
		{FedResult{RoundsToTarget: -1}, 3, true}, // no round reported
	} {
		err := ended(&c.res, c.rounds)
		if early := errors.Is(err, ErrEndedEarly); early != c.early {
			t.Errorf("%+v of %d rounds: %v, want early %v", c.res, c.rounds, err, c.early)
		}
	}
}

// TestPendingBoardHoldsUnstartedClients: until a client says otherwise,
// the others see it as started but not joined (train.JoinPending), so no
// round takes it in. A client with no status at all counted as a member
// of round 1 (no JoinAt): sampled before it ran, it never answered, and
// 256 clients started one by one lost rounds 1 and 2.
func TestPendingBoardHoldsUnstartedClients(t *testing.T) {
	ids := []peerid.ID{"a", "b", "c"}
	board := pendingBoard(ids)
	a := fixedMembers{Net: selfNet{id: "a"}, group: ids, board: board}
	b := fixedMembers{Net: selfNet{id: "b"}, group: ids, board: board}
	if err := a.SetStatus(context.Background(), train.Status{JoinAt: 1}); err != nil {
		t.Fatal(err)
	}
	got := b.Statuses()
	if len(got) != 2 || got["a"].JoinAt != 1 || got["c"].JoinAt != train.JoinPending {
		t.Errorf("b sees %v, want a joining at 1 and c pending", got)
	}
}

// statusNet records the last status given to the swarm.
type statusNet struct {
	selfNet
	got *train.Status
}

func (n statusNet) SetStatus(_ context.Context, st train.Status) error {
	*n.got = st
	return nil
}

// TestFixedMembersKeepJoinOffTheSwarm: a client's declaration goes to the
// board only. The swarm sends a status naming a JoinAt at once, over
// GossipSub to every peer: 256 clients' declarations took 8–40 s of the
// process's CPU, and the clients' first rounds disagreed on their groups.
func TestFixedMembersKeepJoinOffTheSwarm(t *testing.T) {
	var got train.Status
	ids := []peerid.ID{"a", "b"}
	board := pendingBoard(ids)
	a := fixedMembers{Net: statusNet{selfNet{id: "a"}, &got}, group: ids, board: board}
	if err := a.SetStatus(context.Background(), train.Status{Version: 3, JoinAt: 5}); err != nil {
		t.Fatal(err)
	}
	if got != (train.Status{Version: 3}) {
		t.Errorf("the swarm got %+v, want version 3 and no JoinAt", got)
	}
	if st := board.others("b")["a"]; st.JoinAt != 5 || st.Version != 3 {
		t.Errorf("the board holds %+v, want version 3 joining at 5", st)
	}
	if err := a.SetStatus(context.Background(), train.Status{Version: 4, Done: true}); err != nil {
		t.Fatal(err)
	}
	if !got.Done {
		t.Errorf("the swarm got %+v, want Done", got)
	}
}
