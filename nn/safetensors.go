package nn

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sort"

	"github.com/starling-ml/starling/internal/atomicfile"
)

// ErrSafetensors reports a malformed safetensors file.
var ErrSafetensors = errors.New("nn: malformed safetensors")

// maxHeader bounds the JSON header (the format's own limit is 100 MB).
const maxHeader = 100 << 20

// Tensor is a named float32 tensor.
type Tensor struct {
	Name  string
	Shape []int
	Data  []float32
}

type stEntry struct {
	Dtype   string   `json:"dtype"`
	Shape   []int    `json:"shape"`
	Offsets [2]int64 `json:"data_offsets"`
}

// WriteSafetensors writes tensors in the safetensors format (F32, little
// endian), in the given order, with optional string metadata.
func WriteSafetensors(w io.Writer, ts []Tensor, meta map[string]string) error {
	header := map[string]any{}
	if len(meta) > 0 {
		header["__metadata__"] = meta
	}
	var off int64
	for _, t := range ts {
		if Shape(t.Shape).Size() != len(t.Data) {
			return fmt.Errorf("%w: tensor %q has shape %v but %d values", ErrShape, t.Name, t.Shape, len(t.Data))
		}
		if _, dup := header[t.Name]; dup || t.Name == "" {
			return fmt.Errorf("nn: duplicate or empty tensor name %q", t.Name)
		}
		shape := t.Shape
		if shape == nil {
			shape = []int{}
		}
		n := int64(len(t.Data)) * 4
		header[t.Name] = stEntry{Dtype: "F32", Shape: shape, Offsets: [2]int64{off, off + n}}
		off += n
	}
	hb, err := json.Marshal(header)
	if err != nil {
		return err
	}
	for len(hb)%8 != 0 {
		hb = append(hb, ' ')
	}
	var lenb [8]byte
	binary.LittleEndian.PutUint64(lenb[:], uint64(len(hb)))
	if _, err := w.Write(lenb[:]); err != nil {
		return err
	}
	if _, err := w.Write(hb); err != nil {
		return err
	}
	buf := make([]byte, 0, 1<<16)
	for _, t := range ts {
		for _, v := range t.Data {
			buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(v))
			if len(buf) == cap(buf) {
				if _, err := w.Write(buf); err != nil {
					return err
				}
				buf = buf[:0]
			}
		}
	}
	_, err = w.Write(buf)
	return err
}

// ReadSafetensors reads a safetensors stream of F32 tensors whose data
// totals at most maxData bytes. Tensors come back ordered by data offset.
func ReadSafetensors(r io.Reader, maxData int64) ([]Tensor, map[string]string, error) {
	var lenb [8]byte
	if _, err := io.ReadFull(r, lenb[:]); err != nil {
		return nil, nil, fmt.Errorf("%w: header length: %v", ErrSafetensors, err)
	}
	hl := binary.LittleEndian.Uint64(lenb[:])
	if hl < 2 || hl > maxHeader {
		return nil, nil, fmt.Errorf("%w: header length %d", ErrSafetensors, hl)
	}
	hb := make([]byte, 0, min(int(hl), 1<<20))
	hb, err := appendN(hb, r, int64(hl))
	if err != nil {
		return nil, nil, fmt.Errorf("%w: header: %v", ErrSafetensors, err)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(hb, &raw); err != nil {
		return nil, nil, fmt.Errorf("%w: header JSON: %v", ErrSafetensors, err)
	}
	var meta map[string]string
	type ent struct {
		name string
		stEntry
	}
	var ents []ent
	for name, msg := range raw {
		if name == "__metadata__" {
			if err := json.Unmarshal(msg, &meta); err != nil {
				return nil, nil, fmt.Errorf("%w: metadata: %v", ErrSafetensors, err)
			}
			continue
		}
		var e stEntry
		if err := json.Unmarshal(msg, &e); err != nil {
			return nil, nil, fmt.Errorf("%w: tensor %q: %v", ErrSafetensors, name, err)
		}
		if e.Dtype != "F32" {
			return nil, nil, fmt.Errorf("%w: tensor %q has dtype %q; only F32 is supported", ErrSafetensors, name, e.Dtype)
		}
		n := int64(1)
		for _, d := range e.Shape {
			if d < 0 || (d > 0 && n > maxData/4/int64(d)+1) {
				return nil, nil, fmt.Errorf("%w: tensor %q shape %v", ErrSafetensors, name, e.Shape)
			}
			n *= int64(d)
		}
		if e.Offsets[0] < 0 || e.Offsets[1]-e.Offsets[0] != n*4 {
			return nil, nil, fmt.Errorf("%w: tensor %q shape %v does not match offsets %v", ErrSafetensors, name, e.Shape, e.Offsets)
		}
		ents = append(ents, ent{name, e})
	}
	sort.Slice(ents, func(a, b int) bool {
		if ents[a].Offsets[0] != ents[b].Offsets[0] {
			return ents[a].Offsets[0] < ents[b].Offsets[0]
		}
		return ents[a].name < ents[b].name
	})
	var end int64
	for _, e := range ents {
		if e.Offsets[0] != end {
			return nil, nil, fmt.Errorf("%w: tensor %q starts at %d, want %d (tensors must be contiguous)", ErrSafetensors, e.name, e.Offsets[0], end)
		}
		end = e.Offsets[1]
	}
	if end > maxData {
		return nil, nil, fmt.Errorf("%w: %d data bytes exceed the limit of %d", ErrSafetensors, end, maxData)
	}
	ts := make([]Tensor, len(ents))
	buf := make([]byte, 1<<16)
	for i, e := range ents {
		t := Tensor{Name: e.name, Shape: e.Shape, Data: make([]float32, (e.Offsets[1]-e.Offsets[0])/4)}
		for k := 0; k < len(t.Data); {
			chunk := min(len(buf)/4, len(t.Data)-k)
			if _, err := io.ReadFull(r, buf[:chunk*4]); err != nil {
				return nil, nil, fmt.Errorf("%w: data of %q: %v", ErrSafetensors, e.name, err)
			}
			for j := 0; j < chunk; j++ {
				t.Data[k+j] = math.Float32frombits(binary.LittleEndian.Uint32(buf[4*j:]))
			}
			k += chunk
		}
		ts[i] = t
	}
	return ts, meta, nil
}

// appendN reads exactly n bytes from r, growing dst as data arrives (so a
// lying length costs only what the stream holds).
func appendN(dst []byte, r io.Reader, n int64) ([]byte, error) {
	for int64(len(dst)) < n {
		if len(dst) == cap(dst) {
			dst = append(dst, 0)[:len(dst)]
		}
		want := min(int64(cap(dst)-len(dst)), n-int64(len(dst)))
		k, err := io.ReadFull(r, dst[len(dst):int64(len(dst))+want])
		dst = dst[:len(dst)+k]
		if err != nil {
			return dst, err
		}
	}
	return dst, nil
}

// Tensors returns the model's parameters as named tensors (views into
// Params).
func (m *Model) Tensors() []Tensor {
	ts := make([]Tensor, len(m.views))
	for i, v := range m.views {
		ts[i] = Tensor{Name: v.Name, Shape: v.Shape, Data: m.Param(v)}
	}
	return ts
}

// SetTensors copies named tensors into the model's parameters. Every
// parameter must be present with its exact shape; on error the model is
// unchanged.
func (m *Model) SetTensors(ts []Tensor) error {
	byName := make(map[string]Tensor, len(ts))
	for _, t := range ts {
		byName[t.Name] = t
	}
	for _, v := range m.views {
		t, ok := byName[v.Name]
		if !ok {
			return fmt.Errorf("%w: %s has no tensor %q", ErrShape, m.Arch, v.Name)
		}
		if !equalInts(t.Shape, v.Shape) {
			return fmt.Errorf("%w: tensor %q has shape %v, model %s needs %v", ErrShape, v.Name, t.Shape, m.Arch, v.Shape)
		}
		delete(byName, v.Name)
	}
	if len(byName) > 0 {
		for name := range byName {
			return fmt.Errorf("%w: tensor %q is not a parameter of %s", ErrShape, name, m.Arch)
		}
	}
	for _, t := range ts {
		for _, v := range m.views {
			if v.Name == t.Name {
				copy(m.Param(v), t.Data)
			}
		}
	}
	return nil
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// SaveFile writes the model's parameters to path as safetensors,
// atomically, with the architecture in the metadata.
func (m *Model) SaveFile(path string) error {
	return atomicfile.Write(path, 0o644, func(w io.Writer) error {
		return WriteSafetensors(w, m.Tensors(), map[string]string{"format": "pt", "starling.arch": m.Arch})
	})
}

// LoadFile reads parameters saved by SaveFile (or by PyTorch's
// safetensors.torch.save_file for the equivalent Sequential). On error the
// model is unchanged.
func (m *Model) LoadFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	ts, _, err := ReadSafetensors(f, int64(len(m.Params))*4)
	if err != nil {
		if errors.Is(err, ErrSafetensors) {
			return fmt.Errorf("%s: %w (is it a weights file for %s?)", path, err, m.Arch)
		}
		return fmt.Errorf("%s: %w", path, err)
	}
	if err := m.SetTensors(ts); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}
