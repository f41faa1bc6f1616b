package nn

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// builtins returns one model of each built-in architecture, with
// parameters from seed: the MNIST classifiers, a 3-channel CNN on
// non-square images and a small CharLM.
func builtins(t *testing.T, seed uint64) map[string]*Model {
	t.Helper()
	ms := map[string]*Model{}
	for _, arch := range []string{"logreg", "mlp", "cnn"} {
		m, err := New(arch, seed)
		if err != nil {
			t.Fatal(err)
		}
		ms[arch] = m
	}
	var err error
	if ms["cnn-rgb"], err = NewCNN(12, 8, 3, 5, seed); err != nil {
		t.Fatal(err)
	}
	if ms["charlm"], err = NewCharLM(CharLMConfig{Vocab: 11, Context: 6, Dim: 8, Heads: 2, Layers: 2, MLPRatio: 2}, seed); err != nil {
		t.Fatal(err)
	}
	return ms
}

// TestWeightsRoundTrip: what SaveFile writes, LoadFile reads back into a
// fresh model bit for bit, and SaveParams writes a vector as SaveFile
// writes a model holding it.
func TestWeightsRoundTrip(t *testing.T) {
	dir := t.TempDir()
	fresh := builtins(t, 2)
	for name, m := range builtins(t, 1) {
		path := filepath.Join(dir, name+".safetensors")
		if err := m.SaveFile(path); err != nil {
			t.Fatal(err)
		}
		m2 := fresh[name]
		if slices.Equal(m.Params, m2.Params) {
			t.Fatalf("%s: seeds 1 and 2 give the same parameters", name)
		}
		if err := m2.LoadFile(path); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !slices.Equal(m.Params, m2.Params) {
			t.Fatalf("%s: round trip changed the weights", name)
		}

		// SaveParams from a state vector, into a model that holds other
		// values: the file is the one SaveFile writes, and the model is
		// untouched.
		m2.Init(3)
		before := slices.Clone(m2.Params)
		path2 := filepath.Join(dir, name+".params.safetensors")
		if err := m2.SaveParams(path2, m.Params); err != nil {
			t.Fatal(err)
		}
		a, _ := os.ReadFile(path)
		b, _ := os.ReadFile(path2)
		if !bytes.Equal(a, b) || !slices.Equal(before, m2.Params) {
			t.Fatalf("%s: SaveParams wrote another file or changed the model", name)
		}
	}
	m := fresh["mlp"]
	if err := m.SaveParams(filepath.Join(dir, "short"), m.Params[1:]); !errors.Is(err, ErrShape) {
		t.Fatalf("SaveParams of a short vector: %v, want ErrShape", err)
	}
}

// TestSafetensorsLayout pins the header of a saved CNN: torch's names,
// shapes and dtype, in state-dict order.
func TestSafetensorsLayout(t *testing.T) {
	m, _ := New("cnn", 1)
	path := filepath.Join(t.TempDir(), "w.safetensors")
	if err := m.SaveFile(path); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(path)
	hl := binary.LittleEndian.Uint64(raw)
	if hl%8 != 0 || !bytes.Contains(raw[8:8+hl], []byte(`"0.weight":{"dtype":"F32","shape":[32,1,5,5],"data_offsets":[0,3200]}`)) {
		t.Fatalf("header not in safetensors form: %s", raw[8:8+hl])
	}
}

// TestLoadFileRefuses: a file that is not exactly the model's state dict
// in F32 is refused with a one-line error naming the path and what does
// not fit, and the model is left as it was.
func TestLoadFileRefuses(t *testing.T) {
	m, _ := New("mlp", 1) // 784-200-200-10
	ts := m.Tensors()
	small, _ := New("mlp:784-128-10", 1)
	dir := t.TempDir()
	write := func(ts []Tensor) []byte {
		var b bytes.Buffer
		if err := WriteSafetensors(&b, ts, nil); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	withDtype := func(b []byte, dtype string) []byte {
		return bytes.Replace(b, []byte(`"dtype":"F32"`), []byte(`"dtype":"`+dtype+`"`), 1)
	}
	full := write(ts)
	for _, c := range []struct {
		name string
		file []byte
		is   error
		msg  string
	}{
		{"wrong shape", write(small.Tensors()), ErrShape, `tensor "0.weight" has shape [128 784], the model's is [200 784]`},
		{"missing", write(ts[:len(ts)-1]), ErrShape, `tensor "4.bias" is missing (the model's has shape [10])`},
		{"extra", write(append(slices.Clone(ts), Tensor{Name: "5.weight", Shape: []int{1}, Data: []float32{0}})), ErrShape, `tensor "5.weight" is not a parameter of mlp:784-200-200-10`},
		{"renamed", write(append(slices.Clone(ts[:len(ts)-1]), Tensor{Name: "4.b", Shape: []int{10}, Data: make([]float32, 10)})), ErrShape, `tensor "4.bias" is missing`},
		{"other arch", saved(t, small), ErrShape, `tensor "0.weight" has shape [128 784], the model's is [200 784] (the file holds mlp:784-128-10)`},
		{"F16", withDtype(full, "F16"), ErrDtype, `has dtype "F16"; only F32 is supported`},
		{"truncated", full[:len(full)-1], ErrSafetensors, `data of "4.bias"`},
		{"garbage", []byte("not a weights file at all"), ErrSafetensors, "is it a weights file for mlp:784-200-200-10?"},
	} {
		path := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "-")+".safetensors")
		if err := os.WriteFile(path, c.file, 0o644); err != nil {
			t.Fatal(err)
		}
		m.Init(5)
		before := slices.Clone(m.Params)
		err := m.LoadFile(path)
		if !errors.Is(err, c.is) || !strings.HasPrefix(err.Error(), path+": ") || !strings.Contains(err.Error(), c.msg) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v\nwant %v, starting with the path and saying %s", c.name, err, c.is, c.msg)
		}
		if !slices.Equal(before, m.Params) {
			t.Errorf("%s: a refused load changed the model", c.name)
		}
	}
}

// TestSetTensorsRefuses: SetTensors refuses what LoadFile refuses, and a
// tensor whose values do not fill its shape.
func TestSetTensorsRefuses(t *testing.T) {
	m, _ := New("logreg", 1)
	ts := m.Tensors()
	r := rand.New(rand.NewPCG(1, 2))
	ts[1].Data = randInput(r, 9) // 10 values for "0.bias"
	before := slices.Clone(m.Params)
	if err := m.SetTensors(ts); !errors.Is(err, ErrShape) || !slices.Equal(before, m.Params) {
		t.Fatalf("short data: %v", err)
	}
	ts = m.Tensors()
	if err := m.SetTensors(append(ts, ts[0])); !errors.Is(err, ErrShape) || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("repeated name: %v", err)
	}
}

func FuzzReadSafetensors(f *testing.F) {
	var buf bytes.Buffer
	WriteSafetensors(&buf, []Tensor{{"a", []int{2, 2}, []float32{1, 2, 3, 4}}, {"b", []int{1}, []float32{5}}}, map[string]string{"k": "v"})
	f.Add(buf.Bytes())
	f.Add([]byte{8, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' ', ' ', ' ', ' ', ' '})
	f.Fuzz(func(t *testing.T, in []byte) {
		ts, _, err := ReadSafetensors(bytes.NewReader(in), 1<<20)
		if err != nil {
			return
		}
		for _, x := range ts {
			if Shape(x.Shape).Size() != len(x.Data) {
				t.Fatalf("tensor %q shape %v with %d values", x.Name, x.Shape, len(x.Data))
			}
		}
		var out bytes.Buffer
		if err := WriteSafetensors(&out, ts, nil); err != nil {
			t.Fatalf("re-encoding a decoded file: %v", err)
		}
	})
}

// saved returns the bytes SaveFile writes for m.
func saved(t *testing.T, m *Model) []byte {
	t.Helper()
	path := filepath.Join(t.TempDir(), "m.safetensors")
	if err := m.SaveFile(path); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestSaveParamsWith: extra metadata is written and read back by
// ReadMetadata, and cannot override the format or the architecture.
func TestSaveParamsWith(t *testing.T) {
	m, _ := New("logreg", 1)
	path := filepath.Join(t.TempDir(), "w.safetensors")
	if err := m.SaveParamsWith(path, m.Params, map[string]string{"x.note": "hi", "starling.arch": "cnn", "format": "tf"}); err != nil {
		t.Fatal(err)
	}
	meta, err := ReadMetadata(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(meta) != 3 || meta["x.note"] != "hi" || meta["starling.arch"] != m.Arch || meta["format"] != "pt" {
		t.Errorf("metadata %v", meta)
	}
	if err := m.LoadFile(path); err != nil {
		t.Errorf("LoadFile: %v", err)
	}
	bad := filepath.Join(t.TempDir(), "bad.safetensors")
	if err := os.WriteFile(bad, []byte("nonsense"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadMetadata(bad); !errors.Is(err, ErrSafetensors) || !strings.HasPrefix(err.Error(), bad+": ") {
		t.Errorf("ReadMetadata of a bad file: %v", err)
	}
}
