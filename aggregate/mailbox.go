package aggregate

import (
	"context"
	"fmt"
	"math/bits"
	"sync"

	"github.com/starling-ml/starling/peerid"
)

// DefaultMailboxBytes bounds the undelivered chunks a Mailbox holds.
const DefaultMailboxBytes = 1 << 30

// Mailbox is the receiving half of a Transport: the network side calls
// Deliver with each chunk that arrives, the driver calls Recv for the chunk
// it wants next, and the two meet by (sender, round, attempt, step, chunk)
// whichever comes first. It implements Scoper. A Mailbox is safe for
// concurrent use.
type Mailbox struct {
	mu       sync.Mutex
	slots    map[mkey]*slot
	scoped   bool
	round    uint64
	attempt  uint16
	members  map[peerid.ID]struct{}
	ahead    uint16                   // the latest attempt of round a member sent chunks for, if later than attempt
	rejected map[peerid.ID]*PeerError // for round
	pending  int                      // elements held in slots
	limit    int                      // elements
	closed   bool
	free     [40][][]float32 // recycled buffers by capacity class
}

type mkey struct {
	from    peerid.ID
	round   uint64
	attempt uint16
	step    Step
	chunk   uint32
}

type slot struct {
	data   []float32
	digest uint64
	has    bool
	waiter chan struct{} // non-nil while a Recv waits; closed on delivery
}

// NewMailbox returns a Mailbox that holds at most maxBytes of undelivered
// chunks (DefaultMailboxBytes when maxBytes ≤ 0).
func NewMailbox(maxBytes int) *Mailbox {
	if maxBytes <= 0 {
		maxBytes = DefaultMailboxBytes
	}
	return &Mailbox{slots: map[mkey]*slot{}, limit: maxBytes / 4, rejected: map[peerid.ID]*PeerError{}}
}

func keyOf(from peerid.ID, t Tag) mkey {
	return mkey{from: from, round: t.Round, attempt: t.Attempt, step: t.Step, chunk: t.Chunk}
}

// older reports whether (r1, a1) comes before (r2, a2).
func older(r1 uint64, a1 uint16, r2 uint64, a2 uint16) bool {
	return r1 < r2 || (r1 == r2 && a1 < a2)
}

// Buffer returns a buffer of length n for Deliver, recycled from chunks
// that Recv has consumed when possible.
func (m *Mailbox) Buffer(n int) []float32 {
	c := sizeClass(n)
	m.mu.Lock()
	if l := len(m.free[c]); l > 0 {
		b := m.free[c][l-1]
		m.free[c] = m.free[c][:l-1]
		m.mu.Unlock()
		return b[:n]
	}
	m.mu.Unlock()
	return make([]float32, n, 1<<c)
}

func sizeClass(n int) int {
	if n <= 1 {
		return 0
	}
	return bits.Len(uint(n - 1))
}

// recycle keeps b for Buffer; m.mu is held.
func (m *Mailbox) recycle(b []float32) {
	if cap(b) == 0 {
		return
	}
	c := sizeClass(cap(b))
	if 1<<c != cap(b) || len(m.free[c]) >= 64 {
		return
	}
	m.free[c] = append(m.free[c], b)
}

// Admit reports whether a chunk from from with tag would be accepted,
// without delivering anything: nil, or an error wrapping ErrClosed,
// ErrStale or (as a *PeerError) ErrNotMember. A refusal for not being a
// member is recorded for Rejected.
func (m *Mailbox) Admit(from peerid.ID, tag Tag) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.admitLocked(from, tag)
}

func (m *Mailbox) admitLocked(from peerid.ID, tag Tag) error {
	if m.closed {
		return ErrClosed
	}
	if !m.scoped {
		return nil
	}
	if older(tag.Round, tag.Attempt, m.round, m.attempt) {
		return fmt.Errorf("%w: %v from %s, current round %d attempt %d", ErrStale, tag, from, m.round, m.attempt)
	}
	if tag.Round != m.round {
		return nil
	}
	_, member := m.members[from]
	switch {
	case tag.Attempt == m.attempt && !member:
		return m.rejectLocked(from, tag)
	case tag.Attempt > m.attempt && member:
		m.ahead = max(m.ahead, tag.Attempt)
	}
	return nil
}

// InGroup reports whether p is a member of the scoped group.
func (m *Mailbox) InGroup(p peerid.ID) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.members[p]
	return ok
}

// LatestAttempt returns the latest attempt of round that a member of the
// scoped group sent chunks for, if it is later than the scope's attempt.
func (m *Mailbox) LatestAttempt(round uint64) (uint16, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.scoped || round != m.round || m.ahead <= m.attempt {
		return 0, false
	}
	return m.ahead, true
}

func (m *Mailbox) rejectLocked(from peerid.ID, tag Tag) error {
	pe, ok := m.rejected[from]
	if !ok {
		pe = &PeerError{Peer: from, Err: fmt.Errorf("%w: chunk %v refused", ErrNotMember, tag)}
		m.rejected[from] = pe
	}
	return pe
}

// Deliver hands the mailbox a chunk that arrived from peer from. The
// mailbox takes ownership of data (get it from Buffer to have it recycled).
// It fails, and keeps nothing, for a closed mailbox (ErrClosed), a chunk of
// an earlier round or attempt (ErrStale), a chunk of the current attempt from
// a peer outside its group (*PeerError wrapping ErrNotMember), a second chunk
// under the same tag (ErrBadValue), or when full (ErrMailboxFull). A
// transport should answer a refusal by failing the sender's Send.
func (m *Mailbox) Deliver(from peerid.ID, tag Tag, data []float32) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.admitLocked(from, tag); err != nil {
		return err
	}
	k := keyOf(from, tag)
	s := m.slots[k]
	if s != nil && s.has {
		return &PeerError{Peer: from, Err: fmt.Errorf("%w: duplicate chunk %v", ErrBadValue, tag)}
	}
	if m.pending+len(data) > m.limit {
		return fmt.Errorf("%w: %d of %d bytes held", ErrMailboxFull, 4*m.pending, 4*m.limit)
	}
	if s == nil {
		s = &slot{}
		m.slots[k] = s
	}
	s.data, s.digest, s.has = data, tag.Digest, true
	m.pending += len(data)
	if s.waiter != nil {
		close(s.waiter)
		s.waiter = nil
	}
	return nil
}

// Recv implements Transport.Recv.
func (m *Mailbox) Recv(ctx context.Context, from peerid.ID, tag Tag, dst []float32) error {
	k := keyOf(from, tag)
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return ErrClosed
	}
	s := m.slots[k]
	if s == nil {
		s = &slot{}
		m.slots[k] = s
	}
	if !s.has {
		if s.waiter != nil {
			m.mu.Unlock()
			return fmt.Errorf("%w: %v from %s", ErrDuplicateRecv, tag, from)
		}
		w := make(chan struct{})
		s.waiter = w
		m.mu.Unlock()
		select {
		case <-w:
		case <-ctx.Done():
		}
		m.mu.Lock()
		if m.closed {
			m.mu.Unlock()
			return ErrClosed
		}
		if !s.has {
			s.waiter = nil
			if m.slots[k] == s {
				delete(m.slots, k)
			}
			m.mu.Unlock()
			return ctx.Err()
		}
	}
	delete(m.slots, k)
	m.pending -= len(s.data)
	data := s.data
	defer func() {
		m.recycle(data)
		m.mu.Unlock()
	}()
	if s.digest != tag.Digest {
		if len(data) == len(dst) {
			copy(dst, data)
		}
		return &MismatchError{Peer: from, Got: s.digest, Want: tag.Digest}
	}
	if len(data) != len(dst) {
		return &PeerError{Peer: from, Err: fmt.Errorf("%w: chunk %v has %d values, want %d", ErrBadLength, tag, len(data), len(dst))}
	}
	copy(dst, data)
	return nil
}

// Scope implements Scoper.
func (m *Mailbox) Scope(g Group) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.scoped || g.round != m.round {
		clear(m.rejected)
		m.ahead = 0
	}
	m.scoped, m.round, m.attempt = true, g.round, g.attempt
	m.members = make(map[peerid.ID]struct{}, len(g.members))
	for _, p := range g.members {
		m.members[p] = struct{}{}
	}
	for k, s := range m.slots {
		if s.waiter != nil {
			continue
		}
		cur := k.round == m.round && k.attempt == m.attempt
		_, member := m.members[k.from]
		if older(k.round, k.attempt, m.round, m.attempt) || (cur && !member) {
			if cur {
				m.rejectLocked(k.from, Tag{Round: k.round, Attempt: k.attempt, Step: k.step, Chunk: k.chunk, Digest: s.digest})
			}
			delete(m.slots, k)
			m.pending -= len(s.data)
			m.recycle(s.data)
		}
	}
}

// Rejected implements Scoper.
func (m *Mailbox) Rejected(round uint64) []*PeerError {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.scoped || round != m.round || len(m.rejected) == 0 {
		return nil
	}
	out := make([]*PeerError, 0, len(m.rejected))
	for _, pe := range m.rejected {
		out = append(out, pe)
	}
	clear(m.rejected)
	sortPeerErrors(out)
	return out
}

// Pending returns the number of chunks held, delivered but not received.
func (m *Mailbox) Pending() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, s := range m.slots {
		if s.has {
			n++
		}
	}
	return n
}

// Close fails every waiting and future Recv and Deliver with ErrClosed and
// drops what the mailbox holds.
func (m *Mailbox) Close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	m.closed = true
	for k, s := range m.slots {
		if s.waiter != nil {
			close(s.waiter)
			s.waiter = nil
		}
		delete(m.slots, k)
	}
	m.pending = 0
}
