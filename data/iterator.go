package data

// Iterator walks a Dataset in shuffled mini-batches, reshuffling every
// epoch. The order depends only on the seed, the epoch number and Len. The
// slices returned by Batch are owned by the iterator and valid until the
// next call to Next.
type Iterator struct {
	ds      Dataset
	batch   int
	dim     int // float32 values per sample
	targets int // targets per sample
	seed    uint64
	epoch   int
	perm    []int
	pos     int
	x       []float32
	y       []int32
	n       int
	// DropLast skips the final batch of an epoch when it is short.
	DropLast bool
}

// NewIterator returns an iterator over ds with the given batch size.
func NewIterator(ds Dataset, batch int, seed uint64) *Iterator {
	if batch <= 0 {
		batch = 1
	}
	dim, targets := InputSize(ds), ds.Targets()
	it := &Iterator{ds: ds, batch: batch, dim: dim, targets: targets, seed: seed,
		x: make([]float32, batch*dim), y: make([]int32, batch*targets)}
	it.shuffle()
	return it
}

func (it *Iterator) shuffle() {
	it.perm = newRand(it.seed ^ uint64(it.epoch)*0x9e3779b97f4a7c15).Perm(it.ds.Len())
	it.pos = 0
}

// Epoch returns the number of completed passes over the data.
func (it *Iterator) Epoch() int { return it.epoch }

// Next advances to the next batch. At the end of an epoch it reshuffles and
// returns false once, so `for it.Next() {}` runs exactly one epoch.
func (it *Iterator) Next() bool {
	rest := len(it.perm) - it.pos
	if rest == 0 || (it.DropLast && rest < it.batch) {
		it.epoch++
		it.shuffle()
		return false
	}
	it.n = min(it.batch, rest)
	it.ds.Batch(it.perm[it.pos:it.pos+it.n], it.x[:it.n*it.dim], it.y[:it.n*it.targets])
	it.pos += it.n
	return true
}

// Batch returns the current batch: n samples of InputSize values each and
// their n·Targets targets.
func (it *Iterator) Batch() (x []float32, y []int32) {
	return it.x[:it.n*it.dim], it.y[:it.n*it.targets]
}

// BatchesPerEpoch returns the number of batches Next yields per epoch.
func (it *Iterator) BatchesPerEpoch() int {
	n := it.ds.Len()
	if it.DropLast {
		return n / it.batch
	}
	return (n + it.batch - 1) / it.batch
}
