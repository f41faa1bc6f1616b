package peerrun

import (
	"fmt"

	"github.com/starling-ml/starling/internal/attack"
	"github.com/starling-ml/starling/swarm"
	"github.com/starling-ml/starling/train"
)

// validateAttack refuses --attack without --allow-attack: a lying peer
// is for experiments only.
func (o *Options) validateAttack() error {
	if !o.Attack.IsZero() && !o.AllowAttack {
		return fmt.Errorf("%w: --attack %s makes this peer lie to the others: add --allow-attack to run it (experiments only)", ErrUsage, o.Attack)
	}
	return nil
}

// transformer returns the attack's transformer for this peer, or nil
// when it does not attack.
func (env *Env) transformer() *attack.Transformer {
	a := env.Opts.Attack
	if a.IsZero() {
		return nil
	}
	env.Log.Warn("this peer attacks the others (--attack)", "attack", a.String())
	return attack.NewTransformer(a, env.Opts.Worker.ModelSeed*7919+uint64(env.Opts.Shard)+1)
}

// roundNet returns the train.Net of the round-based modes: the peer's,
// or, with --attack, one that sends attacked contributions (models, in
// federated rounds; gradients in sync steps).
func (env *Env) roundNet(models bool) train.Net {
	net := env.Peer.Net(env.Opts.Worker.Batch)
	t := env.transformer()
	if t == nil {
		return net
	}
	var init []float32
	if models {
		init = env.Worker.Model.Params
	}
	return attack.WrapNet(net, t, models, init, env.Peer.Control.Announce)
}

// asyncNet returns net, or with --attack one that publishes attacked
// vectors.
func (env *Env) asyncNet(net *swarm.StreamNet) train.AsyncNet {
	t := env.transformer()
	if t == nil {
		return net
	}
	return attack.WrapAsyncNet(net, t, env.Peer.Control.Announce)
}

// gossipNet returns net, or with --attack one that sends attacked models.
func (env *Env) gossipNet(net *swarm.StreamNet) train.GossipNet {
	t := env.transformer()
	if t == nil {
		return net
	}
	return attack.WrapGossipNet(net, t)
}
