package compression

import (
	"fmt"
	"math"
	"strconv"
	"strings"
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
func Parse(spec string) (Codec, error) {
	name, params, _ := strings.Cut(strings.TrimSpace(spec), ":")
	name = strings.ToLower(strings.TrimSpace(name))
	if name == "none" {
		name = "fp32"
	}
	id, ok := idByName(name)
	if !ok {
		return nil, fmt.Errorf("%w: %q: unknown codec %q (have %s)", ErrBadSpec, spec, name, strings.Join(Names(), ", "))
	}
	c, err := build(id, params)
	if err != nil {
		return nil, fmt.Errorf("%w: %q: %v", ErrBadSpec, spec, err)
	}
	return c, nil
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
	c, err := build(base, params)
	if err != nil {
		return nil, fmt.Errorf("%w: %s:%s: %v", ErrBadSpec, Names()[base], params, err)
	}
	return c, nil
}

func idByName(name string) (ID, bool) {
	for i, n := range Names() {
		if n == name {
			return ID(i), true
		}
	}
	return 0, false
}

// build makes the codec id from the parameter list.
func build(id ID, params string) (Codec, error) {
	var (
		ef      bool
		entropy = "auto"
		kv      = map[string]string{}
	)
	if params != "" {
		for i, p := range strings.Split(params, ",") {
			p = strings.TrimSpace(p)
			k, v, hasEq := strings.Cut(p, "=")
			k = strings.ToLower(strings.TrimSpace(k))
			v = strings.TrimSpace(v)
			switch {
			case p == "":
				return nil, fmt.Errorf("empty parameter")
			case !hasEq && k == "ef":
				ef = true
				continue
			case !hasEq && i == 0:
				k, v = mainParam(id), p
				if k == "" {
					return nil, fmt.Errorf("%s takes no positional parameter (got %q)", Names()[id], p)
				}
			case !hasEq:
				return nil, fmt.Errorf("parameter %q needs key=value", p)
			}
			if _, dup := kv[k]; dup {
				return nil, fmt.Errorf("parameter %q given twice", k)
			}
			switch k {
			case "ef":
				b, err := strconv.ParseBool(v)
				if err != nil {
					return nil, fmt.Errorf("ef=%q: want true or false", v)
				}
				ef = b
			case "entropy":
				entropy = strings.ToLower(v)
			default:
				kv[k] = v
			}
		}
	}
	c, err := buildBase(id, kv)
	if err != nil {
		return nil, err
	}
	if ef {
		if id == IDFP32 {
			return nil, fmt.Errorf("ef needs a lossy codec; fp32 is exact")
		}
		c = NewErrorFeedback(c)
	}
	var mode EntropyMode
	switch entropy {
	case "auto":
		mode = autoEntropy[id]
	case "none":
	case "s2":
		mode = EntropyS2
	case "zstd":
		mode = EntropyZstd
	default:
		return nil, fmt.Errorf("entropy=%q: want auto, none, s2 or zstd", entropy)
	}
	if mode != EntropyStored {
		return NewEntropy(c, mode)
	}
	return c, nil
}

func mainParam(id ID) string {
	switch id {
	case IDInt8, IDSign:
		return "block"
	case IDTopK, IDRandK:
		return "frac"
	case IDPowerSGD:
		return "rank"
	}
	return ""
}

func buildBase(id ID, kv map[string]string) (Codec, error) {
	allowed := map[ID][]string{
		IDInt8:     {"block"},
		IDTopK:     {"frac"},
		IDRandK:    {"frac", "seed"},
		IDSign:     {"block"},
		IDPowerSGD: {"rank", "seed"},
	}[id]
	for k := range kv {
		ok := false
		for _, a := range allowed {
			ok = ok || a == k
		}
		if !ok {
			if len(allowed) == 0 {
				return nil, fmt.Errorf("%s takes no parameter %q", Names()[id], k)
			}
			return nil, fmt.Errorf("%s has no parameter %q (has %s)", Names()[id], k, strings.Join(allowed, ", "))
		}
	}
	var err error
	intParam := func(k string, def, lo, hi int) int {
		v, ok := kv[k]
		if !ok || err != nil {
			return def
		}
		x, e := strconv.Atoi(v)
		if e != nil || x < lo || x > hi {
			err = fmt.Errorf("%s=%q: want an integer in [%d, %d]", k, v, lo, hi)
		}
		return x
	}
	fracParam := func() float64 {
		v, ok := kv["frac"]
		if !ok {
			return DefaultFrac
		}
		x, e := strconv.ParseFloat(strings.TrimSuffix(v, "%"), 64)
		if e == nil && strings.HasSuffix(v, "%") {
			x /= 100
		}
		if e != nil || !(x > 0 && x <= 1) || math.IsNaN(x) {
			err = fmt.Errorf("frac=%q: want a fraction in (0, 1], like 0.01 or 1%%", v)
		}
		return x
	}
	seedParam := func() uint64 {
		v, ok := kv["seed"]
		if !ok {
			return 0
		}
		x, e := strconv.ParseUint(v, 10, 64)
		if e != nil {
			err = fmt.Errorf("seed=%q: want an unsigned integer", v)
		}
		return x
	}
	var c Codec
	switch id {
	case IDFP32:
		c = FP32{}
	case IDFP16:
		c = FP16{}
	case IDBF16:
		c = BF16{}
	case IDInt8:
		c = Int8{Block: intParam("block", DefaultInt8Block, 1, maxBlock)}
	case IDTopK:
		c = &TopK{Frac: fracParam()}
	case IDRandK:
		c = &RandK{Frac: fracParam(), Seed: seedParam()}
	case IDSign:
		block := DefaultSignBlock
		if v := kv["block"]; strings.EqualFold(v, "all") {
			block = -1
		} else {
			block = intParam("block", DefaultSignBlock, 1, maxBlock)
		}
		c = Sign{Block: block}
	case IDPowerSGD:
		c = &PowerSGD{Rank: intParam("rank", DefaultRank, 1, 1024), Seed: seedParam()}
	default:
		return nil, fmt.Errorf("%w: %d", ErrUnknownCodec, id)
	}
	return c, err
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
