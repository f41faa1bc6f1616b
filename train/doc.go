// Package train wires data/, nn/ and (for the distributed strategies) the
// network packages into training loops. Local trains one model on one peer;
// the distributed strategies build on the same step function.
//
//	train, test, _ := data.LoadMNIST("")
//	sum, err := train.Local(ctx, train.DefaultLocalConfig(), trainSet, testSet, progressFn)
//
// Loops check ctx between steps, stop with ErrDiverged when the loss stops
// being finite, and report progress through a callback that must not block.
package train
