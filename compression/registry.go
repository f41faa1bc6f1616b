package compression

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/starling-ml/starling/internal/spec"
)

// Desc describes one codec. The table of descriptors (Descs) is the only
// place a codec is listed: Parse, New, Names, Known, MaxEncodedLen, Dense,
// IsSparse, HopCodec and the decoders by id all derive from it, so a new
// codec is one entry here (and TestDescs checks the entry against the
// codec's behaviour).
type Desc struct {
	// ID is the wire id; once assigned it never changes meaning.
	ID ID
	// Name is the spec name ("topk"); Aliases are other names Parse takes.
	Name    string
	Aliases []string
	// Doc says in a few words what the codec sends.
	Doc string
	// Params are the codec's spec parameters, the main one (if any) first.
	Params []Param
	// Dense: every value travels, each to within a bound set by its own
	// magnitude or its block's (fp32, fp16, bf16, int8), so a decoded
	// vector is a faithful copy that can carry a whole model. The others
	// send an approximation meant for error feedback.
	Dense bool
	// Lossy: decoding does not give back the input bit for bit. Only a
	// lossy codec takes the flag "ef".
	Lossy bool
	// Sparse: encodings are in the sparse layout (top-k, random-k) that
	// MergeSparse sums exactly without densifying.
	Sparse bool
	// Hop is the codec a reducing hop of an all-reduce re-encodes a
	// partial sum with (HopCodec): the leaf codec itself, parameters and
	// all, when Hop == ID (stateless codecs only), else Hop's defaults.
	Hop ID
	// Entropy is the stage "entropy=auto" adds: EntropyZstd where it pays
	// (docs/design.md, "compression"), else EntropyStored, meaning none.
	Entropy EntropyMode
	// MaxEncodedLen returns the longest encoding of n values the codec's
	// decoder accepts, whatever the encoder's parameters, without the
	// entropy stage's framing.
	MaxEncodedLen func(n int) int

	build func(v values) Codec
}

// Param is one parameter of a codec spec.
type Param struct {
	// Key is its name in a spec ("frac", "block", "rank", "seed").
	Key string
	// Main marks the codec's main parameter, which a spec may give as its
	// first value without the key ("topk:0.01").
	Main bool
	Kind ParamKind
	// Default is its value when a spec leaves it out.
	Default float64
	// Min and Max bound an IntParam to [Min, Max] and a FracParam to
	// (Min, Max].
	Min, Max float64
	// All, when not 0, is the value the word "all" stands for (IntParam).
	All int
}

// ParamKind is the type of a codec parameter.
type ParamKind uint8

// Parameter kinds.
const (
	IntParam  ParamKind = iota // an integer in [Min, Max]
	FracParam                  // a number in (Min, Max], or a percentage ("1%")
	UintParam                  // any unsigned 64-bit integer
)

// maxHeader bounds the common header and one more uvarint field.
func maxHeader(n int) int { return headerLen(n) + maxUvarintLen64 }

var (
	fracParam = Param{Key: "frac", Main: true, Kind: FracParam, Default: DefaultFrac, Min: 0, Max: 1}
	seedParam = Param{Key: "seed", Kind: UintParam}
	// fourBitParam is FP4's and Int4's block size.
	fourBitParam = Param{Key: "block", Main: true, Kind: IntParam, Default: DefaultFourBitBlock, Min: 1, Max: maxBlock}
)

// descs is the codec table, indexed by id.
var descs = [...]Desc{
	IDFP32: {
		ID: IDFP32, Name: "fp32", Aliases: []string{"none"}, Doc: "raw little-endian float32 (no compression)",
		Dense: true, Hop: IDFP32,
		MaxEncodedLen: func(n int) int { return maxHeader(n) + 4*n },
		build:         func(values) Codec { return FP32{} },
	},
	IDFP16: {
		ID: IDFP16, Name: "fp16", Doc: "IEEE 754 half precision, saturating at ±65504",
		Dense: true, Lossy: true, Hop: IDFP16,
		MaxEncodedLen: func(n int) int { return maxHeader(n) + 2*n },
		build:         func(values) Codec { return FP16{} },
	},
	IDBF16: {
		ID: IDBF16, Name: "bf16", Doc: "bfloat16, round to nearest even",
		Dense: true, Lossy: true, Hop: IDBF16,
		MaxEncodedLen: func(n int) int { return maxHeader(n) + 2*n },
		build:         func(values) Codec { return BF16{} },
	},
	IDInt8: {
		ID: IDInt8, Name: "int8", Doc: "int8 blockwise with a per-block absmax scale",
		Params: []Param{{Key: "block", Main: true, Kind: IntParam, Default: DefaultInt8Block, Min: 1, Max: maxBlock}},
		Dense:  true, Lossy: true, Hop: IDInt8,
		// Block 1: one scale per value.
		MaxEncodedLen: func(n int) int { return maxHeader(n) + 4*n + n },
		build:         func(v values) Codec { return Int8{Block: v.get("block").i} },
	},
	IDTopK: {
		ID: IDTopK, Name: "topk", Doc: "the k = round(frac·n) largest magnitudes, delta-coded indices",
		Params: []Param{fracParam},
		Lossy:  true, Sparse: true, Hop: IDFP32, Entropy: EntropyZstd,
		MaxEncodedLen: func(n int) int { return maxHeader(n) + 4*n + n*uvarintLen(uint64(n)) },
		build:         func(v values) Codec { return &TopK{Frac: v.get("frac").f} },
	},
	IDRandK: {
		ID: IDRandK, Name: "randk", Doc: "k stratified random values, sent with their seed",
		Params: []Param{fracParam, seedParam},
		Lossy:  true, Sparse: true, Hop: IDFP32,
		MaxEncodedLen: func(n int) int { return maxHeader(n) + 8 + 4*n },
		build:         func(v values) Codec { return &RandK{Frac: v.get("frac").f, Seed: v.get("seed").u} },
	},
	IDSign: {
		ID: IDSign, Name: "sign", Doc: "1 bit per value and the mean |x| per block (EF-SignSGD)",
		Params: []Param{{Key: "block", Main: true, Kind: IntParam, Default: DefaultSignBlock, Min: 1, Max: maxBlock, All: -1}},
		Lossy:  true, Hop: IDInt8, // a sum of signs is no sign
		MaxEncodedLen: func(n int) int { return maxHeader(n) + 4*n + (n+7)/8 },
		build:         func(v values) Codec { return Sign{Block: v.get("block").i} },
	},
	IDPowerSGD: {
		ID: IDPowerSGD, Name: "powersgd", Doc: "rank-r P/Q factors of each matrix (SetLayout for the shapes)",
		Params: []Param{{Key: "rank", Main: true, Kind: IntParam, Default: DefaultRank, Min: 1, Max: 1024}, seedParam},
		Lossy:  true, Hop: IDFP32,
		MaxEncodedLen: func(n int) int { return maxHeader(n) + min(n, maxTensors)*3*maxUvarintLen64 + 4*n },
		build:         func(v values) Codec { return &PowerSGD{Rank: v.get("rank").i, Seed: v.get("seed").u} },
	},
	// The 4-bit codecs sum in their own format at a reducing hop (a 4-bit
	// all-reduce, as Streaming DiLoCo's): each hop adds at most its
	// block's half step of error (reduce_test's hopBound).
	IDFP4: {
		ID: IDFP4, Name: "fp4", Doc: "4-bit floats E2M1 with a per-block absmax scale",
		Params: []Param{fourBitParam},
		Lossy:  true, Hop: IDFP4,
		MaxEncodedLen: func(n int) int { return maxHeader(n) + 4*n + (n+1)/2 },
		build:         func(v values) Codec { return FP4{Block: v.get("block").i} },
	},
	IDInt4: {
		ID: IDInt4, Name: "int4", Doc: "int4 blockwise (−7…7) with a per-block absmax scale",
		Params: []Param{fourBitParam},
		Lossy:  true, Hop: IDInt4,
		MaxEncodedLen: func(n int) int { return maxHeader(n) + 4*n + (n+1)/2 },
		build:         func(v values) Codec { return Int4{Block: v.get("block").i} },
	},
	// Lossless, so Dense; its encodings merge at a hop as top-k's do.
	IDSparse: {
		ID: IDSparse, Name: "sparse", Doc: "every nonzero value, delta-coded indices (lossless; for vectors sparse already)",
		Dense: true, Sparse: true, Hop: IDFP32, Entropy: EntropyZstd,
		MaxEncodedLen: func(n int) int { return maxHeader(n) + 4*n + n*uvarintLen(uint64(n)) },
		build:         func(values) Codec { return Sparse{} },
	},
}

// decoders holds a codec of every id with its default parameters, for
// decoding by the id in the bytes (no decoder depends on its parameters)
// and for HopCodec.
var decoders = func() (ds [len(descs)]Codec) {
	for i, d := range descs {
		if d.build != nil {
			ds[i] = d.build(defaults(d.Params))
		}
	}
	return ds
}()

// Describe returns the descriptor of codec id (IDEntropy may be set), and
// false for an id no codec of this build has.
func Describe(id ID) (Desc, bool) {
	if d := desc(id); d != nil {
		return *d, true
	}
	return Desc{}, false
}

// desc returns the table's entry for id (IDEntropy may be set), or nil.
func desc(id ID) *Desc {
	id &^= IDEntropy
	if int(id) >= len(descs) || descs[id].build == nil {
		return nil
	}
	return &descs[id]
}

// Descs returns the descriptors of every codec, in wire-id order. The
// slice is the caller's.
func Descs() []Desc {
	var out []Desc
	for _, d := range descs {
		if d.build != nil {
			out = append(out, d)
		}
	}
	return out
}

// Names lists the codec names Parse accepts, in wire-id order (aliases
// aside).
func Names() []string {
	var out []string
	for _, d := range Descs() {
		out = append(out, d.Name)
	}
	return out
}

// MaxEncodedLen returns the largest encoding of a vector of n values that a
// decoder of id (IDEntropy may be set) accepts, whatever the encoder's
// parameters, or 0 for an unknown id. node/ can use it to bound a frame
// before reading it; the entropy stage uses it to bound decompression.
func MaxEncodedLen(id ID, n int) int {
	d := desc(id)
	if d == nil {
		return 0
	}
	m := d.MaxEncodedLen(n)
	if id&IDEntropy != 0 {
		m += 2
	}
	return m
}

// MaxEncodedLenAny returns the largest encoding of n values that any
// codec's decoder accepts: what a receiver that does not yet know the
// codec may have to take.
func MaxEncodedLenAny(n int) int {
	m := 0
	for id := range ID(len(descs)) {
		m = max(m, MaxEncodedLen(id|IDEntropy, n))
	}
	return m
}

// Dense reports whether c's codec sends every value faithfully (see
// Desc.Dense), whatever error feedback or entropy stage wraps it.
func Dense(c Codec) bool {
	d := desc(c.ID())
	return d != nil && d.Dense
}

// A codec spec names a codec and its parameters, as the --compress flag
// takes it:
//
//	spec   = name [ ":" param { "," param } ]
//	param  = value | key "=" value | flag
//
// A bare value is allowed only as the first parameter and sets the codec's
// main parameter (marked * below). Every codec also takes the flag "ef"
// (wrap in ErrorFeedback; lossy codecs only) and "entropy=" one of auto
// (the default: Desc.Entropy), none, s2 or zstd.
//
//	fp32 (alias none)                   raw float32
//	fp16                                IEEE half, saturating at ±65504
//	bf16                                bfloat16, round to nearest even
//	int8      block*=256                blockwise absmax int8
//	topk      frac*=0.01                k = round(frac·n) largest magnitudes
//	randk     frac*=0.01, seed=0        k stratified random values
//	sign      block*=1024 | all         1 bit per value, mean |x| per block
//	powersgd  rank*=4, seed=0           rank-r PowerSGD (SetLayout for shapes)
//	fp4       block*=64                 4-bit floats E2M1, absmax/6 per block
//	int4      block*=64                 4-bit integers −7…7, absmax/7 per block
//	sparse                              every nonzero value (lossless)
//
// Examples: "topk:0.01,ef", "int8:block=256", "sign:ef", "powersgd:rank=2,ef".

// Parse returns a new codec for spec. The codec is fresh: stateful codecs
// start with zero state.
func Parse(s string) (Codec, error) {
	sp, err := ParseSpec(s)
	if err != nil {
		return nil, err
	}
	if sp.IsZero() {
		return nil, fmt.Errorf("%w: empty spec (have %s)", ErrBadSpec, strings.Join(Names(), ", "))
	}
	return sp.New(), nil
}

// Spec is a codec spec parsed and checked once (ParseSpec, or a flag or a
// JSON field through UnmarshalText): New makes fresh codecs from it
// without reading text again. The zero Spec names no codec: vectors travel
// as raw float32 outside any codec.
type Spec struct {
	d       *Desc
	v       values
	ef      bool
	entropy EntropyMode
	text    string
}

// ParseSpec parses s; "" gives the zero Spec.
func ParseSpec(s string) (Spec, error) {
	if strings.TrimSpace(s) == "" {
		return Spec{}, nil
	}
	t, err := spec.One(s)
	if err != nil {
		return Spec{}, fmt.Errorf("%w: %w (have %s)", ErrBadSpec, err, strings.Join(Names(), ", "))
	}
	for i := range descs {
		d := &descs[i]
		if d.build != nil && (t.Name == d.Name || contains(d.Aliases, t.Name)) {
			return parseTerm(d, t, s)
		}
	}
	return Spec{}, fmt.Errorf("%w: %w", ErrBadSpec, t.Errorf("unknown codec %q (have %s)", t.Name, strings.Join(Names(), ", ")))
}

// MustSpec is ParseSpec for specs known to be good (tests, literals); it
// panics on a bad one.
func MustSpec(s string) Spec {
	sp, err := ParseSpec(s)
	if err != nil {
		panic(err)
	}
	return sp
}

// IsZero reports whether s names no codec.
func (s Spec) IsZero() bool { return s.d == nil }

// Desc returns the descriptor of s's codec (the zero Desc for the zero
// Spec).
func (s Spec) Desc() Desc {
	if s.d == nil {
		return Desc{}
	}
	return *s.d
}

// ErrorFeedback reports whether s wraps its codec in error feedback.
func (s Spec) ErrorFeedback() bool { return s.ef }

// New returns a fresh codec for s (nil for the zero Spec).
func (s Spec) New() Codec {
	if s.d == nil {
		return nil
	}
	c := s.d.build(s.v)
	if s.ef {
		c = NewErrorFeedback(c)
	}
	if s.entropy != EntropyStored {
		e, err := NewEntropy(c, s.entropy)
		if err != nil {
			panic(err) // every mode ParseSpec accepts has a stage
		}
		return e
	}
	return c
}

// String returns the spec as it was given ("" for the zero Spec).
func (s Spec) String() string { return s.text }

// MarshalText implements encoding.TextMarshaler.
func (s Spec) MarshalText() ([]byte, error) { return []byte(s.text), nil }

// UnmarshalText implements encoding.TextUnmarshaler: flag.TextVar and
// encoding/json parse a spec through it.
func (s *Spec) UnmarshalText(b []byte) error {
	sp, err := ParseSpec(string(b))
	if err != nil {
		return err
	}
	*s = sp
	return nil
}

// New returns a codec for the wire id (IDEntropy may be set) with params in
// Parse's syntax, "" for the defaults. Since every encoding carries its
// parameters, New(id, "") decodes every encoding of id: it is what a receiver
// that knows only the id from a frame header uses.
func New(id ID, params string) (Codec, error) {
	d, ok := Describe(id)
	if !ok {
		return nil, fmt.Errorf("%w: %d", ErrUnknownCodec, id)
	}
	// The id, not the params, says whether the bytes are entropy-wrapped;
	// the wrapper decodes every mode, so zstd stands for any of them.
	if strings.Contains(params, "entropy=") {
		return nil, fmt.Errorf("%w: New takes the entropy stage from the id, not from %q", ErrBadSpec, params)
	}
	entropy := "entropy=none"
	if id&IDEntropy != 0 {
		entropy = "entropy=zstd"
	}
	if params == "" {
		params = entropy
	} else {
		params += "," + entropy
	}
	t, err := spec.One(d.Name + ":" + params)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadSpec, err)
	}
	sp, err := parseTerm(desc(id), t, t.String())
	if err != nil {
		return nil, err
	}
	return sp.New(), nil
}

// parseTerm reads d's spec from t's arguments: the flag ef first, then
// the parameters in d.Params' order (only the main one may be given
// without its key), then the entropy stage. text is the spec as given.
func parseTerm(d *Desc, t spec.Term, text string) (Spec, error) {
	r := t.Reader()
	sp := Spec{d: d, ef: r.Flag("ef"), entropy: d.Entropy, text: strings.TrimSpace(text)}
	sp.v = readParams(r, d.Params)
	entropy := r.String("entropy", "auto", "auto", "none", "s2", "zstd")
	if err := r.Done(); err != nil {
		return Spec{}, fmt.Errorf("%w: %w", ErrBadSpec, err)
	}
	if sp.ef && !d.Lossy {
		return Spec{}, fmt.Errorf("%w: %w", ErrBadSpec, t.Errorf("ef needs a lossy codec; %s is exact", d.Name))
	}
	switch entropy {
	case "none":
		sp.entropy = EntropyStored
	case "s2":
		sp.entropy = EntropyS2
	case "zstd":
		sp.entropy = EntropyZstd
	}
	return sp, nil
}

// value is one parameter as read from a spec.
type value struct {
	key string
	i   int
	f   float64
	u   uint64
}

// values are a spec's parameters, for Desc.build.
type values []value

func (v values) get(key string) value {
	for _, x := range v {
		if x.key == key {
			return x
		}
	}
	panic("compression: codec reads undeclared parameter " + key) // a bug in the table
}

// defaults returns ps' default values.
func defaults(ps []Param) values { return readParams(nil, ps) }

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// readParams reads ps from r, in order, or takes their defaults when r is
// nil. Problems are recorded in r (see spec.Reader.Done).
func readParams(r *spec.Reader, ps []Param) values {
	v := make(values, len(ps))
	keyed := false
	for i, p := range ps {
		v[i] = value{key: p.Key, i: int(p.Default), f: p.Default, u: uint64(p.Default)}
		if r == nil {
			continue
		}
		if !p.Main && !keyed {
			r.Keyed()
			keyed = true
		}
		switch p.Kind {
		case IntParam:
			if p.All == 0 {
				v[i].i = r.Int(p.Key, v[i].i, int(p.Min), int(p.Max))
				break
			}
			switch s := r.String(p.Key, ""); s {
			case "":
			case "all":
				v[i].i = p.All
			default:
				n, err := strconv.Atoi(s)
				if err != nil || n < int(p.Min) || n > int(p.Max) {
					r.Failf("%s=%q: want all or an integer in [%d, %d]", p.Key, s, int(p.Min), int(p.Max))
				}
				v[i].i = n
			}
		case FracParam:
			v[i].f = r.Float(p.Key, p.Default, spec.In(p.Min, p.Max, false, true))
		case UintParam:
			v[i].u = r.Uint(p.Key, v[i].u)
		}
	}
	if r != nil && !keyed {
		r.Keyed()
	}
	return v
}

// specOf returns c's spec without the entropy stage.
func specOf(c Codec) string {
	if s, ok := c.(interface{ spec() string }); ok {
		return s.spec()
	}
	return c.Name()
}

// nameOf returns the name of a codec that is not entropy-wrapped: its spec,
// with "entropy=none" where Parse would otherwise add the stage, so that
// Parse(c.Name()) always rebuilds c.
func nameOf(c Codec) string {
	s := specOf(c)
	if d := desc(c.ID()); d != nil && d.Entropy != EntropyStored {
		s = addParam(s, "entropy=none")
	}
	return s
}

// addParam appends a parameter to a codec name: "fp16"+"ef" → "fp16:ef",
// "topk:0.01"+"ef" → "topk:0.01,ef".
func addParam(name, p string) string {
	if strings.Contains(name, ":") || name == "" {
		return name + "," + p
	}
	return name + ":" + p
}
