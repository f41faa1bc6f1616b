package workload

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"unicode/utf8"

	"github.com/starling-ml/starling/data"
	"github.com/starling-ml/starling/nn"
)

// minDocSplit is the fewest documents a corpus is split by document: with
// fewer, holding out whole documents would hold out far more or less than
// the fraction asked (one of three is a third), so each document's tail
// is held out instead.
const minDocSplit = 10

// maxLineBack is how far before the exact cut a held-out tail may start
// so as to start at a line.
const maxLineBack = 1024

// loadText reads the corpus, splits it, builds the vocabulary from the
// training part and cuts both parts into windows of the model's context.
func loadText(cfg Config, m model) (*Workload, error) {
	var (
		c      *data.Corpus
		err    error
		source string
	)
	if cfg.Data == "" {
		c, err = data.ReadGoSource()
		if c != nil {
			source = "the Go standard library's sources (" + c.Root + ")"
		}
	} else {
		c, err = data.ReadCorpus(cfg.Data, data.CorpusConfig{})
		source = cfg.Data
	}
	if err != nil {
		return nil, err
	}
	frac := cfg.ValFraction
	if frac == 0 {
		frac = defaultValFraction
	}
	tr, val, err := splitText(c, frac, cfg.Seed)
	if err != nil {
		return nil, err
	}
	vocab, err := data.NewVocab(tr, m.level)
	if err != nil {
		return nil, err
	}
	t := m.lm.Context
	trainW, err := data.TextWindows(tr, vocab, t, 0)
	if err != nil {
		return nil, textError("training", source, t, err)
	}
	valW, err := data.TextWindows(val, vocab, t, 0)
	if err != nil {
		return nil, textError("held-out", source, t, err)
	}
	nval := cfg.ValWindows
	if nval == 0 {
		nval = defaultValWindows
	}
	lm := m.lm
	lm.Vocab = vocab.Size()
	w := &Workload{
		Train: data.Head(trainW, cfg.Limit), Test: data.Spread(valW, nval),
		Vocab: vocab, Source: source, Skipped: c.Skipped,
		build: func(seed uint64, opts ...nn.Option) (*nn.Model, error) { return nn.NewCharLM(lm, seed, opts...) },
	}
	return w, nil
}

// textError explains a part of a corpus too short for one window.
func textError(part, source string, t int, err error) error {
	if errors.Is(err, data.ErrTooShort) {
		return fmt.Errorf("%w: the %s text of %s is too short for one window of ctx=%d tokens (%v): give more text or a smaller ctx", ErrData, part, source, t, err)
	}
	return err
}

// splitText holds out valFraction of the corpus: whole documents, chosen
// by Corpus.Split with seed, when there are at least minDocSplit of them;
// else the last valFraction of each document, from the start of a line
// (or of a rune, in a document without one there).
func splitText(c *data.Corpus, valFraction float64, seed uint64) (train, val *data.Corpus, err error) {
	if len(c.Docs) >= minDocSplit {
		return c.Split(valFraction, seed)
	}
	train, val = &data.Corpus{Root: c.Root}, &data.Corpus{Root: c.Root}
	for _, d := range c.Docs {
		cut := tailCut(d.Text, valFraction)
		if cut > 0 {
			train.Docs = append(train.Docs, data.Document{Name: d.Name, Text: d.Text[:cut]})
		}
		if cut < len(d.Text) {
			val.Docs = append(val.Docs, data.Document{Name: d.Name, Text: d.Text[cut:]})
		}
	}
	if len(train.Docs) == 0 || len(val.Docs) == 0 {
		return nil, nil, fmt.Errorf("%s: %w: %d bytes of text cannot be split into training and validation", c.Root, data.ErrEmptyCorpus, c.Bytes())
	}
	return train, val, nil
}

// tailCut returns where the last frac of text begins: the start of the
// line that holds that byte when it starts at most maxLineBack bytes
// before it, else the start of the rune.
func tailCut(text []byte, frac float64) int {
	at := len(text) - int(math.Round(frac*float64(len(text))))
	if at <= 0 || at >= len(text) {
		return at
	}
	if nl := bytes.LastIndexByte(text[:at], '\n'); nl >= 0 && at-nl-1 <= maxLineBack {
		return nl + 1
	}
	for at < len(text) && !utf8.RuneStart(text[at]) {
		at++
	}
	return at
}
