package average

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/starling-ml/starling/aggregate/rule"
	"github.com/starling-ml/starling/gossip/internal/avgtest"
	"github.com/starling-ml/starling/peerid"
)

// Consensus target of issue 6: max distance of any peer's model to the mean
// ≤ 1e-3 of the initial spread (the initial max distance to the mean).
const consensusTol = 1e-3

type inflight struct {
	to, due int
	x       []float32
	w       float64
}

// simPushSum runs synchronous rounds of push-sum on the one-peer
// exponential graph; each share arrives after a uniform random delay of
// 0…maxDelay rounds. It checks every round that the total weight (held
// plus in flight) is n and the total numerator is unchanged, and returns
// the rounds until consensus of the estimates.
func simPushSum(t *testing.T, n, d, maxDelay int, seed uint64) int {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 1))
	xs, mean := avgtest.Models(r, n, d)
	sum0 := make([]float64, d)
	for j := range sum0 {
		sum0[j] = mean[j] * float64(n)
	}
	st := make([]*PushSum, n)
	for i := range st {
		st[i] = NewPushSum(xs[i])
	}
	z := make([][]float32, n)
	spread0 := avgtest.Spread(xs, mean)
	var queue []inflight
	for k := range 1000 {
		for i, s := range st {
			x, w := s.Share(nil, 1)
			queue = append(queue, inflight{to: ExpGraphPeer(i, n, uint64(k)), due: k + r.IntN(maxDelay+1), x: x, w: w})
		}
		rest := queue[:0]
		for _, m := range queue {
			if m.due > k {
				rest = append(rest, m)
				continue
			}
			if err := st[m.to].Absorb(m.x, m.w); err != nil {
				t.Fatal(err)
			}
		}
		queue = rest
		// Invariants: Σw = n and Σx = Σx₀ over peers and messages in flight.
		wsum := 0.0
		xsum := make([]float64, d)
		for _, s := range st {
			wsum += s.W
			for j, v := range s.X {
				xsum[j] += float64(v)
			}
		}
		for _, m := range queue {
			wsum += m.w
			for j, v := range m.x {
				xsum[j] += float64(v)
			}
		}
		if math.Abs(wsum-float64(n)) > 1e-9 {
			t.Fatalf("round %d: Σw = %.15g, want %d", k, wsum, n)
		}
		for j := range xsum {
			if math.Abs(xsum[j]-sum0[j]) > 1e-4*float64(n) {
				t.Fatalf("round %d: Σx[%d] = %v, want %v", k, j, xsum[j], sum0[j])
			}
		}
		for i, s := range st {
			z[i] = s.Estimate(z[i])
		}
		if avgtest.Spread(z, mean) <= consensusTol*spread0 {
			return k + 1
		}
	}
	t.Fatalf("push-sum n=%d delay≤%d: no consensus in 1000 rounds", n, maxDelay)
	return 0
}

// simPairwise runs rounds of AD-PSGD pairwise averaging: in each round
// every active peer, in random order, averages with a random passive peer
// (n/2 exchanges, n vectors sent: as many as a push-sum round). It checks
// that the mean is conserved and returns the rounds until consensus.
func simPairwise(t *testing.T, n, d int, seed uint64) int {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 2))
	xs, mean := avgtest.Models(r, n, d)
	spread0 := avgtest.Spread(xs, mean)
	var actives []int
	for i := range n {
		if RoleOf(i) == Active {
			actives = append(actives, i)
		}
	}
	for k := range 10000 {
		r.Shuffle(len(actives), func(i, j int) { actives[i], actives[j] = actives[j], actives[i] })
		for _, a := range actives {
			p := PickPassive(r, n)
			if RoleOf(p) != Passive {
				t.Fatalf("PickPassive gave %d (%s)", p, RoleOf(p))
			}
			if err := PairwiseAverage(xs[a], xs[p]); err != nil {
				t.Fatal(err)
			}
		}
		if avgtest.Spread(xs, mean) <= consensusTol*spread0 {
			// The mean is conserved up to float32 rounding.
			for j := range mean {
				s := 0.0
				for _, x := range xs {
					s += float64(x[j])
				}
				if math.Abs(s/float64(n)-mean[j]) > 1e-4 {
					t.Fatalf("mean drifted: %v vs %v", s/float64(n), mean[j])
				}
			}
			return k + 1
		}
	}
	t.Fatalf("pairwise n=%d: no consensus in 10000 rounds", n)
	return 0
}

// TestConsensusRounds is the consensus check: 32 in-process peers,
// no training, simulated message passing. go test -v -run
// TestConsensusRounds ./gossip/average prints the rounds.
func TestConsensusRounds(t *testing.T) {
	const d = 256
	for _, tc := range []struct {
		n, delay int
	}{{32, 0}, {32, 2}, {32, 5}, {30, 0}, {30, 2}} {
		var rounds []int
		for seed := range uint64(5) {
			rounds = append(rounds, simPushSum(t, tc.n, d, tc.delay, seed))
		}
		t.Logf("push-sum  n=%d delay≤%d rounds: %v", tc.n, tc.delay, rounds)
		if tc.n == 32 && tc.delay == 0 {
			// With n a power of two, log2(n) rounds of halving on the
			// exponential graph average exactly (Assran et al. 2019).
			for _, k := range rounds {
				if k > 5 {
					t.Errorf("push-sum n=32 synchronous took %d rounds, want ≤ log2(32) = 5", k)
				}
			}
		}
	}
	for _, n := range []int{32, 30} {
		var rounds []int
		for seed := range uint64(5) {
			rounds = append(rounds, simPairwise(t, n, d, seed))
		}
		t.Logf("pairwise  n=%d rounds: %v", n, rounds)
	}
}

func TestPushSumWeightInvariant(t *testing.T) {
	// Arbitrary fan-outs and an absorb order that is not the send order.
	r := rand.New(rand.NewPCG(9, 9))
	const n = 7
	st := make([]*PushSum, n)
	for i := range st {
		st[i] = NewPushSum([]float32{float32(i), 1})
	}
	var held []inflight
	for range 500 {
		i := r.IntN(n)
		k := 1 + r.IntN(3)
		x, w := st[i].Share(nil, k)
		for range k {
			held = append(held, inflight{to: r.IntN(n), x: slices.Clone(x), w: w})
		}
		for len(held) > 0 && r.IntN(2) == 0 {
			j := r.IntN(len(held))
			m := held[j]
			held = slices.Delete(held, j, j+1)
			if err := st[m.to].Absorb(m.x, m.w); err != nil {
				t.Fatal(err)
			}
		}
		total := 0.0
		for _, s := range st {
			if !(s.W > 0) {
				t.Fatalf("weight %v", s.W)
			}
			total += s.W
		}
		for _, m := range held {
			total += m.w
		}
		if math.Abs(total-n) > 1e-12 {
			t.Fatalf("Σw = %.17g, want %d", total, n)
		}
	}
}

func TestPushSumAbsorbRejects(t *testing.T) {
	s := NewPushSum([]float32{1, 2})
	for _, c := range []struct {
		x    []float32
		w    float64
		want error
	}{
		{[]float32{1}, 0.5, ErrShape},
		{[]float32{1, float32(math.NaN())}, 0.5, ErrNonFinite},
		{[]float32{float32(math.Inf(1)), 1}, 0.5, ErrNonFinite},
		{[]float32{1, 1}, 0, ErrBadWeight},
		{[]float32{1, 1}, -1, ErrBadWeight},
		{[]float32{1, 1}, math.NaN(), ErrBadWeight},
		{[]float32{1, 1}, math.Inf(1), ErrBadWeight},
	} {
		if err := s.Absorb(c.x, c.w); !errors.Is(err, c.want) {
			t.Errorf("Absorb(%v, %v) = %v, want %v", c.x, c.w, err, c.want)
		}
	}
	if !slices.Equal(s.X, []float32{1, 2}) || s.W != 1 {
		t.Fatalf("rejected shares changed the state: %v %v", s.X, s.W)
	}
}

// TestPushSumCheckShare: whether a clipping SGP peer of a group of 4
// accepts a share.
func TestPushSumCheckShare(t *testing.T) {
	s := NewPushSum([]float32{1, 2})
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	for _, c := range []struct {
		name string
		x    []float32
		w    float64
		want error
	}{
		{"honest", []float32{1, 1}, 0.5, nil},
		{"the group's whole weight", []float32{1, 1}, 4, nil},
		{"heavier than the group", []float32{1, 1}, 4.5, ErrBadWeight},
		{"absurdly heavy", []float32{1, 1}, 1e30, ErrBadWeight},
		{"infinite weight", []float32{1, 1}, math.Inf(1), ErrBadWeight},
		{"NaN weight", []float32{1, 1}, math.NaN(), ErrBadWeight},
		{"no weight", []float32{1, 1}, 0, ErrBadWeight},
		{"negative weight", []float32{1, 1}, -0.5, ErrBadWeight},
		{"NaN", []float32{1, nan}, 0.5, ErrNonFinite},
		{"Inf", []float32{inf, 1}, 0.5, ErrNonFinite},
		{"shape", []float32{1}, 0.5, ErrShape},
	} {
		if err := s.checkShare(c.x, c.w, 4); !errors.Is(err, c.want) || (err == nil) != (c.want == nil) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	if !slices.Equal(s.X, []float32{1, 2}) || s.W != 1 {
		t.Fatalf("checks changed the state: %v %v", s.X, s.W)
	}
}

func TestExpGraph(t *testing.T) {
	for _, tc := range []struct{ n, m int }{{0, 0}, {1, 0}, {2, 1}, {3, 2}, {4, 2}, {5, 3}, {32, 5}, {33, 6}} {
		if got := ExpGraphOffsets(tc.n); got != tc.m {
			t.Errorf("ExpGraphOffsets(%d) = %d, want %d", tc.n, got, tc.m)
		}
	}
	if ExpGraphPeer(3, 1, 7) != 3 {
		t.Error("single peer sends to itself")
	}
	// n = 8: offsets cycle 1, 2, 4; every step is a permutation (each peer
	// receives exactly one share) and ExpGraphInPeer inverts it.
	for _, n := range []int{2, 5, 8, 30, 32} {
		for k := range uint64(12) {
			in := make([]int, n)
			for i := range n {
				j := ExpGraphPeer(i, n, k)
				if j == i {
					t.Fatalf("n=%d k=%d: %d sends to itself", n, k, i)
				}
				in[j]++
				if ExpGraphInPeer(j, n, k) != i {
					t.Fatalf("n=%d k=%d: InPeer(%d) = %d, want %d", n, k, j, ExpGraphInPeer(j, n, k), i)
				}
			}
			for j, c := range in {
				if c != 1 {
					t.Fatalf("n=%d k=%d: peer %d receives %d shares", n, k, j, c)
				}
			}
		}
	}
	if got := []int{ExpGraphPeer(0, 8, 0), ExpGraphPeer(0, 8, 1), ExpGraphPeer(0, 8, 2), ExpGraphPeer(0, 8, 3), ExpGraphPeer(7, 8, 2)}; !slices.Equal(got, []int{1, 2, 4, 1, 3}) {
		t.Errorf("n=8 out-neighbours %v", got)
	}
}

func TestPairwiseAverage(t *testing.T) {
	a, b := []float32{1, 2, 3}, []float32{3, 2, -3}
	if err := PairwiseAverage(a, b); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(a, []float32{2, 2, 0}) || !slices.Equal(b, a) {
		t.Fatalf("got %v %v", a, b)
	}
	c, d := []float32{1, 1}, []float32{1, float32(math.NaN())}
	if err := PairwiseAverage(c, d); !errors.Is(err, ErrNonFinite) || c[0] != 1 {
		t.Errorf("NaN: %v, %v", err, c)
	}
	if err := PairwiseAverage(c, d[:1]); !errors.Is(err, ErrShape) {
		t.Errorf("shape: %v", err)
	}
	if PickPassive(rand.New(rand.NewPCG(1, 1)), 1) != -1 {
		t.Error("PickPassive with one peer")
	}
}

func testIDs(n int) []peerid.ID {
	ids := make([]peerid.ID, n)
	for i := range ids {
		ids[i] = peerid.ID(fmt.Sprintf("peer-%02d", i))
	}
	return ids
}

// TestPushSumOverExchanger runs 32 push-sum peers concurrently over the
// in-memory Exchanger, with 10% of pushes failing before delivery. Peers
// step concurrently within a round (as training paces them in practice; a
// peer racing far ahead only drains its mass), with a barrier between
// rounds. Failed pushes are re-absorbed, so mass is conserved, and the
// peers reach consensus.
func TestPushSumOverExchanger(t *testing.T) {
	const n, d, maxRounds = 32, 64, 200
	r := rand.New(rand.NewPCG(4, 4))
	xs, mean := avgtest.Models(r, n, d)
	spread0 := avgtest.Spread(xs, mean)
	ids := testIDs(n)
	net := NewMemNetwork()
	var faultMu sync.Mutex
	fr := rand.New(rand.NewPCG(5, 5))
	errInjected := errors.New("injected")
	net.SetFault(func(from, to peerid.ID) error {
		faultMu.Lock()
		defer faultMu.Unlock()
		if fr.IntN(10) == 0 {
			return errInjected
		}
		return nil
	})
	peers := make([]*PushSumPeer, n)
	exs := make([]Exchanger, n)
	for i := range peers {
		peers[i] = NewPushSumPeer(xs[i])
		exs[i] = net.Join(ids[i], peers[i])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var failed atomic.Int64
	z := make([][]float32, n)
	rounds := 0
	for k := range uint64(maxRounds) {
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				err := peers[i].Step(ctx, exs[i], ids[ExpGraphPeer(i, n, k)], k, 0)
				if err != nil {
					if !errors.Is(err, ErrNotDelivered) || !errors.Is(err, errInjected) {
						t.Errorf("peer %d step %d: %v", i, k, err)
					}
					failed.Add(1)
				}
			})
		}
		wg.Wait()
		wsum := 0.0
		for i, p := range peers {
			wsum += p.Weight()
			z[i] = p.Estimate(z[i])
		}
		if math.Abs(wsum-n) > 1e-9 {
			t.Fatalf("round %d: Σw = %v, want %d", k, wsum, n)
		}
		if avgtest.Spread(z, mean) <= consensusTol*spread0 {
			rounds = int(k) + 1
			break
		}
	}
	if rounds == 0 {
		t.Fatalf("no consensus in %d rounds", maxRounds)
	}
	if failed.Load() == 0 {
		t.Fatal("no push failed: the fault injection did not run")
	}
	t.Logf("push-sum over MemNetwork, n=%d, %d failed pushes: consensus in %d rounds", n, failed.Load(), rounds)
	// Wrong algorithm is refused.
	if err := peers[0].HandleSwap(ids[1], nil, nil); err == nil {
		t.Error("push-sum peer accepted a swap")
	}
}

// TestPairwiseOverExchanger runs 16 active peers concurrently exchanging
// with 16 passive ones over the in-memory Exchanger, which calls the
// passive handler synchronously, so a wait cycle would deadlock the test.
// Active peers exchange concurrently within a round, with a barrier between
// rounds.
func TestPairwiseOverExchanger(t *testing.T) {
	const n, d, maxRounds = 32, 64, 500
	r := rand.New(rand.NewPCG(6, 6))
	xs, mean := avgtest.Models(r, n, d)
	spread0 := avgtest.Spread(xs, mean)
	ids := testIDs(n)
	net := NewMemNetwork()
	peers := make([]*PairwisePeer, n)
	exs := make([]Exchanger, n)
	for i := range peers {
		peers[i] = NewPairwisePeer(xs[i], RoleOf(i))
		exs[i] = net.Join(ids[i], peers[i])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	z := make([][]float32, n)
	rounds := 0
	for k := range maxRounds {
		var wg sync.WaitGroup
		for i := 0; i < n; i += 2 {
			wg.Go(func() {
				pr := rand.New(rand.NewPCG(uint64(i), uint64(k)))
				if err := peers[i].Exchange(ctx, exs[i], ids[PickPassive(pr, n)]); err != nil {
					t.Errorf("peer %d: %v", i, err)
				}
			})
		}
		wg.Wait()
		for i, p := range peers {
			z[i] = p.Model(z[i])
		}
		if avgtest.Spread(z, mean) <= consensusTol*spread0 {
			rounds = k + 1
			break
		}
	}
	if rounds == 0 {
		t.Fatalf("no consensus in %d rounds", maxRounds)
	}
	t.Logf("pairwise over MemNetwork, n=%d: consensus in %d rounds", n, rounds)
	// Roles are enforced: passive peers do not start, active ones do not serve.
	if err := peers[1].Exchange(ctx, exs[1], ids[3]); err == nil {
		t.Error("passive peer started an exchange")
	}
	if err := peers[0].Exchange(ctx, exs[0], ids[2]); !errors.Is(err, ErrNotDelivered) {
		t.Errorf("exchange with an active peer: %v, want ErrNotDelivered", err)
	}
	net.Leave(ids[3])
	if err := peers[0].Exchange(ctx, exs[0], ids[3]); !errors.Is(err, ErrUnknownPeer) {
		t.Errorf("exchange with a departed peer: %v", err)
	}
}

func BenchmarkPushSumShareAbsorb(b *testing.B) {
	for _, n := range []int{1 << 10, 1 << 20} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			r := rand.New(rand.NewPCG(1, 1))
			xs, _ := avgtest.Models(r, 2, n)
			s0, s1 := NewPushSum(xs[0]), NewPushSum(xs[1])
			var buf []float32
			b.SetBytes(int64(4 * n))
			b.ReportAllocs()
			for b.Loop() {
				var w float64
				buf, w = s0.Share(buf, 1)
				if err := s1.Absorb(buf, w); err != nil {
					b.Fatal(err)
				}
				s0, s1 = s1, s0
			}
			if math.Abs(s0.W+s1.W-2) > 1e-9 {
				b.Fatalf("Σw = %v", s0.W+s1.W)
			}
		})
	}
}

// TestPushSumPeerClip: with SetClip, a share heavier than the group's
// whole weight is refused and leaves the state alone; a share whose X/W
// lies far from the peer's is moved to within the radius (its weight
// kept); a share within the radius is absorbed exactly.
func TestPushSumPeerClip(t *testing.T) {
	p := NewPushSumPeer([]float32{1, 1, 1, 1})
	c := rule.NewDistanceClip()
	c.Factor = 1
	p.SetClip(c, 4)
	// Two honest senders set the radius: their X/W are 1 and 2 away.
	for i, off := range []float32{1, 2} {
		x := []float32{(1 + off) * 0.5, 0.5, 0.5, 0.5}
		if err := p.HandleShare(Share{From: peerid.ID(fmt.Sprint("h", i)), X: x, W: 0.5}); err != nil {
			t.Fatal(err)
		}
	}
	before := p.Estimate(nil)
	w := p.Weight()
	if err := p.HandleShare(Share{From: "liar", X: []float32{1, 1, 1, 1}, W: 5}); !errors.Is(err, ErrBadWeight) {
		t.Fatalf("share of weight 5 in a group of 4: %v, want ErrBadWeight", err)
	}
	if got := p.Estimate(nil); !slices.Equal(got, before) || p.Weight() != w {
		t.Fatal("a refused share changed the state")
	}
	clipped := p.Clipped()
	far := []float32{1000 * 0.5, 0.5, 0.5, 0.5}
	if err := p.HandleShare(Share{From: "liar", X: far, W: 0.5}); err != nil {
		t.Fatal(err)
	}
	after := p.Estimate(nil)
	var d float64
	for i := range after {
		d += float64(after[i]-before[i]) * float64(after[i]-before[i])
	}
	// The radius is the lower median of the other senders' distances
	// (at most 2): the estimate moves by at most w/(W+w) of it.
	if math.Sqrt(d) > 2*0.5/(w+0.5)+1e-6 || p.Weight() != w+0.5 || p.Clipped() != clipped+1 {
		t.Fatalf("far share moved the estimate by %v (weight %v, clipped %d)", math.Sqrt(d), p.Weight(), p.Clipped())
	}
	near := p.Estimate(nil)
	x := make([]float32, len(near))
	for i, v := range near {
		x[i] = v * 0.25
	}
	want := append([]float32(nil), p.st.X...)
	for i := range want {
		want[i] += x[i]
	}
	if err := p.HandleShare(Share{From: "h0", X: x, W: 0.25}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(p.st.X, want) || p.Clipped() != clipped+1 {
		t.Fatalf("near share: X %v, want %v exactly", p.st.X, want)
	}
}
