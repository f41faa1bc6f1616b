package swarm

import (
	"context"

	"github.com/starling-ml/starling/gossip/wire"
	"github.com/starling-ml/starling/peerid"
	"github.com/starling-ml/starling/train"
)

// Net returns the peer as a train.Net, for the federated and synchronous
// strategies. batch is this peer's batch size: it turns the pace a
// status gives (steps/s) into the samples/s that heartbeats carry, and
// back. Statuses ride the gossip heartbeats; a status with JoinAt or
// Done set is sent at once, not at the next heartbeat. States go through
// the state service.
func (p *Peer) Net(batch int) train.Net { return trainNet{p: p, batch: float64(max(batch, 1))} }

type trainNet struct {
	p     *Peer
	batch float64
}

var _ train.Net = trainNet{}

func (n trainNet) Self() peerid.ID { return n.p.ID() }

func (n trainNet) Members() []peerid.ID { return n.p.Members() }

func (n trainNet) AllReduce(ctx context.Context, round uint64, group []peerid.ID, dst, src []float32, weight float64) ([]peerid.ID, error) {
	res, err := n.p.Runner.AllReduceAmong(ctx, round, group, dst, src, weight)
	if err != nil {
		return nil, err
	}
	return res.Group.Sorted(), nil
}

func (n trainNet) Publish(version uint64, state []float32) { n.p.state.publish(version, state) }

func (n trainNet) Fetch(ctx context.Context, peers []peerid.ID, version uint64, dst []float32) (uint64, error) {
	return n.p.Fetch(ctx, peers, version, dst)
}

func (n trainNet) SetStatus(ctx context.Context, st train.Status) error {
	n.p.Control.SetStatus(wire.Status{Version: st.Version, JoinAt: st.JoinAt, Stopped: st.Done, SamplesPerSec: float32(st.Rate * n.batch)})
	if st.JoinAt == 0 && !st.Done {
		return nil
	}
	return n.p.Control.Beat(ctx)
}

func (n trainNet) Statuses() map[peerid.ID]train.Status {
	peers := n.p.Control.Peers()
	out := make(map[peerid.ID]train.Status, len(peers))
	for _, pi := range peers {
		out[pi.ID] = train.Status{Version: pi.Version, JoinAt: pi.JoinAt, Done: pi.Stopped, Rate: float64(pi.SamplesPerSec) / n.batch}
	}
	return out
}
