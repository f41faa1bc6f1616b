package swarm

import (
	"context"

	"github.com/starling-ml/starling/train"
)

// joiningBit marks a heartbeat version that declares "joining at step
// version&^joiningBit" rather than "at step version" (see doneBit).
const joiningBit = 1 << 63

var (
	_ train.SyncNet    = syncNet{}
	_ train.SyncJoiner = syncNet{}
)

// SyncNet returns the peer as a train.SyncNet (and train.SyncJoiner) for
// synchronous data-parallel SGD. batch is this peer's batch size: it turns
// the pace train reports (steps/s) into the samples/s that heartbeats
// carry, and back.
//
// Statuses ride the gossip heartbeats: the heartbeat's model version is
// the peer's step, 2^63|T for a peer declaring that it joins at step T,
// or 2^62|S for a peer that stopped at step S (both are published at
// once, not at the next heartbeat). The
// state a joiner fetches goes through the state service, like a
// federated peer's.
func (p *Peer) SyncNet(batch int) train.SyncNet { return syncNet{p: p, batch: float64(max(batch, 1))} }

type syncNet struct {
	p     *Peer
	batch float64
}

func (s syncNet) Self() string { return s.p.ID() }

func (s syncNet) Members(ctx context.Context, step uint64) ([]string, error) {
	return s.p.Members(), nil
}

func (s syncNet) AllReduce(ctx context.Context, step uint64, group []string, dst, src []float32, weight float64) ([]string, error) {
	return train.AllReduceGroup(ctx, s.p.Runner, step, group, dst, src, weight)
}

func (s syncNet) SetStatus(ctx context.Context, st train.SyncStatus) error {
	sps := float32(st.Rate * s.batch)
	switch {
	case st.JoinAt != 0:
		s.p.Control.SetStatus(st.JoinAt&^doneBit|joiningBit, sps)
	case st.Done:
		s.p.Control.SetStatus(st.Step&^joiningBit|doneBit, sps)
	default:
		s.p.Control.SetStatus(st.Step&^(joiningBit|doneBit), sps)
		return nil
	}
	return s.p.Control.Beat(ctx)
}

func (s syncNet) Statuses() map[string]train.SyncStatus {
	peers := s.p.Control.Peers()
	out := make(map[string]train.SyncStatus, len(peers))
	for _, pi := range peers {
		st := train.SyncStatus{Step: pi.Version, Rate: float64(pi.SamplesPerSec) / s.batch}
		switch {
		case pi.Version&joiningBit != 0:
			st = train.SyncStatus{JoinAt: pi.Version &^ joiningBit, Rate: st.Rate}
		case stopped(pi.Version):
			st = train.SyncStatus{Step: pi.Version &^ doneBit, Done: true, Rate: st.Rate}
		}
		out[pi.ID.String()] = st
	}
	return out
}

// Publish serves state without touching the heartbeat's version (which
// carries the step, see SyncNet).
func (s syncNet) Publish(version uint64, state []float32) { s.p.state.publish(version, state) }

func (s syncNet) Fetch(ctx context.Context, peers []string, version uint64, dst []float32) (uint64, error) {
	return s.p.Fetch(ctx, peers, version, dst)
}
