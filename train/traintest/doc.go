// Package traintest holds in-memory fakes of the networks train's
// strategies run on, for tests and small experiments: Net (a train.Net
// over an aggregate.Runner and a shared Board) and the asynchronous and
// gossip fabrics. They implement the same interfaces swarm implements over
// libp2p, and behave as it does where a strategy can tell.
package traintest
