// Package swarm is one peer's driver: it owns the libp2p node, the gossip
// control plane, the all-reduce runner and the state service, and offers
// them to the training strategies in train/ through their narrow network
// interfaces (train.FedNet, …). Strategies never see libp2p; swarm never
// sees SGD.
//
//	p, err := swarm.Start(ctx, swarm.DefaultConfig())   // real host
//	p, err := swarm.Attach(h, cfg)                       // mocknet host
//	defer p.Close()
//	err = train.Federated(ctx, worker, p.FedNet(), fedCfg, rec, nil)
//
// The strategies that move models over node/ streams (FedAsync, FedBuff,
// AD-PSGD, SGP) run on a StreamNet: the peer's control plane for
// announcements and liveness, and a stream transport that
// NewStreamTransport starts on the node.
//
//	t, err := swarm.NewStreamTransport(p.Node, cfg.Gossip.Model, maxFetchBytes)
//	defer t.Close()
//	sum, err := train.RunAsync(ctx, worker, &swarm.StreamNet{CP: p.Control, T: t}, asyncCfg, rec)
//
// The parameter-server mode (train.RunPS) runs on a PSTransport: one
// stream per request over /starling/ps/1.0.0.
//
//	t := swarm.NewPSTransport(p.Node, maxPayload, stallTimeout)
//	defer t.Close()
//	sum, err := train.RunPS(ctx, worker, t, p.Members(), psCfg, rec)
//
// A peer whose training stops before the job's end (train.Leaver,
// train.SyncStatus's Done) says so in its heartbeat at once; the others
// leave it out of Members from then on, even while its node stays up.
//
// # State service
//
// Protocol /starling/state/1.0.0 serves the global state a peer last
// published (parameters, optimiser and strategy state: one []float32) so
// that a late or restarted peer can catch up instead of starting from
// scratch. A request names the minimum version it wants and how long the
// server may wait for it; the reply carries the version, the total length,
// the SHA-256 of the whole state and the requested stripe. Fetch first asks
// up to K peers for (version, digest), picks the pair most of them hold,
// pulls one stripe from each of those peers in parallel and checks the
// digest of the assembled state; on any disagreement it falls back to
// whole-state pulls from one peer at a time.
package swarm
