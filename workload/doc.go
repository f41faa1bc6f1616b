// Package workload turns a model spec and a data source into what a peer
// trains: the training and test Datasets, a model constructor that fits
// them, an architecture identity peers compare before they average, and
// the training settings the workload trains well with. `peer train`,
// `peer run`, `peer experiment` and sim share it.
//
//	wl, err := workload.Load(workload.Config{Model: "charlm:layers=4,width=128", Seed: 1})
//	parts, err := data.Partition(wl.Train, peers, "iid", seed)
//	build, err := wl.Models(backend, initFile) // --device, --init ("": seed's weights)
//	w, err := train.NewWorker(cfg, data.Subset(wl.Train, parts[me]), train.WithModel(build))
//	swarmCfg.Gossip.Model = wl.ID() // peers of another architecture are ignored
//
// Two families:
//
//   - Image classifiers ("logreg", "mlp", "mlp:784-…-10", "2nn", "cnn") on
//     MNIST from the Go module cache (the default) or on a folder of IDX
//     files: MNIST's four file names are read as MNIST (its published
//     normalisation, as before), other *train-images*/*train-labels* and
//     *t10k-…* or *test-…* pairs with data.LoadIDX. The model's input and
//     output sizes come from the data; on MNIST each model is exactly the
//     one nn.New builds from the same name.
//   - A character-level language model ("charlm[:layers=L,width=W,
//     heads=H,ctx=T,mlp=R,dropout=P,level=byte|rune]", nn.NewCharLM) on a
//     text file or folder, by default the Go standard library's sources
//     (data.ReadGoSource). The corpus is split by document with Config.Seed
//     (a corpus of fewer than 10 documents holds out the tail of each
//     instead), the vocabulary is built from the training part, and the
//     test set is Config.ValWindows windows of the held-out text, spread
//     evenly over it.
//
// Every peer that reads the same data with the same Config derives the
// same split, vocabulary and model: ID is a digest of the model's
// architecture string, every parameter's name and shape and, for text,
// the vocabulary's digest, so peers whose vocabularies differ (even at
// the same size) never average their models.
//
// Like data, the package reads files and does nothing else: no network,
// no goroutines, no clock.
package workload
