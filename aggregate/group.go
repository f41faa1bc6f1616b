package aggregate

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/starling-ml/starling/peerid"
)

// Group is who takes part in one attempt of one round, in the order that
// assigns ranks (tree positions, butterfly shards). Every peer that forms a
// group from the same member set and round gets the same order and the same
// Digest; chunks carry the digest, so peers that disagree find out at the
// first chunk. A Group is an immutable value.
type Group struct {
	round   uint64
	attempt uint16
	members []peerid.ID
	digest  uint64
}

// Form derives the group of a round from a membership set (order and
// duplicates do not matter): members sorted by a hash of (round, peer id),
// so the order, and with it the tree root and shard owners, rotates from
// round to round. It fails with ErrEmptyGroup for no members and ErrBadInput
// for an empty peer id.
func Form(round uint64, members []peerid.ID) (Group, error) {
	if len(members) == 0 {
		return Group{}, fmt.Errorf("%w: round %d", ErrEmptyGroup, round)
	}
	type keyed struct {
		id  peerid.ID
		key uint64
	}
	ks := make([]keyed, 0, len(members))
	seen := make(map[peerid.ID]bool, len(members))
	for _, p := range members {
		if p == "" {
			return Group{}, fmt.Errorf("%w: empty peer id in round %d", ErrBadInput, round)
		}
		if seen[p] {
			continue
		}
		seen[p] = true
		ks = append(ks, keyed{p, orderKey(round, p)})
	}
	slices.SortFunc(ks, func(a, b keyed) int {
		if c := cmp.Compare(a.key, b.key); c != 0 {
			return c
		}
		return cmp.Compare(a.id, b.id)
	})
	g := Group{round: round, members: make([]peerid.ID, len(ks))}
	for i, k := range ks {
		g.members[i] = k.id
	}
	g.digest = g.computeDigest()
	return g, nil
}

func orderKey(round uint64, p peerid.ID) uint64 {
	h := sha256.New()
	var b [8]byte
	h.Write([]byte("starling/aggregate/order/v1"))
	binary.LittleEndian.PutUint64(b[:], round)
	h.Write(b[:])
	h.Write([]byte(p))
	return binary.LittleEndian.Uint64(h.Sum(nil))
}

func (g Group) computeDigest() uint64 {
	h := sha256.New()
	var b [8]byte
	h.Write([]byte("starling/aggregate/group/v1"))
	binary.LittleEndian.PutUint64(b[:], g.round)
	h.Write(b[:])
	binary.LittleEndian.PutUint64(b[:], uint64(g.attempt))
	h.Write(b[:])
	binary.LittleEndian.PutUint64(b[:], uint64(len(g.members)))
	h.Write(b[:])
	for _, p := range g.members {
		binary.LittleEndian.PutUint64(b[:], uint64(len(p)))
		h.Write(b[:])
		h.Write([]byte(p))
	}
	return binary.LittleEndian.Uint64(h.Sum(nil))
}

// Round returns the round id.
func (g Group) Round() uint64 { return g.round }

// Attempt returns how many times the round's group was re-formed (0 for a
// group from Form).
func (g Group) Attempt() int { return int(g.attempt) }

// Digest returns a hash of (round, attempt, ordered members).
func (g Group) Digest() uint64 { return g.digest }

// Size returns the number of members.
func (g Group) Size() int { return len(g.members) }

// Member returns the member of rank i.
func (g Group) Member(i int) peerid.ID { return g.members[i] }

// Sorted returns the members sorted by ID, in a new slice.
func (g Group) Sorted() []peerid.ID { return peerid.Sorted(g.members) }

// Members returns the members in rank order; the slice is the caller's.
func (g Group) Members() []peerid.ID { return slices.Clone(g.members) }

// Rank returns p's rank, or -1 when p is not a member.
func (g Group) Rank(p peerid.ID) int { return slices.Index(g.members, p) }

// Without returns the group re-formed without the given peers: the next
// attempt, the survivors in their old relative order, and a new digest.
func (g Group) Without(drop ...peerid.ID) Group {
	ng := Group{round: g.round, attempt: g.attempt + 1}
	for _, p := range g.members {
		if !slices.Contains(drop, p) {
			ng.members = append(ng.members, p)
		}
	}
	ng.digest = ng.computeDigest()
	return ng
}

// at returns g at attempt a (same round and members, a new digest).
func (g Group) at(a uint16) Group {
	g.attempt = a
	g.digest = g.computeDigest()
	return g
}

func (g Group) String() string {
	return fmt.Sprintf("round %d attempt %d (%d peers, digest %016x)", g.round, g.attempt, len(g.members), g.digest)
}
