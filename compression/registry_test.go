package compression

import (
	"errors"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, c := range []struct{ spec, name string }{
		{"fp32", "fp32"},
		{"none", "fp32"},
		{" FP16 ", "fp16"},
		{"bf16", "bf16"},
		{"int8", "int8:block=256"},
		{"int8:block=64", "int8:block=64"},
		{"int8:512", "int8:block=512"},
		{"topk", "topk:0.01,entropy=zstd"},
		{"topk:0.001", "topk:0.001,entropy=zstd"},
		{"topk:frac=1%", "topk:0.01,entropy=zstd"},
		{"topk:0.01,ef", "topk:0.01,ef,entropy=zstd"},
		{"topk:0.01,entropy=none", "topk:0.01,entropy=none"},
		{"topk:0.01,ef,entropy=none", "topk:0.01,ef,entropy=none"},
		{"topk:0.01,ef=false,entropy=s2", "topk:0.01,entropy=s2"},
		{"randk:0.05,seed=7", "randk:0.05,seed=7"},
		{"sign", "sign:block=1024"},
		{"sign:block=all,ef", "sign:block=all,ef"},
		{"sign:ef", "sign:block=1024,ef"},
		{"fp16:ef", "fp16:ef"},
		{"powersgd:rank=4", "powersgd:rank=4,seed=0"},
		{"powersgd:2,ef", "powersgd:rank=2,seed=0,ef"},
		{"int8:entropy=zstd", "int8:block=256,entropy=zstd"},
	} {
		codec, err := Parse(c.spec)
		if err != nil {
			t.Errorf("Parse(%q): %v", c.spec, err)
			continue
		}
		if got := codec.Name(); got != c.name {
			t.Errorf("Parse(%q).Name() = %q, want %q", c.spec, got, c.name)
		}
		again, err := Parse(codec.Name())
		if err != nil || again.Name() != codec.Name() {
			t.Errorf("Parse(Name()) of %q: %v, %v", c.spec, again, err)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for _, c := range []struct{ spec, msg string }{
		{"", "empty"},
		{"gzip", "unknown codec"},
		{"topk:0", "frac"},
		{"topk:1.5", "frac"},
		{"topk:-0.1", "frac"},
		{"topk:abc", "frac"},
		{"topk:NaN", "frac"},
		{"int8:block=0", "block"},
		{"int8:block=x", "block"},
		{"int8:block=99999999999", "block"},
		{"int8:rank=3", `unknown parameter "rank"`},
		{"fp16:0.5", "name the parameters"},
		{"fp16:block=4", `unknown parameter "block"`},
		{"fp32:ef", "lossy"},
		{"topk:0.01,0.02", "key=value"},
		{"topk:frac=0.1,frac=0.2", "twice"},
		{"topk:0.01,,ef", "empty"},
		{"topk:0.01,entropy=lz4", "entropy"},
		{"topk:0.01,ef=maybe", "ef"},
		{"powersgd:rank=0", "rank"},
		{"randk:seed=-1", "seed"},
	} {
		_, err := Parse(c.spec)
		if !errors.Is(err, ErrBadSpec) || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("Parse(%q) = %v, want ErrBadSpec mentioning %q", c.spec, err, c.msg)
		}
	}
}

// A receiver knowing only the id decodes every encoding of that id, whatever
// parameters the sender used.
func TestNewDecodesAnyParameters(t *testing.T) {
	x := gradLike(3000, 3)
	for _, spec := range []string{
		"fp32", "fp16", "bf16", "int8:block=7", "int8:block=4096", "topk:0.3", "topk:0.001,entropy=zstd",
		"randk:0.2,seed=5", "sign:block=3", "sign:block=all", "powersgd:rank=3,seed=4",
		"fp16:entropy=s2", "int8:entropy=zstd", "sign:ef,entropy=zstd",
	} {
		enc, err := Parse(spec)
		if err != nil {
			t.Fatal(err)
		}
		b := enc.Encode(nil, x)
		id, err := PeekID(b)
		if err != nil || id != enc.ID() {
			t.Fatalf("%s: PeekID = %d, %v; ID() = %d", spec, id, err, enc.ID())
		}
		dec, err := New(id, "")
		if err != nil {
			t.Fatalf("%s: New(%d): %v", spec, id, err)
		}
		want := make([]float32, len(x))
		got := make([]float32, len(x))
		mustDecode(t, enc, want, b)
		mustDecode(t, dec, got, b)
		var d Decoder
		viaDecoder := make([]float32, len(x))
		if err := d.Decode(viaDecoder, b); err != nil {
			t.Fatalf("%s: Decoder: %v", spec, err)
		}
		for i := range want {
			if got[i] != want[i] || viaDecoder[i] != want[i] {
				t.Fatalf("%s: value %d: New decoder %g, Decoder %g, encoder's own %g", spec, i, got[i], viaDecoder[i], want[i])
			}
		}
	}
	if _, err := New(ID(len(descs)), ""); !errors.Is(err, ErrUnknownCodec) {
		t.Fatalf("New(%d): %v", len(descs), err)
	}
	if _, err := New(IDTopK, "entropy=s2"); !errors.Is(err, ErrBadSpec) {
		t.Fatalf("New with entropy param: %v", err)
	}
	if c, err := New(IDInt8, "block=64"); err != nil || c.Name() != "int8:block=64" {
		t.Fatalf("New(IDInt8, block=64) = %v, %v", c, err)
	}
}

// TestSpec: a Spec is parsed once and makes fresh codecs of the same
// name; it round-trips through text (flags, JSON), and "" is the zero
// Spec, which names no codec.
func TestSpec(t *testing.T) {
	for _, s := range []string{"fp16", "topk:0.01,ef", "int8:block=64,entropy=zstd", "powersgd:2,ef", "none"} {
		sp, err := ParseSpec(s)
		if err != nil {
			t.Fatal(err)
		}
		a, b := sp.New(), sp.New()
		want, _ := Parse(s)
		if a.Name() != want.Name() || b.Name() != want.Name() {
			t.Errorf("%q: New gives %q and %q, Parse %q", s, a.Name(), b.Name(), want.Name())
		}
		if _, ok := a.(*ErrorFeedback); ok && a == b {
			t.Errorf("%q: New returned the same stateful codec twice", s)
		}
		var back Spec
		if txt, _ := sp.MarshalText(); back.UnmarshalText(txt) != nil || back.String() != s || back.New().Name() != want.Name() {
			t.Errorf("%q: text round trip gives %q", s, back.String())
		}
	}
	if sp, err := ParseSpec(" "); err != nil || !sp.IsZero() || sp.New() != nil {
		t.Errorf("blank spec: %+v, %v", sp, err)
	}
	var sp Spec
	if err := sp.UnmarshalText([]byte("gzip")); !errors.Is(err, ErrBadSpec) || !sp.IsZero() {
		t.Errorf("bad spec: %v, %+v", err, sp)
	}
}
