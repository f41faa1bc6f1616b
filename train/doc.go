// Package train wires data/, nn/ and (for the distributed strategies) the
// network packages into training loops. Local trains one model on one peer;
// the distributed strategies build on the same step function.
//
//	train, test, _ := data.LoadMNIST("")
//	sum, err := train.Local(ctx, train.DefaultLocalConfig(), trainSet, testSet, progressFn)
//
// The asynchronous and gossip strategies, RunAsync and RunGossip, take
// every protocol decision in a pure function of what they saw
// (asyncplan.go, gossipplan.go) and keep the waiting and I/O in a thin
// loop around it; their in-memory tests run in testing/synctest bubbles
// (docs/design.md).
//
// Loops check ctx between steps, stop with ErrDiverged when the loss stops
// being finite, and report progress through a callback that must not block.
//
// The round-based strategies, Federated and Sync, take every protocol
// decision in a pure function of what they saw (fedplan.go, syncplan.go)
// and keep the waiting and I/O in a thin loop around it. Time comes from
// the time package; the in-memory tests run those loops inside
// testing/synctest bubbles (docs/design.md).
package train
