package aggregate

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"slices"

	"github.com/starling-ml/starling/peerid"
)

// Partition splits members into bounded averaging groups for round, the way
// hivemind's matchmaking bounds its groups, but with no messages: every peer
// that calls it with the same (seed, round, members, size) gets the same
// groups, whatever the order of members and duplicates in it.
//
// With n distinct members and size ≥ 1 there are k = ⌈n/size⌉ groups whose
// sizes differ by at most one (so each is at most size); with size < 1 or
// n ≤ size, one group of everyone. Members are ordered by a hash of (seed,
// round, peer) and cut into consecutive runs, so the groups are re-drawn
// each round and information mixes between them: averaging within random
// groups shrinks the spread of the peers' vectors (their mean squared
// distance to the mean of all) by (k−1)/(n−1) a round in expectation, which
// is (n−g)/(g(n−1)) ≈ 1/g for k groups of g (TestPartitionMixing). Each group is sorted; the groups
// are in no meaningful order. An empty peer id is kept as any other (Form
// refuses it when the group's round runs).
func Partition(seed, round uint64, members []peerid.ID, size int) [][]peerid.ID {
	ids := peerid.Sorted(members)
	n := len(ids)
	if n == 0 {
		return nil
	}
	if size < 1 || n <= size {
		return [][]peerid.ID{ids}
	}
	type keyed struct {
		id  peerid.ID
		key uint64
	}
	ks := make([]keyed, n)
	for i, p := range ids {
		ks[i] = keyed{p, partitionKey(seed, round, p)}
	}
	slices.SortFunc(ks, func(a, b keyed) int {
		if c := cmp.Compare(a.key, b.key); c != 0 {
			return c
		}
		return cmp.Compare(a.id, b.id)
	})
	k := (n + size - 1) / size
	base, extra := n/k, n%k
	out := make([][]peerid.ID, k)
	at := 0
	for i := range out {
		m := base
		if i < extra {
			m++
		}
		g := make([]peerid.ID, m)
		for j := range g {
			g[j] = ks[at+j].id
		}
		at += m
		slices.Sort(g)
		out[i] = g
	}
	return out
}

// GroupOf returns the group of Partition(seed, round, members, size) that
// holds self, or nil when self is not among members.
func GroupOf(seed, round uint64, members []peerid.ID, size int, self peerid.ID) []peerid.ID {
	for _, g := range Partition(seed, round, members, size) {
		if _, ok := slices.BinarySearch(g, self); ok {
			return g
		}
	}
	return nil
}

// partitionKey is a peer's place in round's draw. It is independent of
// orderKey (a group's rank order) and of train.Sample's hash, so the peers
// a round samples are not cut into groups by their sampling order.
func partitionKey(seed, round uint64, p peerid.ID) uint64 {
	h := sha256.New()
	var b [16]byte
	h.Write([]byte("starling/aggregate/partition/v1"))
	binary.LittleEndian.PutUint64(b[:8], seed)
	binary.LittleEndian.PutUint64(b[8:], round)
	h.Write(b[:])
	h.Write([]byte(p))
	var sum [sha256.Size]byte
	return binary.LittleEndian.Uint64(h.Sum(sum[:0]))
}
