package train

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/starling-ml/starling/aggregate"
	"github.com/starling-ml/starling/compression"
	"github.com/starling-ml/starling/nn"
)

// Compressed all-reduce in training: build the aggregate.Runner with
// aggregate.Config.Compress set (a --compress flag value) and every
// all-reduce of gradients or deltas travels encoded, with error feedback
// when the spec says "ef". Give PowerSGD the model's tensor shapes with
// CompressionLayout, and keep the error-feedback residual across restarts
// with SaveCompression and LoadCompression:
//
//	cfg := aggregate.DefaultConfig()
//	cfg.Compress = "topk:0.01,ef"
//	r, _ := aggregate.NewRunner(self, transport, cfg)
//	err := train.PrepareCompression(r.Compression(), w.Model, restored) // restored may be nil
//	…
//	train.SaveCompression(ck, r.Compression()) // with the rest of the checkpoint

// ExtraCompression is the Checkpoint.Extra entry that holds the compressed
// all-reduce's state.
const ExtraCompression = "compression"

// CompressionLayout returns the model's parameter tensors as the matrices
// PowerSGD compresses: a weight of PyTorch shape [out, in, …] is out rows of
// in·… columns, a bias [n] is one row of n.
func CompressionLayout(m *nn.Model) []compression.Shape {
	views := m.Views()
	layout := make([]compression.Shape, 0, len(views))
	for _, v := range views {
		rows, cols := 1, v.Len
		if len(v.Shape) >= 2 && v.Shape[0] > 0 {
			rows, cols = v.Shape[0], v.Len/v.Shape[0]
		}
		layout = append(layout, compression.Shape{Rows: rows, Cols: cols})
	}
	return layout
}

// PrepareCompression readies c for training m: PowerSGD's layout from the
// model's tensors (CompressionLayout) and, when ck is not nil, the state a
// checkpoint saved (LoadCompression). A nil c (no compression) does
// nothing.
func PrepareCompression(c *aggregate.Compression, m *nn.Model, ck *Checkpoint) error {
	if c == nil {
		return nil
	}
	if err := c.SetLayout(CompressionLayout(m)); err != nil {
		return err
	}
	if ck != nil {
		return LoadCompression(ck, c)
	}
	return nil
}

// SaveCompression stores c's state (the error-feedback residual, PowerSGD's
// warm start) in ck.Extra[ExtraCompression]: a word holding the byte count,
// then aggregate.Compression.AppendState's bytes four to a float32 word. A
// nil c stores nothing.
func SaveCompression(ck *Checkpoint, c *aggregate.Compression) {
	if c == nil {
		return
	}
	if ck.Extra == nil {
		ck.Extra = map[string][]float32{}
	}
	ck.Extra[ExtraCompression] = bytesToWords(c.AppendState(nil))
}

// LoadCompression loads the state SaveCompression stored into c. A
// checkpoint without one leaves c as it is (a run that starts compressing
// on resume); a state of another codec is an error wrapping ErrCheckpoint.
func LoadCompression(ck *Checkpoint, c *aggregate.Compression) error {
	w, ok := ck.Extra[ExtraCompression]
	if !ok || c == nil {
		return nil
	}
	b, err := wordsToBytes(w)
	if err == nil {
		err = c.LoadState(b)
	}
	if err != nil {
		return fmt.Errorf("%w: compression state: %w", ErrCheckpoint, err)
	}
	return nil
}

func bytesToWords(b []byte) []float32 {
	w := make([]float32, 1+(len(b)+3)/4)
	w[0] = math.Float32frombits(uint32(len(b)))
	var pad [4]byte
	for i := 1; i < len(w); i++ {
		chunk := b[4*(i-1):]
		if len(chunk) < 4 {
			copy(pad[:], chunk)
			chunk = pad[:]
		}
		w[i] = math.Float32frombits(binary.LittleEndian.Uint32(chunk))
	}
	return w
}

func wordsToBytes(w []float32) ([]byte, error) {
	if len(w) == 0 {
		return nil, fmt.Errorf("empty")
	}
	n := int(math.Float32bits(w[0]))
	if (n+3)/4 != len(w)-1 {
		return nil, fmt.Errorf("%d words for %d bytes", len(w)-1, n)
	}
	b := make([]byte, 4*(len(w)-1))
	for i, v := range w[1:] {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b[:n], nil
}
