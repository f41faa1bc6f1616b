package data

// Iterator walks a Set in shuffled mini-batches, reshuffling every epoch.
// The order depends only on the seed and the epoch number. The slices
// returned by Batch are owned by the iterator and valid until the next call
// to Next.
type Iterator struct {
	set   *Set
	batch int
	seed  uint64
	epoch int
	perm  []int
	pos   int
	x     []float32
	y     []int32
	n     int
	// DropLast skips the final batch of an epoch when it is short.
	DropLast bool
}

// NewIterator returns an iterator over s with the given batch size.
func NewIterator(s *Set, batch int, seed uint64) *Iterator {
	if batch <= 0 {
		batch = 1
	}
	it := &Iterator{set: s, batch: batch, seed: seed, x: make([]float32, batch*s.Dim), y: make([]int32, batch)}
	it.shuffle()
	return it
}

func (it *Iterator) shuffle() {
	it.perm = newRand(it.seed ^ uint64(it.epoch)*0x9e3779b97f4a7c15).Perm(it.set.Len())
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
	d := it.set.Dim
	for k := 0; k < it.n; k++ {
		i := it.perm[it.pos+k]
		copy(it.x[k*d:(k+1)*d], it.set.Sample(i))
		it.y[k] = it.set.Y[i]
	}
	it.pos += it.n
	return true
}

// Batch returns the current batch: n×Dim features and n labels.
func (it *Iterator) Batch() (x []float32, y []int32) {
	return it.x[:it.n*it.set.Dim], it.y[:it.n]
}

// BatchesPerEpoch returns the number of batches Next yields per epoch.
func (it *Iterator) BatchesPerEpoch() int {
	n := it.set.Len()
	if it.DropLast {
		return n / it.batch
	}
	return (n + it.batch - 1) / it.batch
}
