package workload

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/starling-ml/starling/data"
	"github.com/starling-ml/starling/internal/spec"
	"github.com/starling-ml/starling/nn"
)

// Errors of this package; data's and nn's errors come wrapped as they are.
var (
	// ErrModel reports a model spec that does not parse or cannot work.
	ErrModel = errors.New("workload: bad model")
	// ErrData reports data the model cannot train on.
	ErrData = errors.New("workload: unsuitable data")
	// ErrVocab reports weights trained on another vocabulary.
	ErrVocab = errors.New("workload: vocabulary mismatch")
)

// Config says which workload to load. The zero value of every field but
// Model is its default.
type Config struct {
	// Model is the model spec: "logreg", "mlp", "mlp:784-W-…-10", "2nn",
	// "cnn" or "charlm[:key=value,…]" (see the package doc).
	Model string
	// Data is the data source: a folder of IDX files for the image models
	// (default: MNIST from the Go module cache), a text file or folder for
	// charlm (default: the Go standard library's sources).
	Data string
	// Limit keeps the first Limit training samples (0: all).
	Limit int
	// Seed decides which documents of a corpus are held out for
	// validation; peers of one swarm must share it.
	Seed uint64
	// ValFraction is the share of a corpus's documents held out (0: 0.1).
	ValFraction float64
	// ValWindows is the size of a text workload's test set: that many
	// windows of the held-out text, spread evenly over it (0: 1024, about
	// 131 k tokens at T = 128, which one core evaluates in a few seconds).
	ValWindows int
}

// Defaults of Config's zero fields.
const (
	defaultValFraction = 0.1
	defaultValWindows  = 1024
)

// Validate reports settings that cannot work. It does not read data.
func (c Config) Validate() error {
	switch {
	case c.Limit < 0:
		return fmt.Errorf("%w: limit %d is negative", ErrData, c.Limit)
	case !(c.ValFraction >= 0 && c.ValFraction < 1):
		return fmt.Errorf("%w: validation fraction %v is not in [0, 1)", ErrData, c.ValFraction)
	case c.ValWindows < 0:
		return fmt.Errorf("%w: %d validation windows", ErrData, c.ValWindows)
	}
	_, err := parse(c.Model)
	return err
}

// Workload is a model family and the data it trains on. It is read-only
// after Load and safe for concurrent use.
type Workload struct {
	// Kind is the model family: "logreg", "mlp", "cnn" or "charlm".
	Kind string
	// Train is the whole training split (peers partition it); Test is the
	// test set, or for text the validation windows.
	Train, Test data.Dataset
	// Vocab is a text workload's vocabulary (nil for images).
	Vocab *data.Vocab
	// Source says what was read, for the user.
	Source string
	// Skipped lists the files of a corpus left out as binary.
	Skipped []string

	spec   model
	build  func(seed uint64, opts ...nn.Option) (*nn.Model, error)
	arch   string
	params int
	digest [32]byte
}

// Load parses cfg.Model, reads the data and checks that the model can
// train on it. Errors are one line and name the problem: they wrap
// ErrModel, ErrData, or data's errors (data.ErrNoDataset,
// data.ErrBinary, data.ErrEmptyCorpus, …).
func Load(cfg Config) (*Workload, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m, _ := parse(cfg.Model) // checked by Validate
	var (
		w   *Workload
		err error
	)
	if m.kind == "charlm" {
		w, err = loadText(cfg, m)
	} else {
		w, err = loadImages(cfg, m)
	}
	if err != nil {
		return nil, err
	}
	return w.finish(m)
}

// finish builds the model once to record its identity.
func (w *Workload) finish(m model) (*Workload, error) {
	w.Kind, w.spec = m.kind, m
	probe, err := w.build(0)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrModel, m.text, err)
	}
	w.arch, w.params, w.digest = probe.Arch, len(probe.Params), Digest(probe, w.Vocab)
	return w, nil
}

// NewModel builds the workload's model initialised from seed on the
// default backend. It is a train.ModelFunc; ModelFunc takes options.
func (w *Workload) NewModel(seed uint64) (*nn.Model, error) { return w.build(seed) }

// ModelFunc returns NewModel with opts applied to every model it builds.
func (w *Workload) ModelFunc(opts ...nn.Option) func(seed uint64) (*nn.Model, error) {
	return func(seed uint64) (*nn.Model, error) { return w.build(seed, opts...) }
}

// Arch returns the model's architecture string (nn.Model.Arch).
func (w *Workload) Arch() string { return w.arch }

// Params returns the model's number of parameters.
func (w *Workload) Params() int { return w.params }

// Text reports whether the workload is a language model on text: its
// targets are next tokens and its loss in bits is bits per character.
func (w *Workload) Text() bool { return w.Vocab != nil }

// Digest returns the architecture digest (see Digest).
func (w *Workload) Digest() [32]byte { return w.digest }

// ID returns the model id peers exchange (the gossip control plane's
// model, the all-reduce's settings): Kind, a dash and the first 8 bytes
// of Digest in hex, such as "charlm-3f9a0c1d2b4e5f60". Peers with other
// IDs do not average with this one.
func (w *Workload) ID() string { return ModelID(w.Kind, w.digest) }

// Digest returns the SHA-256 of a model's architecture: its Arch string,
// input shape, every parameter's name and shape in order and, when vocab
// is not nil, the vocabulary's digest. Two models with equal digests
// have parameter vectors of the same layout over the same tokens.
func Digest(m *nn.Model, vocab *data.Vocab) [32]byte {
	h := sha256.New()
	var b []byte
	str := func(s string) {
		b = binary.BigEndian.AppendUint32(b[:0], uint32(len(s)))
		h.Write(b)
		h.Write([]byte(s))
	}
	ints := func(xs []int) {
		b = binary.BigEndian.AppendUint32(b[:0], uint32(len(xs)))
		for _, x := range xs {
			b = binary.BigEndian.AppendUint64(b, uint64(x))
		}
		h.Write(b)
	}
	str("starling/arch/v1")
	str(m.Arch)
	ints(m.Input)
	for _, v := range m.Views() {
		str(v.Name)
		ints(v.Shape)
	}
	if vocab != nil {
		d := vocab.Digest()
		str("vocab")
		h.Write(d[:])
	}
	var out [32]byte
	h.Sum(out[:0])
	return out
}

// maxKindLen keeps a model id within the control plane's 64 bytes.
const maxKindLen = 40

// ModelID returns the model id of a kind and an architecture digest.
func ModelID(kind string, digest [32]byte) string {
	if len(kind) > maxKindLen {
		kind = kind[:maxKindLen]
	}
	return kind + "-" + hex.EncodeToString(digest[:8])
}

// Kind returns the model family a spec names ("mlp", "charlm", …) after
// checking the spec, without reading data.
func Kind(modelSpec string) (string, error) {
	m, err := parse(modelSpec)
	return m.kind, err
}

// model is a parsed model spec.
type model struct {
	kind   string
	widths []int // mlp: the widths given, nil for the default
	lm     nn.CharLMConfig
	level  data.Level
	text   string // the spec as given
}

// parse reads a model spec; errors wrap ErrModel and quote the spec.
func parse(s string) (model, error) {
	t, err := spec.One(s)
	if err != nil {
		return model{}, fmt.Errorf("%w: %w", ErrModel, err)
	}
	m := model{kind: t.Name, text: s}
	r := t.Reader()
	switch t.Name {
	case "logreg", "cnn":
	case "mlp", "2nn":
		m.kind = "mlp"
		if ws := r.String("widths", ""); ws != "" {
			for _, f := range strings.Split(ws, "-") {
				w, err := strconv.Atoi(f)
				if err != nil || w <= 0 {
					r.Failf("widths must be positive integers joined by '-', got %q", ws)
					break
				}
				m.widths = append(m.widths, w)
			}
			if len(m.widths) > 0 && len(m.widths) < 2 {
				r.Failf("widths %q need at least the input and the output", ws)
			}
		}
	case "charlm":
		m.lm, m.level = parseCharLM(r)
	default:
		return model{}, fmt.Errorf("%w: %w", ErrModel, t.Errorf("unknown model %q (want logreg, mlp, mlp:W-W-…, 2nn, cnn or charlm[:layers=L,width=W,heads=H,ctx=T])", t.Name))
	}
	if err := r.Done(); err != nil {
		return model{}, fmt.Errorf("%w: %w", ErrModel, err)
	}
	return m, nil
}

// maxContext bounds charlm's ctx: attention keeps a T×T block per head
// and sample.
const maxContext = 4096

// parseCharLM reads charlm's parameters; the vocabulary comes from data.
func parseCharLM(r *spec.Reader) (nn.CharLMConfig, data.Level) {
	d := nn.DefaultCharLMConfig()
	r.Keyed()
	c := nn.CharLMConfig{
		Layers:   r.Int("layers", d.Layers, 1, 256),
		Dim:      r.Int("width", d.Dim, 1, 1<<16),
		Heads:    r.Int("heads", d.Heads, 1, 1<<16),
		Context:  r.Int("ctx", d.Context, 1, maxContext),
		MLPRatio: r.Int("mlp", d.MLPRatio, 1, 64),
		Dropout:  float32(r.Float("dropout", float64(d.Dropout), spec.In(0, 1, true, false))),
	}
	level := data.ByteLevel
	if r.String("level", "byte", "byte", "rune") == "rune" {
		level = data.RuneLevel
	}
	if c.Heads > 0 && c.Dim%c.Heads != 0 {
		r.Failf("%d heads do not divide width %d", c.Heads, c.Dim)
	}
	return c, level
}
