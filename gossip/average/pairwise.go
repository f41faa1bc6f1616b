package average

import (
	"fmt"
	"math/rand/v2"
)

// PairwiseAverage is AD-PSGD's atomic averaging step (Lian et al. 2018):
// both a and b become (a+b)/2. The two must have the same length
// (ErrShape) and hold finite values (ErrNonFinite); on error neither is
// changed.
func PairwiseAverage(a, b []float32) error {
	if len(a) != len(b) {
		return fmt.Errorf("%w: %d and %d values", ErrShape, len(a), len(b))
	}
	if i := firstNonFinite(a); i >= 0 {
		return fmt.Errorf("%w: element %d is %v", ErrNonFinite, i, a[i])
	}
	if i := firstNonFinite(b); i >= 0 {
		return fmt.Errorf("%w: element %d is %v", ErrNonFinite, i, b[i])
	}
	b = b[:len(a)]
	for i := range a {
		m := float32((float64(a[i]) + float64(b[i])) / 2)
		a[i], b[i] = m, m
	}
	return nil
}

// Role is a peer's part in AD-PSGD's deadlock-free pairing. Peers are split
// into two sets: active peers start exchanges, passive peers only answer
// them. A passive peer never waits on anyone while it holds its model, so
// no cycle of waits, and hence no deadlock, can form; an active peer waits
// on at most one passive peer, with a deadline.
type Role uint8

// Roles.
const (
	Active Role = iota
	Passive
)

func (r Role) String() string {
	if r == Active {
		return "active"
	}
	return "passive"
}

// RoleOf returns the role of the peer at index i of the sorted peer list:
// even indices are active, odd ones passive (the bipartite split of
// AD-PSGD). With one peer it is active and has no partner.
func RoleOf(i int) Role {
	if i%2 == 0 {
		return Active
	}
	return Passive
}

// PickPassive returns a uniformly random passive partner (an odd index
// below n) for an active peer, or −1 when there is none (n < 2).
func PickPassive(r *rand.Rand, n int) int {
	np := n / 2 // odd indices below n
	if np == 0 {
		return -1
	}
	return 2*r.IntN(np) + 1
}
