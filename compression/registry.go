package compression

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/starling-ml/starling/internal/spec"
)

// A codec spec names a codec and its parameters, as the --compress flag
// takes it:
//
//	spec   = name [ ":" param { "," param } ]
//	param  = value | key "=" value | flag
//
// A bare value is allowed only as the first parameter and sets the codec's
// main parameter (marked * below). Every codec also takes the flag "ef"
// (wrap in ErrorFeedback; not allowed for fp32) and "entropy=" one of auto
// (the default), none, s2 or zstd.
//
//	fp32 (alias none)                   raw float32
//	fp16                                IEEE half, saturating at ±65504
//	bf16                                bfloat16, round to nearest even
//	int8      block*=256                blockwise absmax int8
//	topk      frac*=0.01                k = round(frac·n) largest magnitudes
//	randk     frac*=0.01, seed=0        k stratified random values
//	sign      block*=1024 | all         1 bit per value, mean |x| per block
//	powersgd  rank*=4, seed=0           rank-r PowerSGD (SetLayout for shapes)
//
// Examples: "topk:0.01,ef", "int8:block=256", "sign:ef", "powersgd:rank=2,ef".

// Names lists the codec names Parse accepts, in wire-id order.
func Names() []string {
	return []string{"fp32", "fp16", "bf16", "int8", "topk", "randk", "sign", "powersgd"}
}

// autoEntropy is the entropy mode "entropy=auto" picks per codec. The rule:
// on where zstd saves at least 10 % and costs little next to the codec's own
// encode. BenchmarkEntropy on 1 M gradient-like values (zstd SpeedFastest
// with Huffman-coded literals; S2 saves nothing on any codec's bytes):
//
//	codec   zstd saving  zstd compress / decompress (of the codec's bytes)
//	topk    11 %         ~0.6 / ~1 GB/s, on 1–2 % of the vector's size: ~0.1 ms per 1 M values → on
//	bf16    14 %         ~0.65 / ~1.1 GB/s on half the vector's size: ~3 ms per 1 M values → off
//	int8    13 %         ~0.75 / ~1.2 GB/s: ~1.4 ms + 0.9 ms per 1 M values, 5× int8 itself → off
//	fp16    1 %, fp32, randk, sign, powersgd: 0 % (stored) → off
//
// For bf16 and int8 the stage pays only when the link is slower than about
// saving × (zstd rate) ≈ 60 MB/s (≈ 500 Mbit/s): add "entropy=zstd" there.
var autoEntropy = map[ID]EntropyMode{
	IDTopK: EntropyZstd,
}

// Parse returns a new codec for spec. The codec is fresh: stateful codecs
// start with zero state.
func Parse(s string) (Codec, error) {
	t, err := spec.One(s)
	if err != nil {
		return nil, fmt.Errorf("%w: %w (have %s)", ErrBadSpec, err, strings.Join(Names(), ", "))
	}
	name := t.Name
	if name == "none" {
		name = "fp32"
	}
	id, ok := idByName(name)
	if !ok {
		return nil, fmt.Errorf("%w: %w", ErrBadSpec, t.Errorf("unknown codec %q (have %s)", t.Name, strings.Join(Names(), ", ")))
	}
	return build(id, t)
}

// New returns a codec for the wire id (IDEntropy may be set) with params in
// Parse's syntax, "" for the defaults. Since every encoding carries its
// parameters, New(id, "") decodes every encoding of id: it is what a receiver
// that knows only the id from a frame header uses.
func New(id ID, params string) (Codec, error) {
	if !Known(id) {
		return nil, fmt.Errorf("%w: %d", ErrUnknownCodec, id)
	}
	base := id &^ IDEntropy
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
	t, err := spec.One(Names()[base] + ":" + params)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadSpec, err)
	}
	return build(base, t)
}

func idByName(name string) (ID, bool) {
	for i, n := range Names() {
		if n == name {
			return ID(i), true
		}
	}
	return 0, false
}

// build makes the codec id from t's arguments: the flag ef first, then
// the codec's main parameter (the only one that may be given without its
// key), then the others by key.
func build(id ID, t spec.Term) (Codec, error) {
	r := t.Reader()
	ef := r.Flag("ef")
	var c Codec
	switch id {
	case IDFP32:
		r.Keyed()
		c = FP32{}
	case IDFP16:
		r.Keyed()
		c = FP16{}
	case IDBF16:
		r.Keyed()
		c = BF16{}
	case IDInt8:
		block := r.Int("block", DefaultInt8Block, 1, maxBlock)
		r.Keyed()
		c = Int8{Block: block}
	case IDTopK:
		frac := r.Float("frac", DefaultFrac, spec.In(0, 1, false, true))
		r.Keyed()
		c = &TopK{Frac: frac}
	case IDRandK:
		frac := r.Float("frac", DefaultFrac, spec.In(0, 1, false, true))
		r.Keyed()
		c = &RandK{Frac: frac, Seed: r.Uint("seed", 0)}
	case IDSign:
		block := DefaultSignBlock
		switch v := r.String("block", ""); v {
		case "":
		case "all":
			block = -1
		default:
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > maxBlock {
				r.Failf("block=%q: want all or an integer in [1, %d]", v, maxBlock)
			}
			block = n
		}
		r.Keyed()
		c = Sign{Block: block}
	case IDPowerSGD:
		rank := r.Int("rank", DefaultRank, 1, 1024)
		r.Keyed()
		c = &PowerSGD{Rank: rank, Seed: r.Uint("seed", 0)}
	default:
		return nil, fmt.Errorf("%w: %d", ErrUnknownCodec, id)
	}
	entropy := r.String("entropy", "auto", "auto", "none", "s2", "zstd")
	if err := r.Done(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadSpec, err)
	}
	if ef {
		if id == IDFP32 {
			return nil, fmt.Errorf("%w: %w", ErrBadSpec, t.Errorf("ef needs a lossy codec; fp32 is exact"))
		}
		c = NewErrorFeedback(c)
	}
	var mode EntropyMode
	switch entropy {
	case "auto":
		mode = autoEntropy[id]
	case "s2":
		mode = EntropyS2
	case "zstd":
		mode = EntropyZstd
	}
	if mode != EntropyStored {
		return NewEntropy(c, mode)
	}
	return c, nil
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
	if autoEntropy[c.ID()&^IDEntropy] != EntropyStored {
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
