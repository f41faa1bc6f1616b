package serve

import (
	"context"
	"fmt"
	"time"
	"unsafe"

	"github.com/starling-ml/starling/compression"
	"github.com/starling-ml/starling/gossip/wire"
	"github.com/starling-ml/starling/swarm"
)

// The publish-and-mix ops of asynchronous strategies (FedAsync, FedBuff):
// "announce" serves a vector from the shared memory over the peer's
// tensor streams and announces it on the control plane; "next" waits for
// the next announcement of another peer, pulls its vector into the shared
// memory and returns its metadata. The mixing (staleness weights, FedBuff's
// buffer) is the client's.

// maxAsyncFetch bounds what "next" pulls (2 GiB); fetchTimeout bounds
// the pull once an announcement is there.
const (
	maxAsyncFetch = 2 << 30
	fetchTimeout  = time.Minute
)

func (s *session) streamNet() (*swarm.StreamNet, error) {
	if s.async != nil {
		return s.async, nil
	}
	t, err := swarm.NewStreamTransport(s.peer.Node, s.models, maxAsyncFetch)
	if err != nil {
		return nil, err
	}
	s.async = &swarm.StreamNet{CP: s.peer.Control, T: t}
	return s.async, nil
}

// f32bytes views v as its little-endian bytes (the fp32 codec's wire form
// on the little-endian machines Go's float32 layout gives here).
func f32bytes(v []float32) []byte {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v))
}

func (s *session) doAnnounce(ctx context.Context, r Request) Response {
	if s.peer == nil {
		return fail(CodeState, "announce before join")
	}
	src, err := s.span("src", r.Src, r.Count)
	if err != nil {
		return fail(CodeUsage, "announce: %v", err)
	}
	kind := wire.KindModel
	switch r.Kind {
	case "", "model":
	case "delta":
		kind = wire.KindDelta
	default:
		return fail(CodeUsage, "announce: kind %q (want model or delta)", r.Kind)
	}
	if r.Base > r.Version {
		return fail(CodeUsage, "announce: base %d > version %d", r.Base, r.Version)
	}
	sn, err := s.streamNet()
	if err != nil {
		return fail(CodeFailed, "announce: %v", err)
	}
	s.seq++
	// Serve keeps the bytes it is given: a copy, so the client may reuse
	// its shared memory at once.
	payload := append([]byte(nil), f32bytes(src)...)
	samples := uint64(max(r.Weight, 1))
	a := wire.Announcement{Version: r.Version, Base: r.Base, Kind: kind, Codec: compression.IDFP32, Elems: uint32(len(src)),
		Samples: samples, Loss: float32(r.Loss), Key: fmt.Sprintf("serve/%d", s.seq)}
	cctx, cancel := context.WithTimeout(ctx, timeout(r, 30*time.Second))
	defer cancel()
	if err := sn.Publish(cctx, a, payload); err != nil {
		return fail(CodeFailed, "announce: %v", err)
	}
	sn.SetStatus(r.Version, 0)
	return Response{OK: true}
}

func (s *session) doNext(ctx context.Context, r Request) Response {
	if s.peer == nil {
		return fail(CodeState, "next before join")
	}
	dst, err := s.span("dst", r.Dst, r.Count)
	if err != nil {
		return fail(CodeUsage, "next: %v", err)
	}
	sn, err := s.streamNet()
	if err != nil {
		return fail(CodeFailed, "next: %v", err)
	}
	d := timeout(r, 30*time.Second)
	cctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	a, err := sn.Next(cctx)
	if err != nil {
		if cctx.Err() != nil && ctx.Err() == nil {
			return fail(CodeTimeout, "next: no announcement from another peer within %v", d)
		}
		return fail(CodeFailed, "next: %v", err)
	}
	resp := Response{ID: string(a.Peer), StateVersion: a.Version, Round: a.Base, Total: float64(a.Samples), Kind: "model"}
	if a.Kind == wire.KindDelta {
		resp.Kind = "delta"
	}
	if a.Codec != compression.IDFP32 || int64(a.Elems) != r.Count {
		return Response{Code: CodeMismatch, ID: resp.ID, Error: fmt.Sprintf("next: peer %s announced %d values (codec %d), this peer's tensors hold %d", a.Peer, a.Elems, a.Codec, r.Count)}
	}
	// The wait was for the announcement; the pull has its own deadline.
	fctx, fcancel := context.WithTimeout(ctx, fetchTimeout)
	defer fcancel()
	buf, err := sn.Fetch(fctx, a, f32bytes(dst)[:0])
	if err != nil {
		// The peer may have left since: the client skips it and goes on.
		return Response{Code: CodeGone, ID: string(a.Peer), Error: fmt.Sprintf("next: fetching %s's version %d: %v", a.Peer, a.Version, err)}
	}
	if len(buf) != 4*len(dst) {
		return fail(CodeMismatch, "next: %s sent %d bytes, want %d", a.Peer, len(buf), 4*len(dst))
	}
	if &buf[0] != &f32bytes(dst)[0] {
		copy(f32bytes(dst), buf)
	}
	resp.OK = true
	return resp
}
