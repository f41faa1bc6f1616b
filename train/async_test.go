package train

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/starling-ml/starling/aggregate/rule"
	"github.com/starling-ml/starling/compression"
	"github.com/starling-ml/starling/data"
	"github.com/starling-ml/starling/gossip/wire"
	"github.com/starling-ml/starling/peerid"
	"github.com/starling-ml/starling/staleness"
)

const testArch = "mlp:784-32-10"

func testWorker(t testing.TB, shard *data.Set, dataSeed uint64) *Worker {
	t.Helper()
	cfg := DefaultWorkerConfig()
	cfg.Model = testArch
	cfg.DataSeed = dataSeed
	w, err := NewWorker(cfg, shard)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// shards splits the first n training samples IID between k peers.
func shards(t testing.TB, n, k int) []*data.Set {
	t.Helper()
	tr, _ := mnist(t)
	parts, err := data.IID(n, k, 7)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]*data.Set, k)
	for i, p := range parts {
		out[i] = tr.Subset(p)
	}
	return out
}

func TestAsyncConfigValidate(t *testing.T) {
	if err := DefaultAsyncConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*AsyncConfig){
		"mode":     func(c *AsyncConfig) { c.Mode = "sync" },
		"model":    func(c *AsyncConfig) { c.Model = "" },
		"steps":    func(c *AsyncConfig) { c.LocalSteps = 0 },
		"alpha":    func(c *AsyncConfig) { c.Alpha = 1.5 },
		"alpha0":   func(c *AsyncConfig) { c.Alpha = 0 },
		"rule":     func(c *AsyncConfig) { c.Mode, c.BufferRule = ModeFedBuff, rule.Krum{F: 1, M: 1} },
		"k":        func(c *AsyncConfig) { c.BufferK = 0 },
		"lr":       func(c *AsyncConfig) { c.ServerLR = math.Inf(1) },
		"codec":    func(c *AsyncConfig) { c.Codec = compression.Spec{} },
		"timeout":  func(c *AsyncConfig) { c.FetchTimeout = 0 },
		"fetchers": func(c *AsyncConfig) { c.Fetchers = 0 },
		"inbox":    func(c *AsyncConfig) { c.Inbox = 0 },
	} {
		c := DefaultAsyncConfig()
		mut(&c)
		if err := c.Validate(); !errors.Is(err, ErrStrategy) {
			t.Errorf("%s: %v, want ErrStrategy", name, err)
		}
	}
}

// injectNet is the AsyncNet of TestAsyncDropsBadInput: Next returns the
// announcement last injected and Fetch its payload, checked against the
// announced size and digest as a transport checks it.
type injectNet struct {
	self    peerid.ID
	a       wire.Announcement
	payload []byte
}

func (n *injectNet) Inject(a wire.Announcement, payload []byte) {
	n.a, n.payload = a, slices.Clone(payload)
}

func (n *injectNet) Self() peerid.ID                                          { return n.self }
func (n *injectNet) Publish(context.Context, wire.Announcement, []byte) error { return nil }
func (n *injectNet) SetStatus(uint64, float32)                                {}

func (n *injectNet) Next(context.Context) (*wire.Announcement, error) {
	a := n.a
	return &a, nil
}

func (n *injectNet) Fetch(_ context.Context, a *wire.Announcement, dst []byte) ([]byte, error) {
	if uint64(len(n.payload)) != a.Size || wire.Digest(n.payload) != a.Digest {
		return dst[:0], errors.New("fetched bytes do not match the announcement")
	}
	return append(dst[:0], n.payload...), nil
}

// TestAsyncDropsBadInput feeds one bad contribution at a time through the
// whole receive path (screen, fetch, decode, merge) of a FedAsync and a
// FedBuff peer and checks that each is dropped, counted under its reason,
// and leaves the model (and FedBuff's buffer) bit for bit unchanged; a good
// one then does reach the model.
func TestAsyncDropsBadInput(t *testing.T) {
	sh := shards(t, 512, 1)
	for _, mode := range []string{ModeFedAsync, ModeFedBuff} {
		t.Run(mode, func(t *testing.T) {
			w := testWorker(t, sh[0], 1)
			cfg := DefaultAsyncConfig()
			cfg.Mode = mode
			cfg.Policy = mustPolicy(t, "poly:0.5+ssp:4")
			net := &injectNet{self: "me"}
			p, err := newAsyncPeer(w, "me", cfg, nil, asyncOptions{})
			if err != nil {
				t.Fatal(err)
			}
			const local = 10
			p.vc.Set(local)
			p.local.Store(local)
			dim := len(w.Model.Params)
			kind := p.plan.kind
			fp32, _ := compression.Parse("fp32")
			vec := func(n int, poison float32) []float32 {
				v := make([]float32, n)
				for i := range v {
					v[i] = 0.01 * float32(i%7)
				}
				if poison != 0 {
					v[n/2] = poison
				}
				return v
			}
			seq := uint64(100)
			ann := func(base uint64, payload []byte) wire.Announcement {
				seq++
				return wire.Announcement{Peer: "evil", Seq: seq, Model: cfg.Model, Version: base + 1, Base: base,
					Kind: kind, Codec: fp32.ID(), Elems: uint32(dim), Size: uint64(len(payload)),
					Digest: wire.Digest(payload), Key: fmt.Sprint("k", seq)}
			}
			good := fp32.Encode(nil, vec(dim, 0))
			ctx := context.Background()
			process := func(a wire.Announcement, payload []byte) {
				t.Helper()
				net.Inject(a, payload)
				got, err := net.Next(ctx)
				if err != nil {
					t.Fatal(err)
				}
				s := p.screen(got)
				if s.observe {
					p.observe(got.Peer, got.Base)
				}
				if !s.pull {
					p.drop(s.drop, got.Peer, s.tau)
					return
				}
				c, r, ok := p.pull(ctx, net, got)
				if !ok {
					p.drop(r, got.Peer, 0)
					return
				}
				p.merge(c)
			}
			cases := []struct {
				name   string
				reason DropReason
				make   func() (wire.Announcement, []byte)
				direct *contribution // merged directly, past the screen
			}{
				{"unknown model id", DropModel, func() (wire.Announcement, []byte) {
					a := ann(local, good)
					a.Model = "someone-else"
					return a, good
				}, nil},
				{"wrong payload kind", DropKind, func() (wire.Announcement, []byte) {
					a := ann(local, good)
					a.Kind = wire.KindGradient
					return a, good
				}, nil},
				{"announced shape", DropShape, func() (wire.Announcement, []byte) {
					b := fp32.Encode(nil, vec(dim+1, 0))
					a := ann(local, b)
					a.Elems = uint32(dim + 1)
					return a, b
				}, nil},
				{"decoded shape", DropShape, func() (wire.Announcement, []byte) {
					b := fp32.Encode(nil, vec(dim-3, 0))
					return ann(local, b), b
				}, nil},
				{"NaN", DropNonFinite, func() (wire.Announcement, []byte) {
					b := fp32.Encode(nil, vec(dim, float32(math.NaN())))
					return ann(local, b), b
				}, nil},
				{"+Inf", DropNonFinite, func() (wire.Announcement, []byte) {
					b := fp32.Encode(nil, vec(dim, float32(math.Inf(1))))
					return ann(local, b), b
				}, nil},
				{"-Inf", DropNonFinite, func() (wire.Announcement, []byte) {
					b := fp32.Encode(nil, vec(dim, float32(math.Inf(-1))))
					return ann(local, b), b
				}, nil},
				{"beyond SSP bound", DropStale, func() (wire.Announcement, []byte) {
					return ann(local-5, good), good
				}, nil},
				{"far future base", DropFuture, func() (wire.Announcement, []byte) {
					return ann(local+cfg.MaxAhead+1, good), good
				}, nil},
				{"replayed seq", DropReplay, func() (wire.Announcement, []byte) {
					a := ann(local, good)
					a.Seq = 60 // already seen
					return a, good
				}, nil},
				{"seq too old", DropReplay, func() (wire.Announcement, []byte) {
					a := ann(local, good)
					a.Seq = 20 // more than 64 below the newest
					return a, good
				}, nil},
				{"digest mismatch", DropFetch, func() (wire.Announcement, []byte) {
					a := ann(local, good)
					a.Digest[0] ^= 1
					return a, good
				}, nil},
				{"corrupt encoding", DropDecode, func() (wire.Announcement, []byte) {
					b := slices.Clone(good)
					b[0] = 0x7f // not fp32's id
					return ann(local, b), b
				}, nil},
				{"merge: beyond SSP bound", DropStale, nil,
					&contribution{from: "evil", base: local - 6, version: local, kind: kind, vec: vec(dim, 0)}},
				{"merge: far future", DropFuture, nil,
					&contribution{from: "evil", base: local + cfg.MaxAhead + 5, version: local + cfg.MaxAhead + 6, kind: kind, vec: vec(dim, 0)}},
				{"merge: NaN", DropNonFinite, nil,
					&contribution{from: "evil", base: local, version: local + 1, kind: kind, vec: vec(dim, float32(math.NaN()))}},
				{"merge: shape", DropShape, nil,
					&contribution{from: "evil", base: local, version: local + 1, kind: kind, vec: vec(dim-1, 0)}},
			}
			p.seen["evil"] = &seqWindow{}
			p.seen["evil"].admit(60)
			p.seen["evil"].admit(100)
			for _, tc := range cases {
				before := slices.Clone(p.model())
				drops := p.dropCounts()
				if tc.direct != nil {
					p.merge(tc.direct)
				} else {
					process(tc.make())
				}
				after := p.dropCounts()
				if after[tc.reason] != drops[tc.reason]+1 || after.Total() != drops.Total()+1 {
					t.Fatalf("%s: drops %v → %v, want one more %s", tc.name, drops, after, tc.reason)
				}
				if !slices.Equal(before, p.model()) {
					t.Fatalf("%s reached the model", tc.name)
				}
				if p.buffer != nil && p.buffer.Len() != 0 {
					t.Fatalf("%s reached the buffer", tc.name)
				}
			}
			if p.merged != 0 || p.vc.Local() != local {
				t.Fatalf("merged %d, version %d after bad input only", p.merged, p.vc.Local())
			}
			// A good contribution gets through, so the checks above are not
			// vacuous.
			before := slices.Clone(p.model())
			process(ann(local, good), good)
			if p.merged != 1 {
				t.Fatalf("good contribution not merged; drops %v", p.dropCounts())
			}
			if p.buffer != nil {
				if p.buffer.Len() != 1 {
					t.Fatalf("good delta not buffered")
				}
			} else if slices.Equal(before, p.model()) {
				t.Fatal("good model not mixed")
			}
		})
	}
}

// TestFedBuffVotes walks a robust FedBuff buffer (K = 3, three other live
// peers: a quorum of 3 votes) through a flooding peer: its models fill the
// buffer but are one vote (a non-finite one is dropped); the buffer waits
// for the votes of the two others and then steps by no more than theirs.
func TestFedBuffVotes(t *testing.T) {
	_, te := mnist(t)
	w := testWorker(t, te.Head(100), 1)
	cfg := DefaultAsyncConfig()
	cfg.Mode, cfg.BufferK, cfg.BufferRule = ModeFedBuff, 3, rule.Median{}
	p, err := newAsyncPeer(w, "self", cfg, nil, asyncOptions{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for _, id := range []string{"a", "b", "liar"} {
		p.vc.Observe(id, 0, now)
	}
	if got := bufferQuorum(p.liveOthers()); got != 3 {
		t.Fatalf("quorum %d, want 3", got)
	}
	before := slices.Clone(p.server)
	delta := func(from peerid.ID, v float32) *contribution { // the model before + v
		x := slices.Clone(before)
		for i := range x {
			x[i] += v
		}
		return &contribution{from: from, kind: wire.KindModel, vec: x}
	}
	for _, v := range []float32{100, 200, float32(math.NaN()), 400} {
		p.merge(delta("liar", v))
	}
	if got := p.drops[DropNonFinite].Load(); got != 1 {
		t.Fatalf("%d non-finite drops, want 1", got)
	}
	p.merge(delta("a", 0.1))
	if p.buffer.Len() != 4 || p.buffer.Voters() != 2 || p.flushes != 0 {
		t.Fatalf("buffer holds %d deltas from %d voters, %d flushes", p.buffer.Len(), p.buffer.Voters(), p.flushes)
	}
	p.merge(delta("b", 0.1))
	if p.flushes != 1 || p.buffer.Len() != 0 {
		t.Fatalf("after the quorum: %d flushes, buffer %d", p.flushes, p.buffer.Len())
	}
	for i, v := range p.server {
		if d := v - before[i]; d <= 0 || d > 0.1*float32(cfg.ServerLR)+1e-6 {
			t.Fatalf("server[%d] moved by %v; the honest votes say 0.1·η", i, d)
		}
	}
}

// TestRobustFedBuffCodecs: a robust FedBuff sends models, so its codec
// must be dense and without error feedback; an entropy stage on top is
// fine. (A check on the spec's text, looking for ",ef", let "fp16:ef"
// through.)
func TestRobustFedBuffCodecs(t *testing.T) {
	for spec, ok := range map[string]bool{
		"fp32": true, "fp16": true, "bf16": true, "int8:block=256": true, "fp16:entropy=zstd": true,
		"fp16:ef": false, "int8:block=256,ef": false, "topk:0.01": false, "topk:0.01,ef": false, "sign": false, "powersgd:4": false,
	} {
		cfg := DefaultAsyncConfig()
		cfg.Mode, cfg.Codec = ModeFedBuff, compression.MustSpec(spec)
		if err := cfg.Validate(); (err == nil) != ok {
			t.Errorf("%s: %v, want ok %v", spec, err, ok)
		}
		cfg.BufferRule = rule.Mean{} // deltas: any codec
		if err := cfg.Validate(); err != nil {
			t.Errorf("%s with the mean: %v", spec, err)
		}
	}
}

func mustPolicy(t testing.TB, s string) staleness.Policy {
	t.Helper()
	p, err := staleness.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
