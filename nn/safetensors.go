package nn

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"sort"

	"github.com/starling-ml/starling/internal/atomicfile"
)

// Errors of safetensors I/O.
var (
	// ErrSafetensors reports a malformed safetensors file.
	ErrSafetensors = errors.New("nn: malformed safetensors")
	// ErrDtype reports a well-formed tensor of a dtype other than F32.
	ErrDtype = errors.New("nn: unsupported dtype")
)

// maxHeader bounds the JSON header (the format's own limit is 100 MB).
const maxHeader = 100 << 20

// maxTensorBytes bounds one tensor's declared size, so that the product of
// its dimensions cannot overflow; callers set their own, lower limits.
const maxTensorBytes = 1 << 50

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

// stTensor is one tensor a header declares.
type stTensor struct {
	name string
	stEntry
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
// Errors wrap ErrSafetensors, or ErrDtype for a tensor that is not F32.
func ReadSafetensors(r io.Reader, maxData int64) ([]Tensor, map[string]string, error) {
	ents, meta, err := readHeader(r)
	if err != nil {
		return nil, nil, err
	}
	if end := dataEnd(ents); end > maxData {
		return nil, nil, fmt.Errorf("%w: %d data bytes exceed the limit of %d", ErrSafetensors, end, maxData)
	}
	ts, err := readData(r, ents)
	if err != nil {
		return nil, nil, err
	}
	return ts, meta, nil
}

// readHeader reads a safetensors header: the tensors it declares, F32
// only, ordered by data offset and lying end to end from offset 0, and the
// metadata.
func readHeader(r io.Reader) ([]stTensor, map[string]string, error) {
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
	var ents []stTensor
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
			return nil, nil, fmt.Errorf("%w: tensor %q has dtype %q; only F32 is supported", ErrDtype, name, e.Dtype)
		}
		n := int64(1)
		for _, d := range e.Shape {
			if d < 0 || (d > 0 && n > maxTensorBytes/4/int64(d)) {
				return nil, nil, fmt.Errorf("%w: tensor %q shape %v", ErrSafetensors, name, e.Shape)
			}
			n *= int64(d)
		}
		if e.Offsets[0] < 0 || e.Offsets[1]-e.Offsets[0] != n*4 {
			return nil, nil, fmt.Errorf("%w: tensor %q shape %v does not match offsets %v", ErrSafetensors, name, e.Shape, e.Offsets)
		}
		ents = append(ents, stTensor{name, e})
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
	return ents, meta, nil
}

// dataEnd returns the size of the data section readHeader's tensors span.
func dataEnd(ents []stTensor) int64 {
	if len(ents) == 0 {
		return 0
	}
	return ents[len(ents)-1].Offsets[1]
}

// readData reads the data of the tensors readHeader returned.
func readData(r io.Reader, ents []stTensor) ([]Tensor, error) {
	ts := make([]Tensor, len(ents))
	buf := make([]byte, 1<<16)
	for i, e := range ents {
		t := Tensor{Name: e.name, Shape: e.Shape, Data: make([]float32, (e.Offsets[1]-e.Offsets[0])/4)}
		for k := 0; k < len(t.Data); {
			chunk := min(len(buf)/4, len(t.Data)-k)
			if _, err := io.ReadFull(r, buf[:chunk*4]); err != nil {
				return nil, fmt.Errorf("%w: data of %q: %v", ErrSafetensors, e.name, err)
			}
			for j := 0; j < chunk; j++ {
				t.Data[k+j] = math.Float32frombits(binary.LittleEndian.Uint32(buf[4*j:]))
			}
			k += chunk
		}
		ts[i] = t
	}
	return ts, nil
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
// Params), in state-dict order.
func (m *Model) Tensors() []Tensor { return m.tensorsOf(m.Params) }

// tensorsOf names the parts of params, a vector laid out as Params.
func (m *Model) tensorsOf(params []float32) []Tensor {
	ts := make([]Tensor, len(m.views))
	for i, v := range m.views {
		ts[i] = Tensor{Name: v.Name, Shape: v.Shape, Data: params[v.Offset : v.Offset+v.Len]}
	}
	return ts
}

// SetTensors copies named tensors into the model's parameters. The
// tensors must be the model's state dict exactly: every parameter present
// with its shape, no other name. Errors wrap ErrShape and name the first
// tensor that does not fit; on error the model is unchanged.
func (m *Model) SetTensors(ts []Tensor) error {
	if err := m.fits(ts); err != nil {
		return err
	}
	for _, t := range ts {
		if len(t.Data) != Shape(t.Shape).Size() {
			return fmt.Errorf("%w: tensor %q has shape %v but %d values", ErrShape, t.Name, t.Shape, len(t.Data))
		}
	}
	byName := make(map[string][]float32, len(ts))
	for _, t := range ts {
		byName[t.Name] = t.Data
	}
	for _, v := range m.views {
		copy(m.Param(v), byName[v.Name])
	}
	return nil
}

// fits checks that the names and shapes of ts (their data is not read)
// are the model's state dict: the model's tensors in order, then any name
// left over.
func (m *Model) fits(ts []Tensor) error {
	byName := make(map[string][]int, len(ts))
	for _, t := range ts {
		if _, dup := byName[t.Name]; dup {
			return fmt.Errorf("%w: tensor %q appears twice", ErrShape, t.Name)
		}
		byName[t.Name] = t.Shape
	}
	for _, v := range m.views {
		shape, ok := byName[v.Name]
		if !ok {
			return fmt.Errorf("%w: tensor %q is missing (the model's has shape %v)", ErrShape, v.Name, v.Shape)
		}
		if !slices.Equal(shape, v.Shape) {
			return fmt.Errorf("%w: tensor %q has shape %v, the model's is %v", ErrShape, v.Name, shape, v.Shape)
		}
		delete(byName, v.Name)
	}
	for _, t := range ts {
		if _, extra := byName[t.Name]; extra {
			return fmt.Errorf("%w: tensor %q is not a parameter of %s", ErrShape, t.Name, m.Arch)
		}
	}
	return nil
}

// SaveFile writes the model's parameters to path, atomically, as a
// PyTorch state dict in safetensors form: F32 tensors under their
// state-dict names and shapes (View), which load with
// torch.nn.Module.load_state_dict(…, strict=True) into the equivalent
// torch module (docs/design.md, "Import and export"). The metadata holds
// "format": "pt" and the architecture, "starling.arch".
func (m *Model) SaveFile(path string) error { return m.SaveParams(path, m.Params) }

// SaveParams is SaveFile for params, a vector laid out as the model's
// Params (a strategy's global model, a checkpoint's parameters, a copy
// taken while others write the model), which it only reads; the model's
// own parameters are not used. Errors wrap ErrShape if params is not of
// the model's size.
func (m *Model) SaveParams(path string, params []float32) error {
	return m.SaveParamsWith(path, params, nil)
}

// SaveParamsWith is SaveParams with more metadata, such as a text
// model's vocabulary; "format" and "starling.arch" are SaveFile's and
// cannot be overridden. meta is only read.
func (m *Model) SaveParamsWith(path string, params []float32, meta map[string]string) error {
	if len(params) != len(m.Params) {
		return fmt.Errorf("%w: %d values to save as %s, which has %d parameters", ErrShape, len(params), m.Arch, len(m.Params))
	}
	all := map[string]string{}
	for k, v := range meta {
		all[k] = v
	}
	all["format"], all["starling.arch"] = "pt", m.Arch
	return atomicfile.Write(path, 0o644, func(w io.Writer) error {
		return WriteSafetensors(w, m.tensorsOf(params), all)
	})
}

// ReadMetadata returns the metadata of a safetensors file, reading its
// header only. Errors start with the path and wrap ErrSafetensors or
// ErrDtype for a malformed header.
func ReadMetadata(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	_, meta, err := readHeader(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return meta, nil
}

// LoadFile sets the model's parameters from a safetensors file: one
// written by SaveFile, or a torch state dict of the equivalent module
// (safetensors.torch.save_file). The file must hold exactly the model's
// state dict in F32: every parameter with its shape and no other tensor;
// names and shapes are checked against the header before any data is
// read. Errors are one line that starts with the path and wraps ErrShape
// (naming the tensor, both shapes and, from a file SaveFile wrote, the
// file's architecture when it is another), ErrDtype or ErrSafetensors; on
// error the model is unchanged.
func (m *Model) LoadFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	ents, meta, err := readHeader(f)
	if err != nil {
		if errors.Is(err, ErrSafetensors) {
			return fmt.Errorf("%s: %w (is it a weights file for %s?)", path, err, m.Arch)
		}
		return fmt.Errorf("%s: %w", path, err)
	}
	decl := make([]Tensor, len(ents))
	for i, e := range ents {
		decl[i] = Tensor{Name: e.name, Shape: e.Shape}
	}
	if err := m.fits(decl); err != nil {
		if arch := meta["starling.arch"]; arch != "" && arch != m.Arch {
			return fmt.Errorf("%s: %w (the file holds %s)", path, err, arch)
		}
		return fmt.Errorf("%s: %w", path, err)
	}
	ts, err := readData(f, ents)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return m.SetTensors(ts)
}
