package staleness

import (
	"fmt"
	"math"
)

// HistBuckets is the number of buckets in a staleness histogram: τ = 0 …
// HistBuckets−2 each have their own bucket; the last holds τ ≥ HistBuckets−1.
const HistBuckets = 64

// Stats counts what happened to the contributions a Mixer or Buffer saw.
// Every contribution lands in exactly one of Accepted, Stale, Future, Shape
// and NonFinite.
type Stats struct {
	Accepted  uint64 // applied (or buffered) with weight s(τ)
	Stale     uint64 // rejected: τ beyond the SSP bound
	Future    uint64 // dropped: base version newer than local
	Shape     uint64 // dropped: wrong vector length
	NonFinite uint64 // dropped: NaN or Inf in the vector
	// Tau is the histogram of τ over accepted and stale contributions.
	Tau [HistBuckets]uint64
}

// Dropped returns the number of contributions not applied, for any reason.
func (s *Stats) Dropped() uint64 { return s.Stale + s.Future + s.Shape + s.NonFinite }

func (s *Stats) observeTau(tau uint64) {
	if tau >= HistBuckets-1 {
		tau = HistBuckets - 1
	}
	s.Tau[tau]++
}

func (s Stats) String() string {
	return fmt.Sprintf("accepted=%d stale=%d future=%d shape=%d nonfinite=%d",
		s.Accepted, s.Stale, s.Future, s.Shape, s.NonFinite)
}

// checkVector verifies that v has length n and holds only finite values,
// counting the failure in st. It reads v once and writes nothing.
func checkVector(st *Stats, v []float32, n int) error {
	if len(v) != n {
		st.Shape++
		return fmt.Errorf("%w: got %d values, model has %d", ErrShape, len(v), n)
	}
	for i, f := range v {
		if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
			st.NonFinite++
			return fmt.Errorf("%w: element %d is %v", ErrNonFinite, i, f)
		}
	}
	return nil
}

// decide computes τ of a contribution from base against clock and the
// policy's verdict, counting drops in st.
func decide(st *Stats, p Policy, clock *VersionClock, base Version) (Decision, error) {
	tau, err := clock.Staleness(base)
	if err != nil {
		st.Future++
		return Decision{Action: Reject}, err
	}
	st.observeTau(tau)
	d := p.Decide(tau)
	if d.Action != Accept {
		st.Stale++
	}
	return d, nil
}
