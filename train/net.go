package train

import (
	"context"

	"github.com/starling-ml/starling/peerid"
)

// Net is what the round-based strategies, Federated and Sync, need from
// the network: who is live, an all-reduce, a state service for peers that
// fall behind, and a status each peer tells the others. swarm.Peer.Net
// implements it over libp2p; traintest.Net in memory. Implementations are
// safe for concurrent use, and every blocking call honours ctx.
type Net interface {
	// Self returns this peer's ID.
	Self() peerid.ID
	// Members returns the sorted IDs of the live peers, Self included,
	// less those whose status says Done.
	Members() []peerid.ID
	// AllReduce sets dst to the weighted mean of the src vectors of group
	// (which includes Self) for round, and returns the sorted IDs of the
	// peers whose contributions it holds.
	AllReduce(ctx context.Context, round uint64, group []peerid.ID, dst, src []float32, weight float64) ([]peerid.ID, error)
	// Publish serves state, the state after version, to Fetch. The
	// network keeps its own copy.
	Publish(version uint64, state []float32)
	// Fetch fills dst with the state one of peers published for a version
	// ≥ version (waiting for one until ctx ends) and returns its version.
	Fetch(ctx context.Context, peers []peerid.ID, version uint64, dst []float32) (uint64, error)
	// SetStatus tells the other peers where this peer is. A status with
	// JoinAt or Done set is sent before SetStatus returns; others go out
	// with the next periodic announcement.
	SetStatus(ctx context.Context, st Status) error
	// Statuses returns the last status heard from each other live peer.
	Statuses() map[peerid.ID]Status
}

// JoinPending is the JoinAt of a federated peer that has started but not
// yet chosen the round it joins: no round takes it in (see Federated). A
// network that starts a peer's heartbeats before its strategy runs sends
// it from the first one (swarm.WithJoinPending).
const JoinPending = ^uint64(0)

// Status is what a peer tells the others about its progress.
type Status struct {
	// Version is the number of rounds (federated) or steps (sync) the
	// peer has applied: its model version.
	Version uint64
	// JoinAt, when not 0, says the peer waits to join a synchronous job
	// at that step (and Version is not meaningful). A federated peer
	// names the first round it takes part in (and Version stays
	// meaningful); JoinPending says it has not chosen one yet.
	JoinAt uint64
	// Done says the peer stopped training before the job's end and takes
	// part in nothing more, although it may still be reachable. (A peer
	// that finished the job is not Done: latecomers fetch the final state
	// from it.)
	Done bool
	// Rate is the peer's pace in steps per second (0 if unknown).
	Rate float64
}
