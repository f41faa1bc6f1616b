package nn

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// CharLMConfig sizes a decoder-only transformer language model over a
// small vocabulary (characters).
type CharLMConfig struct {
	// Vocab is the number of distinct tokens; 65 covers the characters of
	// tiny Shakespeare.
	Vocab int
	// Context is T, the positions per sample: 128 sees a few lines of text
	// and keeps the T×T attention a small share of the step.
	Context int
	// Dim is the embedding width: 128 with 4 layers gives about 0.8 M
	// parameters, which train in minutes on two cores.
	Dim int
	// Heads is the number of attention heads (must divide Dim); 4 gives
	// heads of 32 values.
	Heads int
	// Layers is the number of transformer blocks.
	Layers int
	// MLPRatio is the MLP's hidden width in multiples of Dim (4, as in
	// GPT-2).
	MLPRatio int
	// Dropout is the probability of the embedding and residual dropouts
	// (0: none; a model this small underfits in minutes of training).
	Dropout float32
}

// DefaultCharLMConfig returns a character model of about 0.83 M (826,368)
// parameters: 4 blocks of width 128 with 4 heads over 128 positions and
// tiny Shakespeare's 65 characters.
func DefaultCharLMConfig() CharLMConfig {
	return CharLMConfig{Vocab: 65, Context: 128, Dim: 128, Heads: 4, Layers: 4, MLPRatio: 4}
}

// Validate reports a config that cannot build a model.
func (c CharLMConfig) Validate() error {
	switch {
	case c.Vocab <= 0 || c.Vocab > maxExactID:
		return fmt.Errorf("%w: charlm: vocab %d outside [1, 2^24]", ErrArch, c.Vocab)
	case c.Context <= 0 || c.Dim <= 0 || c.Layers <= 0 || c.MLPRatio <= 0:
		return fmt.Errorf("%w: charlm: context %d, dim %d, layers %d and MLP ratio %d must be positive", ErrArch, c.Context, c.Dim, c.Layers, c.MLPRatio)
	case c.Heads <= 0 || c.Dim%c.Heads != 0:
		return fmt.Errorf("%w: charlm: %d heads do not divide dim %d", ErrArch, c.Heads, c.Dim)
	case !(c.Dropout >= 0 && c.Dropout < 1):
		return fmt.Errorf("%w: charlm: dropout %v outside [0, 1)", ErrArch, c.Dropout)
	}
	return nil
}

// String is the model's architecture string, as Model.Arch records it.
func (c CharLMConfig) String() string {
	return fmt.Sprintf("charlm:v%d-t%d-d%d-h%d-l%d-r%d-p%s", c.Vocab, c.Context, c.Dim, c.Heads, c.Layers, c.MLPRatio,
		strconv.FormatFloat(float64(c.Dropout), 'g', -1, 32))
}

// NewCharLM returns a decoder-only transformer (GPT-2's pre-LayerNorm
// block) for next-token prediction: per sample, Context token ids in, a
// [Context, Vocab] block of logits out, scored by NextTokenCrossEntropy.
//
//	x = wte(ids) + wpe(positions); x = drop(x)
//	per block: x = x + drop(attn(ln_1(x))); x = x + drop(mlp(ln_2(x)))
//	           (mlp = c_proj(GELU(c_fc(x))), GELU in its tanh form)
//	logits = lm_head(ln_f(x))   (lm_head has no bias)
//
// Parameter names and layouts are those of minGPT's GPT (no weight tying),
// written out in testdata/chargpt.py: "transformer.wte.weight",
// "transformer.h.0.attn.c_attn.weight", …, "lm_head.weight". The weights
// are initialised as minGPT does: N(0, 0.02) for Linear and embedding
// weights, N(0, 0.02/√(2·Layers)) for the c_proj weights, zero biases,
// LayerNorms at (1, 0).
func NewCharLM(cfg CharLMConfig, seed uint64, opts ...Option) (*Model, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	d, t := cfg.Dim, cfg.Context
	drop := func(name string, body []Child) []Child {
		if cfg.Dropout > 0 {
			body = append(body, Child{name, &Dropout{P: cfg.Dropout}})
		}
		return body
	}
	blocks := make([]Layer, cfg.Layers)
	for i := range blocks {
		attn := NewNamedSequential(drop("resid_dropout", []Child{
			{"ln_1", &LayerNorm{Dim: d}},
			{"attn", &CausalSelfAttention{Dim: d, Heads: cfg.Heads}},
		})...)
		mlp := NewNamedSequential(drop("dropout", []Child{
			{"c_fc", &Dense{In: d, Out: cfg.MLPRatio * d}},
			{"act", &GELU{}},
			{"c_proj", &Dense{In: cfg.MLPRatio * d, Out: d}},
		})...)
		blocks[i] = NewNamedSequential(
			Child{"", NewResidual(attn)},
			Child{"", NewResidual(NewNamedSequential(Child{"ln_2", &LayerNorm{Dim: d}}, Child{"mlp", mlp}))},
		)
	}
	transformer := NewNamedSequential(append(drop("drop", []Child{
		{"wte", &Embedding{Num: cfg.Vocab, Dim: d}},
		{"wpe", &PositionEmbedding{T: t, Dim: d}},
	}), Child{"h", NewSequential(blocks...)}, Child{"ln_f", &LayerNorm{Dim: d}})...)
	root := NewNamedSequential(
		Child{"transformer", transformer},
		Child{"lm_head", &Dense{In: d, Out: cfg.Vocab, NoBias: true}},
	)
	projStd := float32(0.02 / math.Sqrt(2*float64(cfg.Layers)))
	init := func(name string, p ParamSpec) Initializer {
		switch {
		case strings.Contains(name, ".ln_"):
			return nil // LayerNorm: (1, 0)
		case strings.HasSuffix(name, "c_proj.weight"):
			return InitNormal(projStd)
		case strings.HasSuffix(name, ".bias"):
			return InitConst(0)
		}
		return InitNormal(0.02)
	}
	all := append([]Option{WithArch(cfg.String()), WithInit(init)}, opts...)
	return NewModel(root, Shape{t}, NextTokenCrossEntropy{}, seed, all...)
}
