package wire

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"

	ma "github.com/multiformats/go-multiaddr"
	mh "github.com/multiformats/go-multihash"

	"github.com/starling-ml/starling/compression"
	"github.com/starling-ml/starling/peerid"
)

// Wire format, version 2. Every message starts with the format version and
// its kind; integers are unsigned varints, floats little-endian IEEE 754
// float32, byte strings a varint length then the bytes. A peer ID is its
// text (base58) form, which must decode to a multihash. Decoders reject
// other format versions (ErrVersion), unknown kinds, over-long fields,
// non-finite floats and trailing bytes; they never panic.
//
//	heartbeat:    2 1 peer seq model version joinat flags samples/s naddrs {addr}
//	announcement: 2 2 peer seq model version base kind codec elems size
//	              samples loss digest[32] holder key
//
// A heartbeat's flags byte has bit 0 set when the peer stopped training
// (Status.Stopped); the other bits are 0. Version 1 carried peer IDs as
// their binary multihash and packed the status flags into the model
// version's top bits; the two do not interoperate.
const (
	// FormatVersion is the wire format this package speaks.
	FormatVersion = 2
	kindHeartbeat = 1
	kindAnnounce  = 2
)

// Field caps. They bound what a peer can make us allocate.
const (
	MaxPeerIDLen  = 128 // bytes of a peer ID's text form (Ed25519 ones are 52)
	MaxModelIDLen = 64  // bytes of a model id
	MaxAddrs      = 16  // addresses in a heartbeat
	MaxAddrLen    = 256 // bytes of one binary multiaddr
	MaxKeyLen     = 128 // bytes of an announcement's pull key
	// MaxElems bounds an announced vector's length (2^31−1 float32s, 8 GiB).
	MaxElems = math.MaxInt32
	// MaxPullSize bounds the announced encoded size (16 GiB).
	MaxPullSize = 16 << 30
)

// Heartbeat is a peer's periodic membership message.
type Heartbeat struct {
	Peer  peerid.ID // the sender; must be the message's signer
	Seq   uint64    // increases with every message the sender publishes
	Model string    // model id the sender trains
	Status
	Addrs []ma.Multiaddr // where the sender listens (for pulling tensors)
}

// Status is what a peer tells the others of its progress in every
// heartbeat.
type Status struct {
	// Version is the sender's model version (rounds or steps applied).
	Version uint64
	// JoinAt, when not 0, is the step at which the sender declared it
	// joins a synchronous job (Version is then not meaningful).
	JoinAt uint64
	// Stopped says the sender stopped training before the job's end; it
	// takes part in nothing more, although it may stay reachable.
	Stopped bool
	// SamplesPerSec is the sender's recent training throughput, finite
	// and ≥ 0.
	SamplesPerSec float32
}

const flagStopped = 1 << 0

// PayloadKind says what an announced vector is.
type PayloadKind uint8

// Payload kinds.
const (
	KindDelta    PayloadKind = 1 // model delta: new − base
	KindModel    PayloadKind = 2 // full parameters at Version
	KindGradient PayloadKind = 3 // gradient computed at Base
)

func (k PayloadKind) String() string {
	switch k {
	case KindDelta:
		return "delta"
	case KindModel:
		return "model"
	case KindGradient:
		return "gradient"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Announcement says that a vector is ready to be pulled. The vector itself
// never rides GossipSub: a receiver that wants it opens a node/ tensor
// stream to Holder (or to Peer when Holder is empty) and asks for Key.
type Announcement struct {
	Peer    peerid.ID      // the sender; must be the message's signer
	Seq     uint64         // increases with every message the sender publishes
	Model   string         // model id
	Version uint64         // model version this vector produces (or is, for KindModel)
	Base    uint64         // model version it was computed from; Base ≤ Version
	Kind    PayloadKind    // delta, model or gradient
	Codec   compression.ID // how the vector is encoded on the stream
	Elems   uint32         // vector length in float32 values
	Size    uint64         // encoded size in bytes
	Samples uint64         // training samples behind it (FedAvg weights)
	Loss    float32        // training loss at Version, finite
	Digest  [32]byte       // SHA-256 of the encoded bytes
	Holder  peerid.ID      // who serves the bytes; empty means Peer
	Key     string         // what to ask Holder for
}

// Source returns the peer to pull from: Holder, or Peer when Holder is empty.
func (a *Announcement) Source() peerid.ID {
	if a.Holder != "" {
		return a.Holder
	}
	return a.Peer
}

// Digest returns the SHA-256 of an encoded vector, as announcements carry
// it.
func Digest(b []byte) [32]byte { return sha256.Sum256(b) }

// AppendHeartbeat appends hb's encoding to dst and returns it.
func AppendHeartbeat(dst []byte, hb *Heartbeat) []byte {
	dst = append(dst, FormatVersion, kindHeartbeat)
	dst = appendBytes(dst, []byte(hb.Peer))
	dst = binary.AppendUvarint(dst, hb.Seq)
	dst = appendBytes(dst, []byte(hb.Model))
	dst = binary.AppendUvarint(dst, hb.Version)
	dst = binary.AppendUvarint(dst, hb.JoinAt)
	var flags byte
	if hb.Stopped {
		flags |= flagStopped
	}
	dst = append(dst, flags)
	dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(hb.SamplesPerSec))
	dst = binary.AppendUvarint(dst, uint64(len(hb.Addrs)))
	for _, a := range hb.Addrs {
		dst = appendBytes(dst, a.Bytes())
	}
	return dst
}

// AppendAnnouncement appends a's encoding to dst and returns it.
func AppendAnnouncement(dst []byte, a *Announcement) []byte {
	dst = append(dst, FormatVersion, kindAnnounce)
	dst = appendBytes(dst, []byte(a.Peer))
	dst = binary.AppendUvarint(dst, a.Seq)
	dst = appendBytes(dst, []byte(a.Model))
	dst = binary.AppendUvarint(dst, a.Version)
	dst = binary.AppendUvarint(dst, a.Base)
	dst = append(dst, byte(a.Kind), byte(a.Codec))
	dst = binary.AppendUvarint(dst, uint64(a.Elems))
	dst = binary.AppendUvarint(dst, a.Size)
	dst = binary.AppendUvarint(dst, a.Samples)
	dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(a.Loss))
	dst = append(dst, a.Digest[:]...)
	dst = appendBytes(dst, []byte(a.Holder))
	dst = appendBytes(dst, []byte(a.Key))
	return dst
}

func appendBytes(dst, b []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	return append(dst, b...)
}

// DecodeHeartbeat decodes a heartbeat. Errors wrap ErrVersion,
// ErrMalformed, ErrTooLarge or ErrNonFinite.
func DecodeHeartbeat(b []byte) (*Heartbeat, error) {
	r := reader{b: b}
	r.header(kindHeartbeat)
	hb := &Heartbeat{}
	hb.Peer = r.peerID("peer", false)
	hb.Seq = r.uvarint("seq")
	hb.Model = string(r.bytes("model", MaxModelIDLen))
	hb.Version = r.uvarint("version")
	hb.JoinAt = r.uvarint("join step")
	switch flags := r.byte("flags"); {
	case r.err != nil:
	case flags&^flagStopped != 0:
		r.fail(ErrMalformed, "unknown heartbeat flags %#x", flags)
	default:
		hb.Stopped = flags&flagStopped != 0
	}
	hb.SamplesPerSec = r.float32("samples/s")
	if r.err == nil && hb.SamplesPerSec < 0 {
		r.fail(ErrMalformed, "samples/s %v < 0", hb.SamplesPerSec)
	}
	n := r.uvarint("address count")
	if r.err == nil && n > MaxAddrs {
		r.fail(ErrTooLarge, "%d addresses, at most %d", n, MaxAddrs)
	}
	for i := uint64(0); r.err == nil && i < n; i++ {
		ab := r.bytes("address", MaxAddrLen)
		if r.err != nil {
			break
		}
		a, err := ma.NewMultiaddrBytes(ab)
		if err != nil {
			r.fail(ErrMalformed, "address %d: %v", i, err)
			break
		}
		hb.Addrs = append(hb.Addrs, a)
	}
	r.end()
	if r.err != nil {
		return nil, r.err
	}
	return hb, nil
}

// DecodeAnnouncement decodes an announcement. Errors wrap ErrVersion,
// ErrMalformed, ErrTooLarge or ErrNonFinite.
func DecodeAnnouncement(b []byte) (*Announcement, error) {
	r := reader{b: b}
	r.header(kindAnnounce)
	a := &Announcement{}
	a.Peer = r.peerID("peer", false)
	a.Seq = r.uvarint("seq")
	a.Model = string(r.bytes("model", MaxModelIDLen))
	a.Version = r.uvarint("version")
	a.Base = r.uvarint("base")
	if r.err == nil && a.Base > a.Version {
		r.fail(ErrMalformed, "base %d > version %d", a.Base, a.Version)
	}
	a.Kind = PayloadKind(r.byte("kind"))
	if r.err == nil && (a.Kind < KindDelta || a.Kind > KindGradient) {
		r.fail(ErrMalformed, "unknown payload kind %d", a.Kind)
	}
	a.Codec = compression.ID(r.byte("codec"))
	if r.err == nil && !compression.Known(a.Codec) {
		r.fail(ErrMalformed, "unknown codec id %#x", uint8(a.Codec))
	}
	elems := r.uvarint("elems")
	if r.err == nil && elems > MaxElems {
		r.fail(ErrTooLarge, "%d elements, at most %d", elems, MaxElems)
	}
	a.Elems = uint32(elems)
	a.Size = r.uvarint("size")
	if r.err == nil && a.Size > MaxPullSize {
		r.fail(ErrTooLarge, "size %d, at most %d", a.Size, MaxPullSize)
	}
	a.Samples = r.uvarint("samples")
	a.Loss = r.float32("loss")
	copy(a.Digest[:], r.take("digest", len(a.Digest)))
	a.Holder = r.peerID("holder", true)
	a.Key = string(r.bytes("key", MaxKeyLen))
	r.end()
	if r.err != nil {
		return nil, r.err
	}
	return a, nil
}

// reader decodes fields in order and remembers the first error; after an
// error every read returns a zero value.
type reader struct {
	b   []byte
	off int
	err error
}

func (r *reader) fail(sentinel error, format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: "+format, append([]any{sentinel}, args...)...)
	}
}

// header reads the format version and the kind. The header of a control
// message (a known kind) in another format version is reported as such
// (ErrVersion), before anything else is read: the rest may be laid out in
// any way. Other headers are malformed.
func (r *reader) header(kind byte) {
	v, k := r.byte("format version"), r.byte("kind")
	if r.err != nil {
		return
	}
	switch {
	case v != FormatVersion && v > 0 && (k == kindHeartbeat || k == kindAnnounce):
		r.fail(ErrVersion, "it sent format %d, this peer speaks format %d", v, FormatVersion)
	case v != FormatVersion:
		r.fail(ErrMalformed, "format version %d, want %d", v, FormatVersion)
	case k != kind:
		r.fail(ErrMalformed, "message kind %d, want %d", k, kind)
	}
}

func (r *reader) take(what string, n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || len(r.b)-r.off < n {
		r.fail(ErrMalformed, "%s: truncated", what)
		return nil
	}
	s := r.b[r.off : r.off+n]
	r.off += n
	return s
}

func (r *reader) byte(what string) byte {
	s := r.take(what, 1)
	if s == nil {
		return 0
	}
	return s[0]
}

func (r *reader) uvarint(what string) uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b[r.off:])
	if n <= 0 {
		r.fail(ErrMalformed, "%s: bad varint", what)
		return 0
	}
	r.off += n
	return v
}

func (r *reader) bytes(what string, max int) []byte {
	n := r.uvarint(what + " length")
	if r.err != nil {
		return nil
	}
	if n > uint64(max) {
		r.fail(ErrTooLarge, "%s: %d bytes, at most %d", what, n, max)
		return nil
	}
	return r.take(what, int(n))
}

func (r *reader) float32(what string) float32 {
	s := r.take(what, 4)
	if s == nil {
		return 0
	}
	f := math.Float32frombits(binary.LittleEndian.Uint32(s))
	if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
		r.fail(ErrNonFinite, "%s is %v", what, f)
		return 0
	}
	return f
}

// peerID reads a peer ID's text form and checks that it is one: base58
// of a multihash, as libp2p prints peer IDs. Base58 is a bijection, so an
// accepted ID is the one text of its peer (the signer check compares
// texts).
func (r *reader) peerID(what string, optional bool) peerid.ID {
	b := r.bytes(what, MaxPeerIDLen)
	if r.err != nil {
		return ""
	}
	if len(b) == 0 && optional {
		return ""
	}
	if _, err := mh.FromB58String(string(b)); err != nil {
		r.fail(ErrMalformed, "%s %q is not a peer ID: %v", what, b, err)
		return ""
	}
	return peerid.ID(b)
}

func (r *reader) end() {
	if r.err == nil && r.off != len(r.b) {
		r.fail(ErrMalformed, "%d trailing bytes", len(r.b)-r.off)
	}
}
