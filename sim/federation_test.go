package sim

import (
	"context"
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
