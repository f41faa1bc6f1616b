package wire

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"

	ma "github.com/multiformats/go-multiaddr"
	mh "github.com/multiformats/go-multihash"

	"github.com/starling-ml/starling/compression"
	"github.com/starling-ml/starling/peerid"
)

// newPeerID returns the text form of the libp2p peer ID of an Ed25519 key
// (seed repeated): the identity multihash of the key's protobuf encoding
// (type Ed25519, 32 bytes), as libp2p builds it.
func newPeerID(t testing.TB, seed byte) peerid.ID {
	t.Helper()
	key := append([]byte{0x08, 0x01, 0x12, 0x20}, bytes.Repeat([]byte{seed}, 32)...)
	m, err := mh.Encode(key, mh.IDENTITY)
	if err != nil {
		t.Fatal(err)
	}
	return peerid.ID(mh.Multihash(m).B58String())
}

func sampleHeartbeat(t testing.TB) *Heartbeat {
	return &Heartbeat{
		Peer:   newPeerID(t, 1),
		Seq:    1700000000123456789,
		Model:  "mnist-mlp",
		Status: Status{Version: 42, JoinAt: 7, Stopped: true, SamplesPerSec: 1234.5},
		Addrs: []ma.Multiaddr{
			ma.StringCast("/ip4/10.0.0.2/tcp/4001"),
			ma.StringCast("/ip6/::1/udp/4001/quic-v1"),
		},
	}
}

func sampleAnnouncement(t testing.TB) *Announcement {
	return &Announcement{
		Peer:    newPeerID(t, 2),
		Seq:     7,
		Model:   "mnist-mlp",
		Version: 43,
		Base:    40,
		Kind:    KindDelta,
		Codec:   compression.IDTopK | compression.IDEntropy,
		Elems:   101770,
		Size:    20480,
		Samples: 640,
		Loss:    0.25,
		Digest:  sha256.Sum256([]byte("payload")),
		Holder:  newPeerID(t, 3),
		Key:     "delta/43",
	}
}

func TestWireRoundTrip(t *testing.T) {
	hb := sampleHeartbeat(t)
	b := AppendHeartbeat(nil, hb)
	got, err := DecodeHeartbeat(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.Peer != hb.Peer || got.Seq != hb.Seq || got.Model != hb.Model || got.Version != hb.Version ||
		got.SamplesPerSec != hb.SamplesPerSec || len(got.Addrs) != 2 ||
		!got.Addrs[0].Equal(hb.Addrs[0]) || !got.Addrs[1].Equal(hb.Addrs[1]) {
		t.Fatalf("heartbeat round trip: %+v != %+v", got, hb)
	}
	t.Logf("heartbeat with 2 addresses: %d bytes", len(b))

	a := sampleAnnouncement(t)
	b = AppendAnnouncement(nil, a)
	ga, err := DecodeAnnouncement(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(ga, a) {
		t.Fatalf("announcement round trip:\n%+v\n%+v", ga, a)
	}
	t.Logf("announcement: %d bytes", len(b))
	if ga.Source() != a.Holder {
		t.Error("Source should be the holder")
	}
	ga.Holder = ""
	if ga.Source() != a.Peer {
		t.Error("Source without a holder should be the sender")
	}
	// No holder and no addresses encode too.
	a.Holder, a.Key = "", ""
	if ga, err = DecodeAnnouncement(AppendAnnouncement(nil, a)); err != nil || ga.Holder != "" {
		t.Fatalf("empty holder: %v %v", ga, err)
	}
	// Appending reuses dst.
	buf := make([]byte, 0, 512)
	out := AppendHeartbeat(buf, hb)
	if &out[0] != &buf[:1][0] {
		t.Error("AppendHeartbeat did not reuse dst")
	}
	// A heartbeat in the announcement decoder and vice versa is malformed.
	if _, err := DecodeAnnouncement(AppendHeartbeat(nil, hb)); !errors.Is(err, ErrMalformed) {
		t.Errorf("heartbeat as announcement: %v", err)
	}
	if _, err := DecodeHeartbeat(AppendAnnouncement(nil, a)); !errors.Is(err, ErrMalformed) {
		t.Errorf("announcement as heartbeat: %v", err)
	}
}

func TestWireRejects(t *testing.T) {
	hb := func(f func(*Heartbeat)) []byte {
		h := sampleHeartbeat(t)
		f(h)
		return AppendHeartbeat(nil, h)
	}
	an := func(f func(*Announcement)) []byte {
		a := sampleAnnouncement(t)
		f(a)
		return AppendAnnouncement(nil, a)
	}
	good := AppendHeartbeat(nil, sampleHeartbeat(t))
	manyAddrs := make([]ma.Multiaddr, MaxAddrs+1)
	for i := range manyAddrs {
		manyAddrs[i] = ma.StringCast("/ip4/1.2.3.4/tcp/1")
	}
	cases := []struct {
		name string
		b    []byte
		ann  bool
		want error
	}{
		{"empty", nil, false, ErrMalformed},
		{"version", append([]byte{1}, good[1:]...), false, ErrVersion},
		{"truncated", good[:len(good)-3], false, ErrMalformed},
		{"trailing", append(append([]byte(nil), good...), 0), false, ErrMalformed},
		{"bad peer id", hb(func(h *Heartbeat) { h.Peer = "not-a-peer-id" }), false, ErrMalformed},
		{"empty peer id", hb(func(h *Heartbeat) { h.Peer = "" }), false, ErrMalformed},
		{"long model", hb(func(h *Heartbeat) { h.Model = string(make([]byte, MaxModelIDLen+1)) }), false, ErrTooLarge},
		{"NaN samples/s", hb(func(h *Heartbeat) { h.SamplesPerSec = float32(math.NaN()) }), false, ErrNonFinite},
		{"Inf samples/s", hb(func(h *Heartbeat) { h.SamplesPerSec = float32(math.Inf(1)) }), false, ErrNonFinite},
		{"negative samples/s", hb(func(h *Heartbeat) { h.SamplesPerSec = -1 }), false, ErrMalformed},
		{"too many addrs", hb(func(h *Heartbeat) { h.Addrs = manyAddrs }), false, ErrTooLarge},
		{"NaN loss", an(func(a *Announcement) { a.Loss = float32(math.NaN()) }), true, ErrNonFinite},
		{"-Inf loss", an(func(a *Announcement) { a.Loss = float32(math.Inf(-1)) }), true, ErrNonFinite},
		{"base > version", an(func(a *Announcement) { a.Base = a.Version + 1 }), true, ErrMalformed},
		{"kind 0", an(func(a *Announcement) { a.Kind = 0 }), true, ErrMalformed},
		{"kind 9", an(func(a *Announcement) { a.Kind = 9 }), true, ErrMalformed},
		{"unknown codec", an(func(a *Announcement) { a.Codec = 0x7f }), true, ErrMalformed},
		{"huge size", an(func(a *Announcement) { a.Size = MaxPullSize + 1 }), true, ErrTooLarge},
		{"long key", an(func(a *Announcement) { a.Key = string(make([]byte, MaxKeyLen+1)) }), true, ErrTooLarge},
		{"bad holder", an(func(a *Announcement) { a.Holder = "xx" }), true, ErrMalformed},
	}
	// A hand-built address that is not a multiaddr.
	badAddr := []byte{FormatVersion, kindHeartbeat}
	badAddr = appendBytes(badAddr, []byte(newPeerID(t, 1)))
	badAddr = binary.AppendUvarint(badAddr, 1)
	badAddr = appendBytes(badAddr, []byte("m"))
	badAddr = binary.AppendUvarint(badAddr, 1)
	badAddr = binary.LittleEndian.AppendUint32(badAddr, 0)
	badAddr = binary.AppendUvarint(badAddr, 1)
	badAddr = appendBytes(badAddr, []byte{0xff, 0xff, 0xff})
	cases = append(cases, struct {
		name string
		b    []byte
		ann  bool
		want error
	}{"bad multiaddr", badAddr, false, ErrMalformed})
	// Elements beyond the cap.
	hugeElems := []byte{FormatVersion, kindAnnounce}
	hugeElems = appendBytes(hugeElems, []byte(newPeerID(t, 1)))
	hugeElems = binary.AppendUvarint(hugeElems, 1)
	hugeElems = appendBytes(hugeElems, []byte("m"))
	hugeElems = binary.AppendUvarint(hugeElems, 2)
	hugeElems = binary.AppendUvarint(hugeElems, 1)
	hugeElems = append(hugeElems, byte(KindDelta), 0)
	hugeElems = binary.AppendUvarint(hugeElems, MaxElems+1)
	cases = append(cases, struct {
		name string
		b    []byte
		ann  bool
		want error
	}{"huge elems", hugeElems, true, ErrTooLarge})

	for _, c := range cases {
		var err error
		if c.ann {
			_, err = DecodeAnnouncement(c.b)
		} else {
			_, err = DecodeHeartbeat(c.b)
		}
		if !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
}

// TestWireVersion: a message of another format version (a peer on another
// Starling release) fails with ErrVersion, whose text names both versions,
// and not as a malformed message; bytes that only start with another
// version byte are malformed.
func TestWireVersion(t *testing.T) {
	for _, b := range [][]byte{
		append([]byte{1}, AppendHeartbeat(nil, sampleHeartbeat(t))[1:]...),
		{1, kindHeartbeat, 38, 0, 36, 8, 1}, // a v1 heartbeat's start: binary peer ID
		{3, kindAnnounce},
	} {
		_, err := DecodeHeartbeat(b)
		if !errors.Is(err, ErrVersion) || errors.Is(err, ErrMalformed) {
			t.Fatalf("% x: %v, want ErrVersion only", b, err)
		}
		if msg := err.Error(); !strings.Contains(msg, fmt.Sprintf("format %d", b[0])) || !strings.Contains(msg, "format 2") {
			t.Errorf("%q does not name both versions", msg)
		}
	}
	_, err := DecodeAnnouncement(append([]byte{1}, AppendAnnouncement(nil, sampleAnnouncement(t))[1:]...))
	if !errors.Is(err, ErrVersion) {
		t.Fatalf("v1 announcement: %v, want ErrVersion", err)
	}
	for _, b := range [][]byte{[]byte("garbage"), {0, kindHeartbeat}, {1}} {
		if _, err := DecodeHeartbeat(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%q: %v, want ErrMalformed", b, err)
		}
	}
}

// wrapsSentinel reports whether a decoder's error wraps one of the
// documented sentinels.
func wrapsSentinel(err error) bool {
	for _, s := range []error{ErrVersion, ErrMalformed, ErrTooLarge, ErrNonFinite} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

func FuzzDecodeHeartbeat(f *testing.F) {
	f.Add(AppendHeartbeat(nil, sampleHeartbeat(f)))
	f.Add([]byte{FormatVersion, 1})
	f.Add([]byte{1, 1})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		hb, err := DecodeHeartbeat(b)
		if err != nil {
			if !wrapsSentinel(err) {
				t.Fatalf("error %v wraps no sentinel", err)
			}
			return
		}
		// Whatever decodes re-encodes to a message that decodes the same.
		b2 := AppendHeartbeat(nil, hb)
		hb2, err := DecodeHeartbeat(b2)
		if err != nil {
			t.Fatalf("re-encoded heartbeat does not decode: %v", err)
		}
		if !bytes.Equal(AppendHeartbeat(nil, hb2), b2) {
			t.Fatal("encoding is not stable")
		}
	})
}

func FuzzDecodeAnnouncement(f *testing.F) {
	f.Add(AppendAnnouncement(nil, sampleAnnouncement(f)))
	f.Add([]byte{FormatVersion, 2})
	f.Add([]byte{1, 2})
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := DecodeAnnouncement(b)
		if err != nil {
			if !wrapsSentinel(err) {
				t.Fatalf("error %v wraps no sentinel", err)
			}
			return
		}
		a2, err := DecodeAnnouncement(AppendAnnouncement(nil, a))
		if err != nil {
			t.Fatalf("re-encoded announcement does not decode: %v", err)
		}
		if !reflect.DeepEqual(a, a2) {
			t.Fatalf("round trip changed it: %+v %+v", a, a2)
		}
	})
}

func BenchmarkDecodeAnnouncement(b *testing.B) {
	buf := AppendAnnouncement(nil, sampleAnnouncement(b))
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeAnnouncement(buf); err != nil {
			b.Fatal(err)
		}
	}
}

// TestHeartbeatStatus: the status travels as fields of its own (a join
// step, a stopped flag), not packed into the version, and a flags byte
// with unknown bits is malformed.
func TestHeartbeatStatus(t *testing.T) {
	for _, st := range []Status{{Version: 5}, {JoinAt: 1 << 63, Version: 1 << 62}, {Version: 3, Stopped: true}} {
		hb := sampleHeartbeat(t)
		hb.Status = st
		got, err := DecodeHeartbeat(AppendHeartbeat(nil, hb))
		if err != nil || got.Status != st {
			t.Errorf("%+v: decoded %+v, %v", st, got, err)
		}
	}
	hb := sampleHeartbeat(t)
	hb.Status = Status{Version: 3, JoinAt: 9}
	b := AppendHeartbeat(nil, hb)
	i := bytes.Index(b, []byte{3, 9, 0}) + 2 // version, join step, flags
	b[i] = 0x02
	if _, err := DecodeHeartbeat(b); !errors.Is(err, ErrMalformed) {
		t.Errorf("unknown flag bit: %v, want ErrMalformed", err)
	}
}
