package node

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"net"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/p2p/security/noise"
	libp2ptls "github.com/libp2p/go-libp2p/p2p/security/tls"

	"github.com/starling-ml/starling/compression"
	"github.com/starling-ml/starling/device"
	"github.com/starling-ml/starling/internal/crc32c"
)

// ProtocolID is the libp2p protocol of tensor streams.
const ProtocolID protocol.ID = "/starling/tensor/1.0.0"

// protectTag is the connection-manager tag held on a peer while a tensor
// is in flight to or from it.
const protectTag = "starling-tensor"

// ioChunk is how many bytes one Write moves between deadline refreshes
// and ctx checks.
const ioChunk = 1 << 20

// Tensor is one tensor on the wire: its encoded bytes and what a receiver
// needs to decode and place them.
type Tensor struct {
	// Tag is the mailbox key: Recv(from, tag) receives it.
	Tag Tag
	// Codec is how Payload encodes the elements (compression.ID). With
	// compression.IDFP32 the payload is the raw little-endian elements of
	// DType and its length must match Shape exactly.
	Codec compression.ID
	// DType is the element type after decoding.
	DType DType
	// Shape is the logical shape; empty means a scalar.
	Shape []int
	// Version is the model version the tensor was computed from, Step the
	// sender's step; node/ carries them and does not interpret them.
	Version, Step uint64
	// Payload holds the encoded bytes. Send does not retain or modify it.
	// On Recv it aliases the caller's buffer.
	Payload []byte
	// Finite is set by Recv when node checked, in the pass that verified
	// the payload's checksum or (on connections that need none) in the
	// staging buffer, that a raw float32 payload holds no NaN or ±Inf.
	// False says nothing.
	Finite bool
	// Summed is set by RecvAxpy when node combined the tensor as it
	// arrived (Payload = Alpha·X + received); SumFinite then reports
	// whether every sum is finite.
	Summed, SumFinite bool
	// Checksums, on Recv, holds the CRC-32C of each stripe of Payload as
	// delivered (of the sums, when Summed) where node computed one for
	// every stripe (connections that need checksums; see flagNoChecksum),
	// and is nil otherwise. On Send, a caller that passes a received
	// tensor's Checksums with its Payload unchanged spares node a pass
	// over the payload: node uses them when it sends the tensor in as
	// many stripes as there are checksums. A checksum that does not match
	// its stripe makes the receiver reject the tensor (ErrChecksum).
	Checksums []uint32
	// From is the sender (set by Recv; ignored by Send).
	From peer.ID
}

// header builds and validates the wire header for t.
func (t *Tensor) header(maxBytes uint64) (header, error) {
	h := header{codec: t.Codec, dtype: t.DType, tag: t.Tag, version: t.Version, step: t.Step,
		length: uint64(len(t.Payload)), stripes: 1}
	if len(t.Shape) > MaxDims {
		return h, fmt.Errorf("%w: rank %d > %d", ErrShapeMismatch, len(t.Shape), MaxDims)
	}
	h.ndim = uint8(len(t.Shape))
	for i, d := range t.Shape {
		if d < 0 {
			return h, fmt.Errorf("%w: negative dimension %d", ErrShapeMismatch, d)
		}
		h.shape[i] = uint64(d)
	}
	return h, h.validate(maxBytes)
}

// fill sets t's metadata from a received header.
func (t *Tensor) fill(h *header, from peer.ID) {
	t.Tag, t.Codec, t.DType, t.Version, t.Step, t.From = h.tag, h.codec, h.dtype, h.version, h.step, from
	t.Shape = make([]int, h.ndim)
	for i := range t.Shape {
		t.Shape[i] = int(h.shape[i])
	}
}

// mkey keys the mailbox: a Recv for (p, tag), or for ("", tag) from anyone.
type mkey struct {
	p   peer.ID
	tag Tag
}

// recvOp is a Recv waiting for its tensor.
type recvOp struct {
	key  mkey
	dst  []byte
	done chan struct{} // closed once t/err are set
	t    Tensor
	err  error
	asm  *assembly // the tensor being received for it, once matched
	ax   *Axpy     // RecvAxpy's, or nil
}

// assembly is one incoming tensor whose stripes are arriving. Its buffer is
// the bound Recv's dst or, when it arrived before any Recv, a
// parked buffer counted in tensors.parked.
type assembly struct {
	key    mkey // the real sender
	h      header
	buf    []byte
	parked bool
	// stranger means the sender was not one SetMayPark admits when the
	// buffer was parked: it counts in tensors.strangers.
	stranger bool
	recv     *recvOp
	seen     uint64 // bitmap of stripes started
	done     int    // stripes verified
	finite   int    // stripes verified free of NaN and ±Inf (see Tensor.Finite)
	// ax, set when the assembly is bound to a RecvAxpy whose tensor it
	// can combine (axpyFits), makes the stripe readers write ax's sums
	// into buf; sumFinite counts the stripes whose sums were all finite.
	ax        *Axpy
	sumFinite int
	// crcs[i] is stripe i's CRC-32C as delivered into buf (of the sums,
	// with ax), for Tensor.Checksums; crcd counts the stripes that have
	// one.
	crcs   []uint32
	crcd   int
	active map[network.Stream]struct{}
	err    error
	// drain means nobody wants the tensor any more (its Recv gave up or
	// was too short): its stripes are read to their end and dropped, so
	// that the frames queued behind them on the same streams still
	// arrive. A draining assembly stays in tensors.asm, without a buffer,
	// until all its stripes are through (or ParkedTTL passes).
	drain bool
	// dstMu is read-held while a stripe reader copies into buf; gone
	// (under dstMu) means buf is its Recv's caller's again.
	dstMu   sync.RWMutex
	gone    bool
	start   time.Time
	created time.Time
}

// tensors is the tensor service of a Node: the stream handler, the mailbox
// and the send path. Safe for concurrent use.
type tensors struct {
	host  host.Host
	cfg   *Config
	m     *nodeMetrics
	ref   *refusals
	hooks *testHooks

	mu        sync.Mutex
	closed    bool
	posted    map[mkey]*recvOp
	asm       map[mkey]*assembly // incomplete
	ready     map[mkey]*assembly // complete, not yet claimed
	parked    int64              // bytes in parked buffers, all senders
	byPeer    map[peer.ID]int64  // the same by sender; no zero entries
	strangers int64              // the same for the peers mayPark refuses
	mayPark   atomic.Pointer[func(peer.ID) bool]
	changed   chan struct{} // closed and replaced on every state change
	inbound   map[network.Stream]struct{}
	pools     map[peer.ID]*streamPool
	links     map[*streamPool]struct{}
	prot      map[peer.ID]int
	admit     []*admitHook   // copied on write
	wg        sync.WaitGroup // stream handlers
}

// testHooks lets tests observe transfers without sleeping.
type testHooks struct {
	// recvProgress is called after each chunk read into a tensor buffer.
	recvProgress func(from peer.ID, n int)
	// recvFlags is called with the flags of each stripe header received.
	recvFlags func(flags uint32)
	// queued is called (under the tensors' lock) when a tensor waits for
	// another with its tag and sender to finish arriving.
	queued func(tag Tag)
}

func newTensors(h host.Host, cfg *Config, m *nodeMetrics, ref *refusals, hooks *testHooks) *tensors {
	ts := &tensors{
		host: h, cfg: cfg, m: m, ref: ref, hooks: hooks,
		posted:  make(map[mkey]*recvOp),
		asm:     make(map[mkey]*assembly),
		ready:   make(map[mkey]*assembly),
		byPeer:  make(map[peer.ID]int64),
		changed: make(chan struct{}),
		inbound: make(map[network.Stream]struct{}),
		pools:   make(map[peer.ID]*streamPool),
		links:   make(map[*streamPool]struct{}),
		prot:    make(map[peer.ID]int),
	}
	if ts.hooks == nil {
		ts.hooks = &testHooks{}
	}
	h.SetStreamHandler(ProtocolID, ts.handle)
	return ts
}

// broadcast wakes every goroutine waiting on a state change. Call with mu.
func (ts *tensors) broadcast() {
	close(ts.changed)
	ts.changed = make(chan struct{})
}

// protect keeps p's connections from being trimmed while a tensor moves.
func (ts *tensors) protect(p peer.ID) {
	ts.mu.Lock()
	ts.prot[p]++
	first := ts.prot[p] == 1
	ts.mu.Unlock()
	if first {
		ts.host.ConnManager().Protect(p, protectTag)
	}
}

func (ts *tensors) unprotect(p peer.ID) {
	ts.mu.Lock()
	ts.prot[p]--
	last := ts.prot[p] == 0
	if last {
		delete(ts.prot, p)
	}
	ts.mu.Unlock()
	if last {
		ts.host.ConnManager().Unprotect(p, protectTag)
	}
}

// ---- receive side ----

// handle serves one inbound tensor stream: frames one after another until
// the sender closes it, it idles past IdleTimeout, or a frame is refused.
func (ts *tensors) handle(s network.Stream) {
	if s.Conn().Stat().Limited {
		ts.refuse(s.Conn().RemotePeer(), ErrLimitedConn)
		s.Reset()
		return
	}
	ts.mu.Lock()
	if ts.closed {
		ts.mu.Unlock()
		s.Reset()
		return
	}
	ts.inbound[s] = struct{}{}
	ts.wg.Add(1)
	ts.mu.Unlock()
	defer func() {
		ts.mu.Lock()
		delete(ts.inbound, s)
		ts.mu.Unlock()
		ts.wg.Done()
	}()

	from := s.Conn().RemotePeer()
	var buf [maxHeaderLen]byte
	var h header
	for {
		s.SetReadDeadline(time.Now().Add(ts.cfg.IdleTimeout))
		err := readHeader(s, &buf, uint64(ts.cfg.MaxTensorBytes), &h)
		if err == io.EOF || errors.Is(err, errNoFrame) {
			s.Close()
			return
		}
		if err == nil {
			err = ts.receiveStripe(s, from, &h)
		}
		if err != nil {
			if !errors.Is(err, errAbandoned) && !errors.Is(err, ErrClosed) {
				ts.refuse(from, err)
			}
			s.Reset()
			return
		}
	}
}

// refuse counts a rejected frame from p and logs it at warn level (rate
// limited) when its reason says something about the sender: a malformed or
// refused frame, not a peer that died mid-frame or a local Recv's problem.
func (ts *tensors) refuse(p peer.ID, err error) {
	ts.m.reject(err)
	switch reason := Reason(err); reason {
	case "too_large", "bad_magic", "bad_version", "bad_header", "unknown_codec", "unknown_dtype",
		"shape_mismatch", "checksum", "limited_conn":
		ts.ref.warn("rejected a tensor frame", p, reason, "err", err)
	}
}

// errAbandoned means the stripe's tensor failed elsewhere (another stripe,
// or its Recv gave up); it was already counted.
var errAbandoned = errors.New("node: tensor abandoned")

// receiveStripe places one stripe whose header was just read.
func (ts *tensors) receiveStripe(s network.Stream, from peer.ID, h *header) error {
	if ts.hooks.recvFlags != nil {
		ts.hooks.recvFlags(h.flags)
	}
	sum := h.flags&flagNoChecksum == 0
	if !sum && !authenticated(s.Conn()) {
		return errUnchecked
	}
	key := mkey{from, h.tag}
	off, n := stripeOffset(h.length, h.stripes, h.stripe), stripeLen(h.length, h.stripes, h.stripe)
	deadline := time.Now().Add(ts.cfg.IOTimeout)

	ts.mu.Lock()
	admit := ts.admit
	ts.mu.Unlock()
	if len(admit) > 0 {
		var t Tensor
		t.fill(h, from)
		for _, a := range admit {
			if err := a.f(from, &t); err != nil {
				ts.refuse(from, fmt.Errorf("%w: %w", ErrRefused, err))
				return ts.drainStripe(s, from, int(n), sum)
			}
		}
	}

	// A peer SetMayPark leaves out (a stranger) parks only within
	// MaxStrangerParked, shared by all strangers; past it, it waits for
	// its Recv like a member past its share. A Recv from anyone with no
	// buffer does not take its tensor: that would allocate for it.
	may := true
	if f := ts.mayPark.Load(); f != nil {
		may = (*f)(from)
	}

	ts.mu.Lock()
	var a *assembly
	for a == nil {
		if ts.closed {
			ts.mu.Unlock()
			return ErrClosed
		}
		ts.expireLocked(time.Now())
		cur := ts.asm[key]
		if cur != nil && cur.h.sameTensor(h) && cur.seen&(1<<h.stripe) == 0 {
			a = cur
			break
		}
		if cur != nil && h.stripes > 1 {
			// Stripes of two tensors with one tag cannot be told apart.
			err := fmt.Errorf("%w: stripe %d disagrees with the tensor being received", ErrBadHeader, h.stripe)
			ts.failLocked(cur, err)
			ts.mu.Unlock()
			return err
		}
		if cur != nil && ts.hooks.queued != nil {
			ts.hooks.queued(key.tag)
		}
		// A whole tensor in one frame waits for the one with its tag that
		// is still arriving (concurrent Sends with one tag: gossip's
		// requests), as it waits for an unclaimed one.
		if cur == nil && ts.ready[key] == nil { // an unclaimed tensor with this tag blocks the next
			// A Recv from any peer takes the first tensor to arrive
			// whole: bound to this one, it would wait for a slow sender
			// while the others' tensors are complete. It is bound only
			// when the tensor cannot park.
			room := ts.roomLocked(from, int64(h.length), !may)
			if r := ts.matchLocked(key); r != nil && (r.key.p != "" || !room) && (may || r.dst != nil || r.key.p != "") {
				delete(ts.posted, r.key)
				buf := r.dst
				if buf == nil {
					buf = make([]byte, h.length) // validated against MaxTensorBytes
				}
				if uint64(cap(buf)) < h.length {
					// The Recv cannot take it: tell it, and drain the
					// tensor rather than reset the stream.
					r.err = fmt.Errorf("%w: %d bytes for a %d-byte tensor", ErrShortBuffer, cap(buf), h.length)
					ts.m.reject(r.err)
					close(r.done)
					a = ts.newAssemblyLocked(key, h, nil, false)
					a.drain = true
					break
				}
				a = ts.newAssemblyLocked(key, h, buf[:h.length], false)
				a.recv, r.asm = r, a
				if r.ax != nil && axpyFits(h, r.ax) {
					a.ax = r.ax
				}
				break
			}
			if room {
				a = ts.newAssemblyLocked(key, h, parkBuf(int(h.length)), true)
				a.stranger = !may
				ts.parkLocked(a)
				break
			}
		}
		// No Recv yet and no room to park, or another tensor with the tag
		// ahead: wait (back-pressure).
		ch := ts.changed
		ts.mu.Unlock()
		t := time.NewTimer(time.Until(deadline))
		select {
		case <-ch:
			t.Stop()
		case <-t.C:
			if cur != nil {
				return fmt.Errorf("%w: tag %d: the tensor ahead with this tag still arriving after %v", ErrTimeout, h.tag, ts.cfg.IOTimeout)
			}
			return fmt.Errorf("%w: no Recv for tag %d within %v and no room to park it", ErrTimeout, h.tag, ts.cfg.IOTimeout)
		}
		ts.mu.Lock()
	}
	a.seen |= 1 << h.stripe
	a.active[s] = struct{}{}
	var dst []byte
	if !a.drain {
		dst = a.buf[off : off+n]
	}
	ts.mu.Unlock()

	// A raw float32 stripe that starts on a value is checked for NaN and
	// ±Inf in its checksum's pass.
	checkFinite := h.codec == compression.IDFP32 && h.dtype == Float32 && off%4 == 0 && n%4 == 0
	ts.protect(from)
	finite, sumFinite, crc, err := ts.readStripe(s, from, a, dst, int(off), int(n), sum, checkFinite)
	ts.unprotect(from)

	ts.mu.Lock()
	defer ts.mu.Unlock()
	delete(a.active, s)
	if a.drain && a.err == nil {
		if err != nil {
			err = streamErr(err)
			ts.dropLocked(a)
			return err
		}
		// Drained to its end: the stream is clean for the next frame.
		a.done++
		if a.done == int(a.h.stripes) {
			ts.dropLocked(a)
		}
		return nil
	}
	if a.err != nil {
		ts.finishIfIdleLocked(a)
		return errAbandoned
	}
	if err != nil {
		err = streamErr(err)
		ts.failLocked(a, err)
		return err
	}
	a.done++
	if finite {
		a.finite++
	}
	if sumFinite {
		a.sumFinite++
	}
	if sum {
		if a.crcs == nil {
			a.crcs = make([]uint32, a.h.stripes)
		}
		a.crcs[h.stripe] = crc
		a.crcd++
	}
	if a.done == int(a.h.stripes) {
		ts.completeLocked(a)
	}
	return nil
}

// readStripe reads a stripe's payload and trailer and checks the checksum
// (if sum: see flagNoChecksum). With checkFinite, finite reports whether
// the payload, read as float32 values, holds no NaN or ±Inf, checked in
// the checksum's pass or, without one, in the staging buffer. Payload
// goes into dst (if not nil) for as long as a's buffer is not given back
// to its caller (gone): a Recv that gives up must neither wait for a
// stalled sender nor have its buffer written after it returned, and the
// stream must stay in step (a reset would lose the frames queued behind
// this one), so the rest of the stripe is then read and dropped. The
// payload is read into a pooled staging buffer, checked there and copied
// into dst, which costs less CPU than reading it into dst and checking it
// there (docs/results, "Frames offered to the next Read"); no Read ever
// holds dst. For a RecvAxpy
// (a.ax), dst gets a.ax's sums with the payload instead (its stripe starts
// at byte base of the tensor), and sumFinite reports them all finite.
// With sum, delivered is the CRC-32C of what went into dst: the verified
// checksum, or with a.ax that of the sums, computed while they are in
// cache.
func (ts *tensors) readStripe(s network.Stream, from peer.ID, a *assembly, dst []byte, base, n int, sum, checkFinite bool) (finite, sumFinite bool, delivered uint32, err error) {
	sp := scratchPool.Get().(*[]byte)
	defer scratchPool.Put(sp)
	scratch := *sp
	var crc, out uint32
	fin := checkFinite // no NaN or ±Inf so far
	sums := a != nil && a.ax != nil
	for off := 0; off < n; {
		if err := s.SetReadDeadline(time.Now().Add(ts.cfg.IOTimeout)); err != nil {
			return false, false, 0, err
		}
		k, err := io.ReadFull(s, scratch[:min(len(scratch), n-off)])
		summed := false
		if k > 0 && dst != nil && sum && a.ax != nil {
			// Checksummed, checked and summed in one pass.
			var inFinite, sumFinite bool
			crc, out, inFinite, sumFinite, summed = sumPiece(a, base+off, scratch[:k], dst[off:off+k], crc, out)
			fin, sums = fin && inFinite, sums && sumFinite
		}
		if !summed {
			switch {
			case sum && fin:
				crc, fin = crc32c.UpdateFinite(crc, scratch[:k])
			case sum:
				crc = crc32c.Update(crc, scratch[:k])
			case fin: // no checksum pass to fold it into: checked in the cache
				fin = k%4 == 0 && device.AllFinite(floats(scratch[:k]))
			}
			if k > 0 && dst != nil {
				a.dstMu.RLock()
				switch {
				case a.gone:
				case a.ax != nil: // k and base+off are multiples of 4 (axpyFits)
					var fin bool
					fin, out = axpyPiece(a.ax, base+off, scratch[:k], dst[off:off+k], out, sum)
					sums = fin && sums
				default:
					copy(dst[off:], scratch[:k])
				}
				a.dstMu.RUnlock()
			}
		}
		off += k
		if ts.hooks.recvProgress != nil && k > 0 {
			ts.hooks.recvProgress(from, k)
		}
		if err != nil {
			return false, false, 0, truncated(err)
		}
	}
	var tr [trailerLen]byte
	s.SetReadDeadline(time.Now().Add(ts.cfg.IOTimeout))
	if _, err := io.ReadFull(s, tr[:]); err != nil {
		return false, false, 0, truncated(err)
	}
	if binary.LittleEndian.Uint32(tr[:]) != crc {
		return false, false, 0, ErrChecksum
	}
	if a == nil || a.ax == nil {
		out = crc
	}
	return fin, sums, out, nil
}

// authenticated reports whether c's transport authenticates every byte
// (TLS, Noise, QUIC), so that a frame on it needs no payload checksum.
// Plaintext (Config.Insecure), mocknet and unknown transports do not.
func authenticated(c network.Conn) bool {
	st := c.ConnState()
	switch st.Security {
	case recordsID, libp2ptls.ID, noise.ID:
		return true
	}
	return st.Security == "" && (st.Transport == "quic-v1" || st.Transport == "quic")
}

// axpyFits reports whether node can combine the tensor of header h with
// ax as it arrives (RecvAxpy): a raw float32 tensor of len(ax.X) values
// whose every stripe starts on a value, where device.AxpyTo runs.
func axpyFits(h *header, ax *Axpy) bool {
	if !axpyToRuns || h.codec != compression.IDFP32 || h.dtype != Float32 || h.length != 4*uint64(len(ax.X)) {
		return false
	}
	for i := range h.stripes {
		if stripeOffset(h.length, h.stripes, i)%4 != 0 {
			return false
		}
	}
	return true
}

// axpyToRuns reports whether device.AxpyTo runs on this machine.
var axpyToRuns = device.AxpyToRuns(device.NewFast())

// floats is b (4-byte aligned) as float32 values, in the machine's order.
func floats(b []byte) []float32 {
	if len(b) < 4 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4)
}

// scratchPool holds the staging buffers of readStripe.
var scratchPool = sync.Pool{New: func() any { b := make([]byte, stagingBytes); return &b }}

// stagingBytes is the size of a staging buffer, and of the pieces a
// parked tensor is summed in: small enough that what is summed is still in
// cache for its checksum.
const stagingBytes = 256 << 10

// abandonLocked turns a into a draining assembly after its Recv gave up:
// once abandonLocked returns, nothing writes into the Recv's buffer, and
// the stripe readers go on reading their stripes to the end.
func (ts *tensors) abandonLocked(a *assembly) {
	a.recv = nil
	a.drain = true
	a.dstMu.Lock() // waits for a copy into buf under way
	a.gone = true
	a.dstMu.Unlock()
	if len(a.active) == 0 && a.seen == 1<<a.h.stripes-1 {
		ts.dropLocked(a)
	}
	ts.broadcast()
}

// dropLocked forgets a draining assembly.
func (ts *tensors) dropLocked(a *assembly) {
	if ts.asm[a.key] == a {
		delete(ts.asm, a.key)
	}
	ts.broadcast()
}

// drainStripe reads a refused stripe (payload and trailer) to its end.
func (ts *tensors) drainStripe(s network.Stream, from peer.ID, n int, sum bool) error {
	_, _, _, err := ts.readStripe(s, from, nil, nil, 0, n, sum, false)
	return err
}

func (ts *tensors) newAssemblyLocked(key mkey, h *header, buf []byte, parked bool) *assembly {
	now := time.Now()
	a := &assembly{key: key, h: *h, buf: buf, parked: parked,
		active: make(map[network.Stream]struct{}), start: now, created: now}
	ts.asm[key] = a
	return a
}

// matchLocked finds the Recv waiting for key, or for its tag from anyone.
func (ts *tensors) matchLocked(key mkey) *recvOp {
	if r := ts.posted[key]; r != nil {
		return r
	}
	return ts.posted[mkey{"", key.tag}]
}

// failLocked marks a failed, stops its other stripes and, once no stripe
// is still writing into its buffer, reports err to its Recv.
func (ts *tensors) failLocked(a *assembly, err error) {
	if a.err != nil {
		return
	}
	a.err = err
	if ts.asm[a.key] == a {
		delete(ts.asm, a.key)
	}
	ts.unparkLocked(a)
	for s := range a.active {
		s.Reset()
	}
	ts.finishIfIdleLocked(a)
	ts.broadcast()
}

// finishIfIdleLocked delivers a failed assembly's error once its last
// stripe reader is out of the buffer.
func (ts *tensors) finishIfIdleLocked(a *assembly) {
	if len(a.active) == 0 && a.recv != nil {
		r := a.recv
		a.recv = nil
		r.err = a.err
		close(r.done)
	}
}

// completeLocked hands a fully verified tensor to its Recv, or parks it.
func (ts *tensors) completeLocked(a *assembly) {
	delete(ts.asm, a.key)
	ts.m.transfer("recv", a.start)
	r := a.recv
	if r == nil && a.parked {
		// A Recv from any peer that is waiting takes it (see
		// receiveStripe).
		if r = ts.matchLocked(a.key); r != nil {
			delete(ts.posted, r.key)
		}
	}
	if r != nil {
		a.recv = nil
		ts.deliverLocked(a, r)
	} else {
		a.created = time.Now()
		ts.ready[a.key] = a
	}
	ts.broadcast()
}

// deliverLocked completes r with a's tensor, copying out of a parked buffer
// (or handing the buffer over when r brought none).
func (ts *tensors) deliverLocked(a *assembly, r *recvOp) {
	payload := a.buf
	if a.parked {
		ts.unparkLocked(a)
		if r.dst != nil {
			if cap(r.dst) < len(a.buf) {
				r.err = fmt.Errorf("%w: %d bytes for a %d-byte tensor", ErrShortBuffer, cap(r.dst), len(a.buf))
				ts.m.reject(r.err)
				close(r.done)
				return
			}
			payload = r.dst[:len(a.buf)]
			if r.ax != nil && axpyFits(&a.h, r.ax) {
				r.t.Summed = true
				r.t.SumFinite = a.sumInto(r.ax, payload)
			} else {
				copy(payload, a.buf)
			}
			freeParkBuf(a.buf)
			a.buf = nil
		}
	} else if a.ax != nil {
		r.t.Summed, r.t.SumFinite = true, a.sumFinite == int(a.h.stripes)
	}
	r.t.fill(&a.h, a.key.p)
	r.t.Payload = payload
	r.t.Finite = a.finite == int(a.h.stripes)
	if a.crcd == int(a.h.stripes) {
		r.t.Checksums = a.crcs
	}
	close(r.done)
}

// sumInto sets dst = ax.Alpha·ax.X + a's parked buffer (device.AxpyTo)
// and reports whether every sum is finite. It goes a piece at a time, so
// that the checksums of what it writes (which replace those of what
// arrived, where a has them) are made while it is in cache.
func (a *assembly) sumInto(ax *Axpy, dst []byte) (finite bool) {
	finite = true
	crcs := a.crcd == int(a.h.stripes)
	for i := range a.h.stripes {
		off, n := stripeOffset(a.h.length, a.h.stripes, i), stripeLen(a.h.length, a.h.stripes, i)
		var crc uint32
		for p := off; p < off+n; p += stagingBytes {
			q := min(p+stagingBytes, off+n) // p and q are multiples of 4 (axpyFits)
			var fin bool
			fin, crc = axpyPiece(ax, int(p), a.buf[p:q], dst[p:q], crc, crcs)
			finite = fin && finite
		}
		if crcs {
			a.crcs[i] = crc
		}
	}
	return finite
}

// parkPools recycle the parked buffers of tensors copied out to their
// Recv's buffer, so that parking costs no fresh pages (a page fault each
// 4 KiB, and zeroing): pool c holds buffers of capacity 1<<(c+minParkPool).
var parkPools [maxParkPool - minParkPool + 1]sync.Pool

const minParkPool, maxParkPool = 16, 24 // 64 KiB to 16 MiB

// parkClass is the pool of buffers for n bytes, or -1 for none.
func parkClass(n int) int {
	c := bits.Len(uint(n - 1))
	if n <= 0 || c < minParkPool || c > maxParkPool {
		return -1
	}
	return c - minParkPool
}

// parkBuf returns a buffer of n bytes to park a tensor in: a recycled one
// (not zeroed: the tensor's stripes fill it before anyone reads it) or a
// new one.
func parkBuf(n int) []byte {
	c := parkClass(n)
	if c < 0 {
		return make([]byte, n)
	}
	if b, ok := parkPools[c].Get().(*[]byte); ok {
		return (*b)[:n]
	}
	return make([]byte, n, 1<<(c+minParkPool))
}

// freeParkBuf recycles b, a parked buffer nobody holds any more.
func freeParkBuf(b []byte) {
	if c := parkClass(cap(b)); c >= 0 && cap(b) == 1<<(c+minParkPool) {
		parkPools[c].Put(&b)
	}
}

// sumPiece is readStripe's one pass over a piece in of a RecvAxpy's
// stripe over plaintext (at, its first byte in the tensor, and len(in)
// multiples of 4): it extends crc over in, puts a.ax's sums with in into
// out, extends sumCRC over them, and reports whether in's values and the
// sums are finite (crc32c.AxpyTo). Once a is gone it does nothing and
// returns summed false, crc and sumCRC as given and both finite (which
// leaves the caller's verdicts as they were).
func sumPiece(a *assembly, at int, in, out []byte, crc, sumCRC uint32) (_, _ uint32, inFinite, sumFinite, summed bool) {
	a.dstMu.RLock()
	defer a.dstMu.RUnlock()
	if a.gone {
		return crc, sumCRC, true, true, false
	}
	e := at / 4
	crc, sumCRC, inFinite, sumFinite = crc32c.AxpyTo(a.ax.Alpha, a.ax.X[e:e+len(in)/4], floats(in), floats(out), crc, sumCRC)
	return crc, sumCRC, inFinite, sumFinite, true
}

// axpyPiece sets out = ax.Alpha·ax.X + in for the values from byte at of
// the tensor (at and len(in) multiples of 4; device.AxpyTo) and reports
// whether they are all finite; with sum it extends crc over out while out
// is in cache.
func axpyPiece(ax *Axpy, at int, in, out []byte, crc uint32, sum bool) (finite bool, _ uint32) {
	e := at / 4
	finite = device.AxpyTo(ax.Alpha, ax.X[e:e+len(in)/4], floats(in), floats(out))
	if sum {
		crc = crc32c.Update(crc, out)
	}
	return finite, crc
}

// roomLocked reports whether a tensor of n bytes from p fits under
// MaxParkedBytes and MaxParkedPerPeer and, from a stranger, under
// MaxStrangerParked.
func (ts *tensors) roomLocked(p peer.ID, n int64, stranger bool) bool {
	return ts.parked+n <= ts.cfg.MaxParkedBytes && ts.byPeer[p]+n <= ts.cfg.MaxParkedPerPeer &&
		(!stranger || ts.strangers+n <= ts.cfg.MaxStrangerParked)
}

// parkLocked counts a's parked buffer.
func (ts *tensors) parkLocked(a *assembly) {
	n := int64(len(a.buf))
	ts.parked += n
	ts.byPeer[a.key.p] += n
	if a.stranger {
		ts.strangers += n
	}
}

// unparkLocked gives back what a's parked buffer counted, if anything.
func (ts *tensors) unparkLocked(a *assembly) {
	if !a.parked {
		return
	}
	a.parked = false
	n := int64(len(a.buf))
	ts.parked -= n
	if a.stranger {
		ts.strangers -= n
	}
	if ts.byPeer[a.key.p] -= n; ts.byPeer[a.key.p] <= 0 {
		delete(ts.byPeer, a.key.p)
	}
}

// expireLocked drops parked tensors nobody claimed within ParkedTTL.
func (ts *tensors) expireLocked(now time.Time) {
	for k, a := range ts.ready {
		if now.Sub(a.created) > ts.cfg.ParkedTTL {
			delete(ts.ready, k)
			ts.unparkLocked(a)
			ts.m.reject(fmt.Errorf("%w: unclaimed tensor expired", ErrTimeout))
		}
	}
	for _, a := range ts.asm {
		if a.recv == nil && len(a.active) == 0 && now.Sub(a.created) > ts.cfg.ParkedTTL {
			if a.drain {
				ts.dropLocked(a)
				continue
			}
			ts.failLocked(a, fmt.Errorf("%w: stripes missing after %v", ErrTimeout, ts.cfg.ParkedTTL))
		}
	}
}

// recv implements Node.Recv.
func (ts *tensors) recv(ctx context.Context, from peer.ID, tag Tag, dst []byte, ax *Axpy) (Tensor, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, ts.cfg.RecvTimeout)
		defer cancel()
	}
	key := mkey{from, tag}
	r := &recvOp{key: key, dst: dst, done: make(chan struct{}), ax: ax}

	ts.mu.Lock()
	if ts.closed {
		ts.mu.Unlock()
		return Tensor{}, ErrClosed
	}
	ts.expireLocked(time.Now())
	if a := ts.findLocked(ts.ready, key); a != nil {
		delete(ts.ready, a.key)
		ts.deliverLocked(a, r)
		ts.broadcast()
		ts.mu.Unlock()
		return r.t, r.err
	}
	if a := ts.findLocked(ts.asm, key); from != "" && a != nil && a.recv == nil && a.parked {
		// Arriving now into a parked buffer: copy at the end. (A Recv
		// from any peer waits for the first tensor to complete instead.)
		a.recv, r.asm = r, a
	} else {
		if ts.posted[key] != nil {
			ts.mu.Unlock()
			return Tensor{}, ErrDuplicateRecv
		}
		ts.posted[key] = r
	}
	ts.broadcast()
	ts.mu.Unlock()

	select {
	case <-r.done:
		return r.t, r.err
	case <-ctx.Done():
	}
	ts.mu.Lock()
	select {
	case <-r.done: // finished meanwhile
		ts.mu.Unlock()
		return r.t, r.err
	default:
	}
	err := fmt.Errorf("node: recv tag %d from %s: %w", tag, from, ctx.Err())
	switch a := r.asm; {
	case a == nil:
		delete(ts.posted, key)
		ts.mu.Unlock()
		return Tensor{}, err
	case a.parked:
		a.recv = nil // the tensor stays parked for a later Recv
		ts.mu.Unlock()
		return Tensor{}, err
	default:
		// The stripes are writing into dst: switch them to draining (the
		// sender's frames behind this one on the same streams must still
		// arrive) and take dst back.
		ts.abandonLocked(a)
		ts.mu.Unlock()
		return Tensor{}, err
	}
}

// findLocked looks key up in m; a key with no peer matches any peer.
func (ts *tensors) findLocked(m map[mkey]*assembly, key mkey) *assembly {
	if key.p != "" {
		return m[key]
	}
	for k, a := range m {
		if k.tag == key.tag {
			return a
		}
	}
	return nil
}

// ---- send side ----

// stripeCount returns how many stripes a payload of n bytes goes as.
func (ts *tensors) stripeCount(n int, streams int) uint16 {
	k := n / ts.cfg.MinStripeBytes
	k = min(k, ts.cfg.Stripes, streams)
	return uint16(max(k, 1))
}

// send implements Node.Send and Link.Send.
func (ts *tensors) send(ctx context.Context, pool *streamPool, t *Tensor) error {
	h, err := t.header(uint64(ts.cfg.MaxTensorBytes))
	if err != nil {
		return err
	}
	ts.mu.Lock()
	closed := ts.closed
	ts.mu.Unlock()
	if closed {
		return ErrClosed
	}
	h.stripes = ts.stripeCount(len(t.Payload), pool.maxStripes)
	start := time.Now()
	ts.protect(pool.p)
	defer ts.unprotect(pool.p)
	sums := t.Checksums
	if len(sums) != int(h.stripes) {
		sums = nil
	}
	crc := func(i uint16) (uint32, bool) {
		if sums == nil {
			return 0, false
		}
		return sums[i], true
	}
	if h.stripes == 1 {
		c, ok := crc(0)
		err = ts.sendStripe(ctx, pool, h, t.Payload, c, ok)
	} else {
		ctx, cancel := context.WithCancelCause(ctx)
		errs := make(chan error, h.stripes)
		for i := range h.stripes {
			hi := h
			hi.stripe = i
			off, n := stripeOffset(h.length, h.stripes, i), stripeLen(h.length, h.stripes, i)
			c, ok := crc(i)
			go func() {
				err := ts.sendStripe(ctx, pool, hi, t.Payload[off:off+n], c, ok)
				if err != nil {
					cancel(err)
				}
				errs <- err
			}()
		}
		for range h.stripes {
			if e := <-errs; e != nil && (err == nil || errors.Is(err, context.Canceled)) {
				err = e
			}
		}
		cancel(nil)
	}
	if err != nil {
		return fmt.Errorf("node: send tag %d to %s: %w", t.Tag, pool.p, err)
	}
	ts.m.transfer("send", start)
	return nil
}

// sendStripe writes one frame on a pooled stream, with checksum crc if
// known (else computed). A pooled stream that fails before any byte of the
// frame is accepted (the receiver closed it while idle) is replaced once.
func (ts *tensors) sendStripe(ctx context.Context, pool *streamPool, h header, data []byte, crc uint32, known bool) error {
	for attempt := 0; ; attempt++ {
		s, reused, err := pool.get(ctx)
		if err != nil {
			return err
		}
		stop := context.AfterFunc(ctx, func() { s.Reset() })
		wrote, err := ts.writeFrame(s, &h, data, crc, known)
		if !stop() {
			return fmt.Errorf("%w: %w", ErrReset, context.Cause(ctx))
		}
		if err == nil {
			pool.put(s)
			return nil
		}
		s.Reset()
		if reused && !wrote && attempt == 0 {
			continue
		}
		return streamErr(err)
	}
}

// writeFrame writes header, payload and trailer with a deadline per chunk;
// the trailer is crc if known, else computed as the payload goes. wrote
// reports whether any write succeeded.
func (ts *tensors) writeFrame(s network.Stream, h *header, data []byte, crc uint32, known bool) (wrote bool, err error) {
	hf := *h
	sum := !authenticated(s.Conn())
	if !sum {
		hf.flags |= flagNoChecksum
		crc = 0 // the trailer of an unchecked frame
	}
	var hb [maxHeaderLen]byte
	hdr := appendHeader(hb[:0], &hf)
	deadline := func() { s.SetWriteDeadline(time.Now().Add(ts.cfg.IOTimeout)) }
	deadline()
	if _, err := s.Write(hdr); err != nil {
		return false, err
	}
	for off := 0; off < len(data); off += ioChunk {
		chunk := data[off:min(off+ioChunk, len(data))]
		if sum && !known {
			crc = crc32c.Update(crc, chunk)
		}
		deadline()
		if _, err := s.Write(chunk); err != nil {
			return true, err
		}
	}
	deadline()
	_, err = s.Write(binary.LittleEndian.AppendUint32(hb[:0], crc))
	return true, err
}

// streamErr classifies a stream error as ErrTimeout or ErrReset (frame
// errors pass through).
func streamErr(err error) error {
	var ne net.Error
	var se *network.StreamError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ne) && ne.Timeout():
		return fmt.Errorf("%w: %v", ErrTimeout, err)
	case errors.Is(err, network.ErrReset), errors.As(err, &se):
		return fmt.Errorf("%w: %v", ErrReset, err)
	case errors.Is(err, network.ErrLimitedConn):
		return fmt.Errorf("%w: %v", ErrLimitedConn, err)
	}
	return err
}

// poolFor returns the shared stream pool for p.
func (ts *tensors) poolFor(p peer.ID) (*streamPool, error) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.closed {
		return nil, ErrClosed
	}
	pool := ts.pools[p]
	if pool == nil {
		pool = &streamPool{ts: ts, p: p, maxIdle: 2 * ts.cfg.Stripes, maxStripes: ts.cfg.Stripes}
		ts.pools[p] = pool
	}
	return pool, nil
}

// close stops the service: pending Recvs fail with ErrClosed, streams are
// reset, and close waits for the stream handlers to return.
func (ts *tensors) close() {
	ts.host.RemoveStreamHandler(ProtocolID)
	ts.mu.Lock()
	if ts.closed {
		ts.mu.Unlock()
		return
	}
	ts.closed = true
	for k, r := range ts.posted {
		delete(ts.posted, k)
		r.err = ErrClosed
		close(r.done)
	}
	for _, a := range ts.asm {
		ts.failLocked(a, ErrClosed)
	}
	for s := range ts.inbound {
		s.Reset()
	}
	pools := make([]*streamPool, 0, len(ts.pools)+len(ts.links))
	for _, p := range ts.pools {
		pools = append(pools, p)
	}
	for p := range ts.links {
		pools = append(pools, p)
	}
	ts.broadcast()
	ts.mu.Unlock()
	for _, p := range pools {
		p.close()
	}
	ts.wg.Wait()
}

// streamPool keeps idle outbound tensor streams to one peer for reuse.
type streamPool struct {
	ts         *tensors
	p          peer.ID
	maxIdle    int
	maxStripes int

	mu     sync.Mutex
	idle   []idleStream
	closed bool
}

type idleStream struct {
	s     network.Stream
	since time.Time
}

// get returns an idle stream (reused=true) or opens a new one. Streams idle
// for more than half of IdleTimeout are closed instead of reused: the
// receiver closes its end after IdleTimeout.
func (p *streamPool) get(ctx context.Context) (network.Stream, bool, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, false, ErrClosed
	}
	now := time.Now()
	for len(p.idle) > 0 {
		is := p.idle[len(p.idle)-1]
		p.idle = p.idle[:len(p.idle)-1]
		if now.Sub(is.since) < p.ts.cfg.IdleTimeout/2 && !is.s.Conn().IsClosed() {
			p.mu.Unlock()
			return is.s, true, nil
		}
		is.s.Close()
	}
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, p.ts.cfg.IOTimeout)
	defer cancel()
	// With only a relayed connection, NewStream waits (until ctx ends) for
	// hole punching to bring a direct one; tensors never take the relay.
	s, err := OpenStream(ctx, p.ts.host, p.p, ProtocolID)
	if err != nil {
		if errors.Is(err, network.ErrLimitedConn) || p.onlyLimited() {
			return nil, false, fmt.Errorf("%w: %v", ErrLimitedConn, err)
		}
		return nil, false, err
	}
	if s.Conn().Stat().Limited { // never put a tensor on a relay
		s.Reset()
		return nil, false, ErrLimitedConn
	}
	return s, false, nil
}

// onlyLimited reports whether every connection to the peer is limited.
func (p *streamPool) onlyLimited() bool {
	conns := p.ts.host.Network().ConnsToPeer(p.p)
	for _, c := range conns {
		if !c.Stat().Limited {
			return false
		}
	}
	return len(conns) > 0
}

// put returns a healthy stream to the pool.
func (p *streamPool) put(s network.Stream) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || len(p.idle) >= p.maxIdle {
		s.Close()
		return
	}
	p.idle = append(p.idle, idleStream{s, time.Now()})
}

func (p *streamPool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, is := range p.idle {
		is.s.Close()
	}
	p.idle = nil
}
