package data

import (
	"errors"
	"fmt"
	"math"
)

// ErrTooShort reports a token stream shorter than one window.
var ErrTooShort = errors.New("data: too few tokens for one window")

// Windows is the next-token Dataset over a stream of tokens: sample i is
// the window of T+1 tokens starting at token i·stride, with inputs
// x = tokens[s:s+T] and targets y = tokens[s+1:s+T+1]. Len counts the
// windows that fit whole, so an epoch of an Iterator visits each once in a
// seeded order; with stride T (the default) they do not overlap and an
// epoch predicts every token but the last partial window's once. Windows
// is read-only and safe for concurrent use; it is not Labeled.
type Windows struct {
	tok16   []uint16 // the tokens when the vocabulary fits 16 bits
	tok32   []int32  // the tokens otherwise
	seq     int
	stride  int
	classes int
	n       int // windows
}

var _ Dataset = (*Windows)(nil)

// NewWindows returns the windows of seqLen+1 tokens every stride tokens
// (stride 0: seqLen) over tokens, each of which must lie in
// [0, vocabSize). Windows keeps its own copy of the tokens. Errors wrap
// ErrTooShort, ErrLabelRange or ErrConfig.
func NewWindows(tokens []int32, vocabSize, seqLen, stride int) (*Windows, error) {
	w, err := newWindows(vocabSize, seqLen, stride, len(tokens))
	if err != nil {
		return nil, err
	}
	for i, t := range tokens {
		if t < 0 || int(t) >= vocabSize {
			return nil, fmt.Errorf("%w: token %d at %d, vocabulary of %d", ErrLabelRange, t, i, vocabSize)
		}
	}
	w.push(tokens)
	return w, w.count()
}

// TextWindows tokenises the corpus with v, its documents concatenated in
// name order, and returns its windows as NewWindows does.
func TextWindows(c *Corpus, v *Vocab, seqLen, stride int) (*Windows, error) {
	// A document has at most as many tokens as bytes.
	w, err := newWindows(v.Size(), seqLen, stride, c.Bytes())
	if err != nil {
		return nil, err
	}
	var buf []int32
	for _, d := range c.Docs {
		buf = v.Encode(buf[:0], d.Text)
		w.push(buf)
	}
	if err := w.count(); err != nil {
		return nil, fmt.Errorf("%s: %w", c.Root, err)
	}
	return w, nil
}

// newWindows checks the parameters and makes room for capacity tokens.
func newWindows(vocabSize, seqLen, stride, capacity int) (*Windows, error) {
	if stride == 0 {
		stride = seqLen
	}
	if vocabSize <= 0 || vocabSize > 1<<24 || seqLen <= 0 || stride <= 0 {
		return nil, fmt.Errorf("%w: windows of %d tokens every %d over a vocabulary of %d", ErrConfig, seqLen, stride, vocabSize)
	}
	w := &Windows{seq: seqLen, stride: stride, classes: vocabSize}
	if vocabSize <= math.MaxUint16+1 {
		w.tok16 = make([]uint16, 0, capacity)
	} else {
		w.tok32 = make([]int32, 0, capacity)
	}
	return w, nil
}

func (w *Windows) push(tokens []int32) {
	if w.tok32 != nil {
		w.tok32 = append(w.tok32, tokens...)
		return
	}
	for _, t := range tokens {
		w.tok16 = append(w.tok16, uint16(t))
	}
}

// count sets the number of windows once the tokens are in.
func (w *Windows) count() error {
	if t := w.Tokens(); t < w.seq+1 {
		return fmt.Errorf("%w: %d tokens, a window needs %d", ErrTooShort, t, w.seq+1)
	}
	w.n = (w.Tokens()-w.seq-1)/w.stride + 1
	return nil
}

// Tokens returns the length of the token stream.
func (w *Windows) Tokens() int { return len(w.tok16) + len(w.tok32) }

// Start returns the index of the first token of window i.
func (w *Windows) Start(i int) int { return i * w.stride }

// Len returns the number of whole windows.
func (w *Windows) Len() int { return w.n }

// InputShape returns [T].
func (w *Windows) InputShape() []int { return []int{w.seq} }

// Targets returns T: one next token per input token.
func (w *Windows) Targets() int { return w.seq }

// NumClasses returns the vocabulary size.
func (w *Windows) NumClasses() int { return w.classes }

// Batch writes window idx[k]'s inputs, as exact float32 values, to
// x[k·T:(k+1)·T] and its targets to y[k·T:(k+1)·T].
func (w *Windows) Batch(idx []int, x []float32, y []int32) {
	if w.tok32 != nil {
		fillWindows(w, w.tok32, idx, x, y)
	} else {
		fillWindows(w, w.tok16, idx, x, y)
	}
}

func fillWindows[T uint16 | int32](w *Windows, tok []T, idx []int, x []float32, y []int32) {
	n := w.seq
	for k, i := range idx {
		if i < 0 || i >= w.n {
			panic(fmt.Sprintf("data: window %d out of range [0, %d)", i, w.n))
		}
		win := tok[i*w.stride : i*w.stride+n+1]
		xs, ys := x[k*n:(k+1)*n], y[k*n:(k+1)*n]
		for j := range n {
			xs[j] = float32(win[j])
			ys[j] = int32(win[j+1])
		}
	}
}
