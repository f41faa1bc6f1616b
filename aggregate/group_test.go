package aggregate

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/starling-ml/starling/peerid"
)

func peers(n int) []peerid.ID {
	ps := make([]peerid.ID, n)
	for i := range ps {
		ps[i] = peerid.ID(fmt.Sprintf("12D3KooW%04d", i))
	}
	return ps
}

func TestFormIsDeterministic(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	ps := peers(9)
	base, err := Form(17, ps)
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		shuffled := slices.Clone(ps)
		rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		shuffled = append(shuffled, shuffled[:3]...) // duplicates do not matter
		g, err := Form(17, shuffled)
		if err != nil {
			t.Fatal(err)
		}
		if g.Digest() != base.Digest() || !slices.Equal(g.Members(), base.Members()) {
			t.Fatalf("order depends on input order: %v vs %v", g.Members(), base.Members())
		}
	}
	if base.Size() != 9 || base.Round() != 17 || base.Attempt() != 0 {
		t.Fatalf("group %v", base)
	}
	for i := range base.Size() {
		if base.Rank(base.Member(i)) != i {
			t.Fatal("Rank and Member disagree")
		}
	}
	if base.Rank("nobody") != -1 {
		t.Fatal("Rank of a non-member")
	}
}

func TestFormRotates(t *testing.T) {
	ps := peers(8)
	roots := map[peerid.ID]bool{}
	digests := map[uint64]bool{}
	for round := range uint64(64) {
		g, _ := Form(round, ps)
		roots[g.Member(0)] = true
		digests[g.Digest()] = true
	}
	if len(roots) < 6 {
		t.Errorf("only %d of 8 peers were ever the root in 64 rounds", len(roots))
	}
	if len(digests) != 64 {
		t.Errorf("%d distinct digests in 64 rounds", len(digests))
	}
}

func TestGroupDigestCoversMembers(t *testing.T) {
	ps := peers(5)
	g, _ := Form(3, ps)
	other, _ := Form(3, ps[:4])
	if g.Digest() == other.Digest() {
		t.Error("digest ignores membership")
	}
	w := g.Without(ps[2], "not-a-member")
	if w.Attempt() != 1 || w.Size() != 4 || w.Rank(ps[2]) != -1 || w.Digest() == g.Digest() {
		t.Fatalf("Without: %v %v", w, w.Members())
	}
	// Survivors keep their relative order.
	var want []peerid.ID
	for _, p := range g.Members() {
		if p != ps[2] {
			want = append(want, p)
		}
	}
	if !slices.Equal(w.Members(), want) {
		t.Errorf("Without reordered: %v, want %v", w.Members(), want)
	}
	// Attempt is in the digest: the same members at another attempt differ.
	f, _ := Form(3, want)
	if slices.Equal(f.Members(), w.Members()) && f.Digest() == w.Digest() {
		t.Error("digest ignores the attempt")
	}
	// Members returns a copy.
	m := g.Members()
	m[0] = "mutated"
	if g.Member(0) == "mutated" {
		t.Error("Members aliases the group")
	}
}

func TestFormErrors(t *testing.T) {
	if _, err := Form(1, nil); !errors.Is(err, ErrEmptyGroup) {
		t.Errorf("empty: %v", err)
	}
	if _, err := Form(1, []peerid.ID{"a", ""}); !errors.Is(err, ErrBadInput) {
		t.Errorf("empty id: %v", err)
	}
}

func TestShardAndChunkRanges(t *testing.T) {
	for d := range 50 {
		for n := 1; n <= 9; n++ {
			next, sizes := 0, map[int]bool{}
			for j := range n {
				off, size := shardRange(d, n, j)
				if off != next || size < 0 {
					t.Fatalf("d=%d n=%d shard %d: [%d,+%d), want start %d", d, n, j, off, size, next)
				}
				sizes[size] = true
				next = off + size
				for _, c := range []int{1, 3, 64} {
					cnext := off
					for k := range numChunks(size, c) {
						lo, hi := chunkRange(off, size, c, k)
						if lo != cnext || hi <= lo || hi-lo > c {
							t.Fatalf("chunk %d of [%d,+%d) by %d: [%d,%d)", k, off, size, c, lo, hi)
						}
						cnext = hi
					}
					if cnext != off+size {
						t.Fatalf("chunks of [%d,+%d) by %d end at %d", off, size, c, cnext)
					}
				}
			}
			if next != d || len(sizes) > 2 {
				t.Fatalf("d=%d n=%d: shards cover %d, sizes %v", d, n, next, sizes)
			}
		}
	}
}

func TestTreeShape(t *testing.T) {
	for _, tc := range []struct{ r, n, h, depth int }{
		{0, 1, 0, 0}, {0, 2, 1, 0}, {0, 3, 1, 0}, {0, 4, 2, 0}, {0, 7, 2, 0}, {0, 8, 3, 0},
		{1, 4, 1, 1}, {2, 4, 0, 1}, {3, 4, 0, 2}, {1, 7, 1, 1}, {6, 7, 0, 2}, {7, 8, 0, 3},
	} {
		if h := treeHeight(tc.r, tc.n); h != tc.h {
			t.Errorf("height(%d of %d) = %d, want %d", tc.r, tc.n, h, tc.h)
		}
		if d := treeDepth(tc.r); d != tc.depth {
			t.Errorf("depth(%d) = %d, want %d", tc.r, d, tc.depth)
		}
	}
}

func TestMailbox(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	g, _ := Form(5, []peerid.ID{"a", "b"})
	tag := Tag{Round: 5, Digest: g.Digest(), Step: StepScatter, Chunk: 1}
	m := NewMailbox(0)
	m.Scope(g)

	// Deliver before Recv, and Recv before Deliver.
	if err := m.Deliver("a", tag, []float32{1, 2}); err != nil {
		t.Fatal(err)
	}
	dst := make([]float32, 2)
	if err := m.Recv(ctx, "a", tag, dst); err != nil || dst[1] != 2 {
		t.Fatal(err, dst)
	}
	done := make(chan error)
	go func() { done <- m.Recv(ctx, "b", tag, dst) }()
	for m.waiting() == 0 {
		time.Sleep(time.Millisecond)
	}
	if err := m.Recv(ctx, "b", tag, dst); !errors.Is(err, ErrDuplicateRecv) {
		t.Errorf("second Recv: %v", err)
	}
	if err := m.Deliver("b", tag, []float32{3, 4}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil || dst[0] != 3 {
		t.Fatal(err, dst)
	}

	// Duplicate, wrong length, wrong digest.
	_ = m.Deliver("a", tag, []float32{1})
	if err := m.Deliver("a", tag, []float32{1}); !errors.Is(err, ErrBadValue) {
		t.Errorf("duplicate: %v", err)
	}
	var pe *PeerError
	if err := m.Recv(ctx, "a", tag, dst); !errors.Is(err, ErrBadLength) || !errors.As(err, &pe) || pe.Peer != "a" {
		t.Errorf("length: %v", err)
	}
	bad := tag
	bad.Digest++
	_ = m.Deliver("b", bad, []float32{7, 8})
	var me *MismatchError
	if err := m.Recv(ctx, "b", tag, dst); !errors.As(err, &me) || me.Got != bad.Digest || me.Peer != "b" || dst[0] != 7 {
		t.Errorf("mismatch: %v %v", err, dst)
	}

	// Outsiders are refused and reported once; stale chunks are refused.
	if err := m.Deliver("x", tag, []float32{1, 2}); !errors.Is(err, ErrNotMember) {
		t.Errorf("outsider: %v", err)
	}
	_ = m.Deliver("x", tag, []float32{1, 2})
	if rej := m.Rejected(5); len(rej) != 1 || rej[0].Peer != "x" {
		t.Errorf("Rejected: %v", rej)
	}
	if rej := m.Rejected(5); len(rej) != 0 {
		t.Errorf("Rejected not drained: %v", rej)
	}
	future := tag
	future.Round = 6
	if err := m.Deliver("x", future, []float32{1}); err != nil {
		t.Errorf("a future round is buffered: %v", err)
	}
	g2 := g.Without()
	m.Scope(g2)
	if err := m.Deliver("a", tag, []float32{1, 2}); !errors.Is(err, ErrStale) {
		t.Errorf("stale: %v", err)
	}
	if p := m.Pending(); p != 1 {
		t.Errorf("Pending %d after scoping a later attempt, want the future chunk only", p)
	}

	// Timeouts leave nothing behind; Close fails waiters.
	short, c2 := context.WithTimeout(ctx, 10*time.Millisecond)
	defer c2()
	if err := m.Recv(short, "a", tag, dst); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("timeout: %v", err)
	}
	go func() { done <- m.Recv(ctx, "a", future, dst) }()
	for m.waiting() == 0 {
		time.Sleep(time.Millisecond)
	}
	m.Close()
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Errorf("after Close: %v", err)
	}
	if err := m.Deliver("a", tag, nil); !errors.Is(err, ErrClosed) {
		t.Errorf("Deliver after Close: %v", err)
	}

	// The byte limit.
	small := NewMailbox(16)
	if err := small.Deliver("a", tag, make([]float32, 5)); !errors.Is(err, ErrMailboxFull) {
		t.Errorf("limit: %v", err)
	}
}

// waiting counts Recvs blocked in m (tests only).
func (m *Mailbox) waiting() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, s := range m.slots {
		if s.waiter != nil {
			n++
		}
	}
	return n
}

func TestWireRoundTrip(t *testing.T) {
	h := header{cfg: 0xdeadbeefcafef00d, d: 1 << 40, weight: 1234.5}
	w := make([]float32, headerLen)
	h.encode(w)
	got, err := decodeHeader(slices.Clone(w))
	if err != nil || got != h {
		t.Fatalf("header: %+v %v", got, err)
	}
	v := vote{ok: false, cfg: 7, d: 99, fault: faultOverflow, blame: []kind{kindNone, kindStall, kindConfig}}
	vw := make([]float32, voteLen(3))
	v.encode(vw)
	var gv vote
	if err := decodeVote(vw, 3, &gv); err != nil || gv.ok || gv.cfg != 7 || gv.d != 99 || gv.fault != faultOverflow || !slices.Equal(gv.blame, v.blame) {
		t.Fatalf("vote: %+v %v", gv, err)
	}
	if err := decodeVote(vw, 4, &gv); err == nil {
		t.Error("vote for another group size decoded")
	}
	st := []float64{0, 1.5, math.MaxFloat64}
	sw := make([]float32, 6)
	encodeStats(sw, st)
	back := make([]float64, 3)
	if err := decodeStats(back, sw); err != nil || !slices.Equal(back, st) {
		t.Fatalf("stats: %v %v", back, err)
	}
	encodeStats(sw, []float64{1, math.NaN(), 2})
	if err := decodeStats(back, sw); !errors.Is(err, ErrBadValue) {
		t.Errorf("NaN statistic: %v", err)
	}
}

// FuzzDecoders feeds peer-controlled words to every control decoder: they
// must return an error or a value that re-encodes to the same words, and
// never panic.
func FuzzDecoders(f *testing.F) {
	w := make([]float32, voteLen(3))
	(&vote{ok: true, cfg: 1, d: 2, blame: make([]kind, 3)}).encode(w)
	f.Add(wordsToBytes(w), 3)
	hw := make([]float32, headerLen)
	header{cfg: 1, d: 2, weight: 3}.encode(hw)
	f.Add(wordsToBytes(hw), 0)
	f.Fuzz(func(t *testing.T, b []byte, n int) {
		words := bytesToWords(b)
		if h, err := decodeHeader(words); err == nil {
			again := make([]float32, headerLen)
			h.encode(again)
			if !slices.Equal(math32(again), math32(words)) {
				t.Fatalf("header %+v does not re-encode", h)
			}
		}
		if n >= 0 && n < 1<<10 {
			var v vote
			if err := decodeVote(words, n, &v); err == nil {
				again := make([]float32, voteLen(n))
				v.encode(again)
				if !slices.Equal(math32(again), math32(words)) {
					t.Fatalf("vote %+v does not re-encode", v)
				}
			}
		}
		if len(words)%2 == 0 {
			_ = decodeStats(make([]float64, len(words)/2), words)
		}
	})
}

func wordsToBytes(w []float32) []byte {
	b := make([]byte, 0, 4*len(w))
	for _, v := range w {
		u := math.Float32bits(v)
		b = append(b, byte(u), byte(u>>8), byte(u>>16), byte(u>>24))
	}
	return b
}

func bytesToWords(b []byte) []float32 {
	w := make([]float32, len(b)/4)
	for i := range w {
		w[i] = math.Float32frombits(uint32(b[4*i]) | uint32(b[4*i+1])<<8 | uint32(b[4*i+2])<<16 | uint32(b[4*i+3])<<24)
	}
	return w
}

func math32(w []float32) []uint32 {
	u := make([]uint32, len(w))
	for i, v := range w {
		u[i] = math.Float32bits(v)
	}
	return u
}
