package workload

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/starling-ml/starling/data"
	"github.com/starling-ml/starling/device"
	"github.com/starling-ml/starling/nn"
)

// tiny is a charlm small enough to build in microseconds.
const tiny = "charlm:layers=1,width=8,heads=2,ctx=8"

// writeFiles writes name → text under a fresh temporary folder.
func writeFiles(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, text := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// letterDocs returns n documents, the i-th a few lines of the i-th
// letter only, so that a vocabulary tells which documents it came from.
func letterDocs(n int) map[string]string {
	files := map[string]string{}
	for i := range n {
		c := string(rune('a' + i))
		files[fmt.Sprintf("d%02d.txt", i)] = strings.Repeat(strings.Repeat(c, 30)+"\n", 4)
	}
	return files
}

// mustLoad loads cfg or fails the test.
func mustLoad(t *testing.T, cfg Config) *Workload {
	t.Helper()
	w, err := Load(cfg)
	if err != nil {
		t.Fatalf("Load(%+v): %v", cfg, err)
	}
	return w
}

// checkOneLine fails unless err is one line that contains every want.
func checkOneLine(t *testing.T, err error, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("want an error containing %q", want)
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("error spans lines: %q", err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %q", err, w)
		}
	}
}

func TestSpecErrors(t *testing.T) {
	cases := []struct {
		spec string
		want string // in the error
	}{
		{"resnet", `unknown model "resnet"`},
		{"", ""},
		{"mlp:784-x-10", "positive integers"},
		{"mlp:784-0-10", "positive integers"},
		{"mlp:784--10", "positive integers"},
		{"mlp:784", "at least the input and the output"},
		{"2nn:widths=7", "at least the input and the output"},
		{"logreg:3", ""},
		{"cnn:wide", ""},
		{"charlm:width=10,heads=3", "3 heads do not divide width 10"},
		{"charlm:width=0", "width"},
		{"charlm:layers=0", "layers"},
		{"charlm:ctx=100000", "ctx"},
		{"charlm:dropout=1", "dropout"},
		{"charlm:level=word", "level"},
		{"charlm:4", "key=value"},
		{"charlm:depth=4", "depth"},
		{"charlm+mlp", ""},
	}
	for _, c := range cases {
		t.Run(c.spec, func(t *testing.T) {
			err := Config{Model: c.spec}.Validate()
			checkOneLine(t, err, c.want)
			if !errors.Is(err, ErrModel) {
				t.Errorf("%v does not wrap ErrModel", err)
			}
			if _, err2 := Kind(c.spec); err2 == nil || err2.Error() != err.Error() {
				t.Errorf("Kind: %v, Validate: %v", err2, err)
			}
			if _, _, err2 := TuningOf(c.spec); err2 == nil {
				t.Errorf("TuningOf accepts %q", c.spec)
			}
			if _, err2 := Load(Config{Model: c.spec, Data: t.TempDir()}); !errors.Is(err2, ErrModel) {
				t.Errorf("Load: %v, want ErrModel before reading data", err2)
			}
		})
	}
}

func TestConfigErrors(t *testing.T) {
	for _, c := range []Config{
		{Model: "mlp", Limit: -1},
		{Model: "mlp", ValFraction: 1},
		{Model: "mlp", ValFraction: -0.1},
		{Model: "mlp", ValWindows: -1},
	} {
		if err := c.Validate(); !errors.Is(err, ErrData) {
			t.Errorf("%+v: %v, want ErrData", c, err)
		}
	}
	for _, spec := range []string{"logreg", "mlp", "mlp:784-128-10", "2nn", "cnn", "charlm", tiny, "charlm:level=rune,dropout=0.1,mlp=2"} {
		if err := (Config{Model: spec}).Validate(); err != nil {
			t.Errorf("%s: %v", spec, err)
		}
	}
}

func TestKindAndTuning(t *testing.T) {
	for spec, want := range map[string]string{"logreg": "logreg", "2nn": "mlp", "mlp:784-10": "mlp", "cnn": "cnn", tiny: "charlm"} {
		k, err := Kind(spec)
		if err != nil || k != want {
			t.Errorf("Kind(%q) = %q, %v; want %q", spec, k, err, want)
		}
		tu, ok, err := TuningOf(spec)
		if err != nil || ok != (want == "charlm") {
			t.Errorf("TuningOf(%q): ok %v, %v", spec, ok, err)
		}
		if ok && tu != CharLMTuning {
			t.Errorf("TuningOf(%q) = %+v, want CharLMTuning", spec, tu)
		}
	}
}

// mnist returns MNIST's folder, skipping the test where it is absent.
func mnist(t *testing.T) string {
	t.Helper()
	dir, err := data.FindMNIST()
	if err != nil {
		t.Skipf("MNIST is absent: %v", err)
	}
	return dir
}

// TestImageModelsAreNNs: on MNIST each image workload builds exactly the
// model nn.New builds from the same name, with the same seed.
func TestImageModelsAreNNs(t *testing.T) {
	mnist(t)
	// MNIST is read once; the other models fit that read.
	first := mustLoad(t, Config{Model: "logreg", Limit: 100})
	tr, te := first.Train.(*data.Set), first.Test.(*data.Set)
	for _, spec := range []string{"logreg", "mlp", "2nn", "mlp:784-64-10", "cnn"} {
		m, err := parse(spec)
		if err != nil {
			t.Fatal(err)
		}
		w, err := fitImages(tr, te, first.Source, m)
		if err == nil {
			w, err = w.finish(m)
		}
		if err != nil {
			t.Fatalf("%s: %v", spec, err)
		}
		want, err := nn.New(spec, 7)
		if err != nil {
			t.Fatal(err)
		}
		got, err := w.NewModel(7)
		if err != nil {
			t.Fatal(err)
		}
		if got.Arch != want.Arch || w.Arch() != want.Arch || !slices.Equal(got.Params, want.Params) || w.Params() != len(want.Params) {
			t.Errorf("%s: workload model %s (%d params) differs from nn.New's %s", spec, got.Arch, len(got.Params), want.Arch)
		}
		if w.Digest() != Digest(want, nil) || !strings.HasPrefix(w.ID(), w.Kind+"-") {
			t.Errorf("%s: digest or id %q differs", spec, w.ID())
		}
		if w.Text() || w.Vocab != nil || w.Train.Len() != 100 || w.Test.Len() != 10000 {
			t.Errorf("%s: text %v, %d training and %d test samples", spec, w.Text(), w.Train.Len(), w.Test.Len())
		}
	}
	m, err := parse("mlp:100-10")
	if err != nil {
		t.Fatal(err)
	}
	_, err = fitImages(tr, te, first.Source, m)
	checkOneLine(t, err, "784 inputs", "10 classes")
	if !errors.Is(err, ErrData) {
		t.Errorf("%v does not wrap ErrData", err)
	}
}

// writeIDX writes an IDX file of unsigned bytes with the given dims.
func writeIDX(t *testing.T, path string, dims []int, vals []byte) {
	t.Helper()
	b := []byte{0, 0, 0x08, byte(len(dims))}
	for _, d := range dims {
		b = binary.BigEndian.AppendUint32(b, uint32(d))
	}
	if err := os.WriteFile(path, append(b, vals...), 0o644); err != nil {
		t.Fatal(err)
	}
}

// idxDir writes a folder of n training and n test images of h×w pixels
// with labels 0, 1, 2, 0, … under the given names.
func idxDir(t *testing.T, h, w, n int, names [4]string) string {
	dir := t.TempDir()
	px := make([]byte, n*h*w)
	for i := range px {
		px[i] = byte(i * 7)
	}
	lbl := make([]byte, n)
	for i := range lbl {
		lbl[i] = byte(i % 3)
	}
	for i, name := range names {
		if i%2 == 0 {
			writeIDX(t, filepath.Join(dir, name), []int{n, h, w}, px)
		} else {
			writeIDX(t, filepath.Join(dir, name), []int{n}, lbl)
		}
	}
	return dir
}

// TestImageModelsFitData: on a folder of other IDX files, the models take
// their input shape and class count from the data.
func TestImageModelsFitData(t *testing.T) {
	dir := idxDir(t, 6, 5, 12, [4]string{"x-train-images.idx", "x-train-labels.idx", "x-test-images.idx", "x-test-labels.idx"})
	for spec, arch := range map[string]string{
		"logreg":   "logreg:30-3",
		"mlp":      "mlp:30-200-200-3",
		"mlp:30-3": "mlp:30-3",
		"cnn":      "cnn:6x5x1-3",
	} {
		w := mustLoad(t, Config{Model: spec, Data: dir})
		m, err := w.NewModel(1)
		if err != nil {
			t.Fatal(err)
		}
		if m.Arch != arch || w.Arch() != arch || w.Source != dir || w.Train.Len() != 12 {
			t.Errorf("%s: model %s (want %s), source %q, %d samples", spec, m.Arch, arch, w.Source, w.Train.Len())
		}
	}
	_, err := Load(Config{Model: "mlp:784-10", Data: dir})
	checkOneLine(t, err, "784 inputs", "30 inputs and 3 classes", dir)

	// MNIST's file names are read as MNIST.
	named := idxDir(t, 28, 28, 4, [4]string{"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"})
	w := mustLoad(t, Config{Model: "cnn", Data: named})
	if w.Arch() != "cnn:28x28x1-10" || w.Source != named || w.Train.Len() != 4 {
		t.Errorf("MNIST-named folder: %s from %q, %d samples", w.Arch(), w.Source, w.Train.Len())
	}

	small := idxDir(t, 3, 8, 4, [4]string{"train-images", "train-labels", "t10k-images", "t10k-labels"})
	_, err = Load(Config{Model: "cnn", Data: small})
	checkOneLine(t, err, "at least 4×4", "[3 8 1]")

	missing := t.TempDir()
	_, err = Load(Config{Model: "logreg", Data: missing})
	checkOneLine(t, err, missing, "train-images")
	if !errors.Is(err, data.ErrNoDataset) {
		t.Errorf("%v does not wrap ErrNoDataset", err)
	}
	writeIDX(t, filepath.Join(dir, "y-train-images.idx"), []int{1, 1}, []byte{0})
	_, err = Load(Config{Model: "logreg", Data: dir})
	checkOneLine(t, err, "2 files could be the train-images")
	file := filepath.Join(dir, "x-train-images.idx")
	_, err = Load(Config{Model: "logreg", Data: file})
	checkOneLine(t, err, file, "is a file")
}

func TestTailCut(t *testing.T) {
	long := strings.Repeat("x", 2*maxLineBack)
	cases := []struct {
		text string
		frac float64
		want int
	}{
		{"0123456789", 0.3, 7},                      // no line: the exact byte
		{"aaaa\nbbbb\ncccc\ndddd\n", 0.25, 15},      // the line that holds byte 15
		{"aaaa\nbbbb\ncccc\ndddd\n", 0.2, 15},       // byte 16 is in the line from 15
		{"aaaa\n" + long, 0.1, 5 + len(long) - 205}, // the line starts too far back
		{"ééééé", 0.3, 8},                           // byte 7 is inside a rune: the next
		{"abc", 0.1, 3},                             // nothing held out
		{"abcdefghijklmnopqrstuvwxyz\n", 0.01, 27},  // nothing held out
		{"ab\ncdefghijklmnopqrstuvwxyz", 0.5, 3},    // the only line starts at 3
	}
	for _, c := range cases {
		if got := tailCut([]byte(c.text), c.frac); got != c.want {
			t.Errorf("tailCut(%.20q, %v) = %d, want %d", c.text, c.frac, got, c.want)
		}
	}
}

// TestTextSplitByDocument: a corpus of at least 10 documents holds out
// whole documents, decided by the seed; the vocabulary is the training
// part's only.
func TestTextSplitByDocument(t *testing.T) {
	dir := writeFiles(t, letterDocs(20))
	for seed := uint64(1); seed <= 3; seed++ {
		w := mustLoad(t, Config{Model: tiny, Data: dir, Seed: seed, ValFraction: 0.1})
		c, err := data.ReadCorpus(dir, data.CorpusConfig{})
		if err != nil {
			t.Fatal(err)
		}
		tr, val, err := c.Split(0.1, seed)
		if err != nil {
			t.Fatal(err)
		}
		if len(val.Docs) != 2 || len(tr.Docs) != 18 {
			t.Fatalf("split %d/%d documents", len(tr.Docs), len(val.Docs))
		}
		if !w.Text() || w.Kind != "charlm" || w.Vocab.Size() != 1+18+1 { // unknown, 18 letters, newline
			t.Fatalf("seed %d: vocabulary of %d, want 20", seed, w.Vocab.Size())
		}
		for _, d := range val.Docs {
			if id := w.Vocab.Encode(nil, d.Text[:1])[0]; id != data.UnknownID {
				t.Errorf("seed %d: held-out %s's letter has id %d: the vocabulary saw it", seed, d.Name, id)
			}
		}
		for _, d := range tr.Docs {
			if id := w.Vocab.Encode(nil, d.Text[:1])[0]; id == data.UnknownID {
				t.Errorf("seed %d: training %s's letter is unknown", seed, d.Name)
			}
		}
		// 18·124 training bytes in windows of 8+1, 2·124 held-out ones.
		if w.Train.Len() != (18*124-1)/8 || w.Test.Len() != (2*124-1)/8 {
			t.Errorf("seed %d: %d training and %d test windows", seed, w.Train.Len(), w.Test.Len())
		}
	}
	w := mustLoad(t, Config{Model: tiny, Data: dir, Seed: 1, Limit: 5, ValWindows: 3})
	if w.Train.Len() != 5 || w.Test.Len() != 3 {
		t.Errorf("Limit 5, ValWindows 3: %d training and %d test windows", w.Train.Len(), w.Test.Len())
	}
}

// TestTextTailSplit: a corpus of fewer than 10 documents holds out the
// tail of each, from a line start, and trains on the rest.
func TestTextTailSplit(t *testing.T) {
	var b strings.Builder
	for i := range 90 {
		fmt.Fprintf(&b, "line %02d of the training part\n", i)
	}
	head := b.String()
	tail := strings.Repeat("ZZZ held out\n", 10)
	files := map[string]string{"a.txt": head + tail, "sub/b.txt": head + tail}
	dir := writeFiles(t, files)
	c, err := data.ReadCorpus(dir, data.CorpusConfig{})
	if err != nil {
		t.Fatal(err)
	}
	frac := float64(len(tail)) / float64(len(head+tail))
	tr, val, err := splitText(c, frac, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Docs) != 2 || len(val.Docs) != 2 {
		t.Fatalf("%d training, %d held-out documents", len(tr.Docs), len(val.Docs))
	}
	for i := range 2 {
		if string(tr.Docs[i].Text) != head || string(val.Docs[i].Text) != tail || tr.Docs[i].Name != c.Docs[i].Name {
			t.Errorf("document %s: split into %d + %d bytes, want %d + %d", c.Docs[i].Name, len(tr.Docs[i].Text), len(val.Docs[i].Text), len(head), len(tail))
		}
	}
	w := mustLoad(t, Config{Model: tiny, Data: dir, ValFraction: frac})
	if id := w.Vocab.Encode(nil, []byte("Z"))[0]; id != data.UnknownID {
		t.Errorf("held-out Z has id %d", id)
	}
	if w.Train.Len() != (2*len(head)-1)/8 || w.Test.Len() != (2*len(tail)-1)/8 {
		t.Errorf("%d training, %d test windows", w.Train.Len(), w.Test.Len())
	}
	// One file, the default fraction.
	file := filepath.Join(dir, "a.txt")
	w = mustLoad(t, Config{Model: tiny, Data: file})
	if w.Source != file || w.Train.Len() == 0 || w.Test.Len() == 0 {
		t.Errorf("%s: %d training, %d test windows", w.Source, w.Train.Len(), w.Test.Len())
	}
}

func TestTextErrors(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"empty.txt": "", "nul.bin": "abc\x00def", "short.txt": "hello\nworld\n",
		"latin1.txt": strings.Repeat("caf\xe9 ", 20),
		"bin/a.dat":  "\x00\x01", "bin/b.dat": "\xff\xfe\x00",
		"empties/a": "", "empties/b": "",
	})
	cases := []struct {
		path string
		is   error
		want string
	}{
		{"empty.txt", data.ErrEmptyCorpus, "empty"},
		{"nul.bin", data.ErrBinary, "NUL byte"},
		{"latin1.txt", data.ErrBinary, "not valid UTF-8"},
		{"bin", data.ErrBinary, "all 2 files are binary"},
		{"empties", data.ErrEmptyCorpus, "all 2 files are empty"},
		{"none", data.ErrNoDataset, "no such file"},
		{"short.txt", ErrData, "too short for one window of ctx=64"},
	}
	for _, c := range cases {
		p := filepath.Join(dir, c.path)
		_, err := Load(Config{Model: "charlm:layers=1,width=8,heads=2,ctx=64", Data: p})
		checkOneLine(t, err, p, c.want)
		if !errors.Is(err, c.is) {
			t.Errorf("%s: %v does not wrap %v", c.path, err, c.is)
		}
	}
	// A folder with some binary files trains on the rest and says so.
	mixed := writeFiles(t, map[string]string{"a.txt": strings.Repeat("text\n", 40), "b.bin": "\x00"})
	w := mustLoad(t, Config{Model: tiny, Data: mixed})
	if !slices.Equal(w.Skipped, []string{"b.bin"}) {
		t.Errorf("Skipped = %q", w.Skipped)
	}
}

// TestIDs: equal configs give equal IDs; another architecture or another
// vocabulary, even of the same size, another ID.
func TestIDs(t *testing.T) {
	abc := writeFiles(t, map[string]string{"t.txt": strings.Repeat("abc abc\n", 40)})
	abd := writeFiles(t, map[string]string{"t.txt": strings.Repeat("abd abd\n", 40)})
	ab := writeFiles(t, map[string]string{"t.txt": strings.Repeat("ab ab\n", 40)})
	base := mustLoad(t, Config{Model: tiny, Data: abc})
	if !regexp.MustCompile(`^charlm-[0-9a-f]{16}$`).MatchString(base.ID()) {
		t.Errorf("ID %q", base.ID())
	}
	same := mustLoad(t, Config{Model: tiny, Data: abc})
	if same.ID() != base.ID() || same.Digest() != base.Digest() {
		t.Errorf("equal configs: %s vs %s", same.ID(), base.ID())
	}
	for name, cfg := range map[string]Config{
		"vocab of the same size": {Model: tiny, Data: abd},
		"smaller vocab":          {Model: tiny, Data: ab},
		"layers":                 {Model: "charlm:layers=2,width=8,heads=2,ctx=8", Data: abc},
		"width":                  {Model: "charlm:layers=1,width=16,heads=2,ctx=8", Data: abc},
		"heads":                  {Model: "charlm:layers=1,width=8,heads=4,ctx=8", Data: abc},
		"ctx":                    {Model: "charlm:layers=1,width=8,heads=2,ctx=4", Data: abc},
		"mlp ratio":              {Model: "charlm:layers=1,width=8,heads=2,ctx=8,mlp=2", Data: abc},
		"dropout":                {Model: "charlm:layers=1,width=8,heads=2,ctx=8,dropout=0.1", Data: abc},
		"rune level":             {Model: "charlm:layers=1,width=8,heads=2,ctx=8,level=rune", Data: abc},
	} {
		w := mustLoad(t, cfg)
		if w.ID() == base.ID() {
			t.Errorf("%s: same ID %s", name, w.ID())
		}
	}
	if w := mustLoad(t, Config{Model: tiny, Data: abd}); w.Arch() != base.Arch() || w.Vocab.Size() != base.Vocab.Size() {
		t.Errorf("abd and abc should differ in their vocabularies only: %s vs %s", w.Arch(), base.Arch())
	}
	// The data's size and the seed change the split, not the ID, when
	// the vocabulary stays.
	if w := mustLoad(t, Config{Model: tiny, Data: abc, Seed: 9, ValWindows: 2}); w.ID() != base.ID() {
		t.Errorf("seed and ValWindows changed the ID")
	}
}

// TestModelFunc: ModelFunc passes its options to every model, NewModel
// builds with the defaults, and both are deterministic in the seed.
func TestModelFunc(t *testing.T) {
	w := mustLoad(t, Config{Model: tiny, Data: writeFiles(t, letterDocs(3))})
	be := device.NewCPU()
	a, err := w.ModelFunc(nn.WithBackend(be))(3)
	if err != nil {
		t.Fatal(err)
	}
	b, err := w.NewModel(3)
	if err != nil {
		t.Fatal(err)
	}
	if a.Backend().Name() != be.Name() || b.Backend().Name() != device.Default().Name() {
		t.Errorf("backends %s and %s", a.Backend().Name(), b.Backend().Name())
	}
	if !slices.Equal(a.Params, b.Params) || a.Arch != w.Arch() || len(a.Params) != w.Params() {
		t.Errorf("models of one seed differ")
	}
	c, _ := w.NewModel(4)
	if slices.Equal(c.Params, b.Params) {
		t.Errorf("seeds 3 and 4 give the same weights")
	}
	if d := Digest(a, w.Vocab); d != w.Digest() {
		t.Errorf("Digest of the built model differs from the workload's")
	}
	var buf bytes.Buffer
	fmt.Fprint(&buf, w.Vocab)
	if !strings.Contains(buf.String(), "vocabulary of 5 tokens") { // unknown, a, b, c, newline
		t.Errorf("vocabulary %s", buf.String())
	}
}

func TestModelIDKindBound(t *testing.T) {
	var d [32]byte
	d[0] = 0xab
	if id := ModelID(strings.Repeat("k", 100), d); len(id) != maxKindLen+1+16 || !strings.HasSuffix(id, "-ab00000000000000") {
		t.Errorf("ModelID = %q", id)
	}
}

// TestModelsInit: Models starts every model from the file's weights on
// the backend given, and refuses a file of other shapes in one line.
func TestModelsInit(t *testing.T) {
	corpus := writeFiles(t, letterDocs(3))
	w := mustLoad(t, Config{Model: tiny, Data: corpus})
	src, err := w.NewModel(5)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "w.safetensors")
	if err := w.Save(src, file); err != nil {
		t.Fatal(err)
	}
	be := device.NewCPU()
	build, err := w.Models(be, file)
	if err != nil {
		t.Fatal(err)
	}
	for _, seed := range []uint64{1, 2} {
		m, err := build(seed)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(m.Params, src.Params) || m.Backend().Name() != be.Name() {
			t.Errorf("seed %d: weights differ from the file's, or backend %s", seed, m.Backend().Name())
		}
		m.Params[0]++ // a model's weights are its own
	}
	if plain, err := w.Models(nil, ""); err != nil {
		t.Fatal(err)
	} else if m, _ := plain(5); !slices.Equal(m.Params, src.Params) || m.Backend().Name() != device.Default().Name() {
		t.Errorf("Models(nil, \"\") differs from NewModel")
	}
	// The file records the vocabulary; one of the same size but other
	// letters is refused, and a file without one (torch's) is not.
	meta, err := nn.ReadMetadata(file)
	if err != nil {
		t.Fatal(err)
	}
	var v data.Vocab
	if b, err := hex.DecodeString(meta[MetaVocab]); err != nil || v.UnmarshalBinary(b) != nil || v.Digest() != w.Vocab.Digest() {
		t.Errorf("%s = %q does not decode to the vocabulary", MetaVocab, meta[MetaVocab])
	}
	other := mustLoad(t, Config{Model: tiny, Data: writeFiles(t, map[string]string{"x": strings.Repeat("abd\n", 30)})})
	if other.Vocab.Size() != w.Vocab.Size() {
		t.Fatalf("vocabularies of %d and %d", other.Vocab.Size(), w.Vocab.Size())
	}
	_, err = other.Models(nil, file)
	checkOneLine(t, err, file, "trained on a byte vocabulary of 5 tokens", "this data has a byte vocabulary of 5 tokens")
	if !errors.Is(err, ErrVocab) {
		t.Errorf("%v does not wrap ErrVocab", err)
	}
	plainFile := filepath.Join(t.TempDir(), "plain.safetensors")
	if err := src.SaveFile(plainFile); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Models(nil, plainFile); err != nil {
		t.Errorf("a file without a vocabulary: %v", err)
	}

	wide := mustLoad(t, Config{Model: "charlm:layers=1,width=16,heads=2,ctx=8", Data: corpus})
	_, err = wide.Models(nil, file)
	checkOneLine(t, err, file, `tensor "transformer.wte.weight" has shape [5 8], the model's is [5 16]`)
	if !errors.Is(err, nn.ErrShape) {
		t.Errorf("%v does not wrap nn.ErrShape", err)
	}
}

// TestSaveImage: an image model's file is the one nn's SaveFile writes.
func TestSaveImage(t *testing.T) {
	dir := idxDir(t, 4, 4, 6, [4]string{"train-images", "train-labels", "test-images", "test-labels"})
	w := mustLoad(t, Config{Model: "logreg", Data: dir})
	m, err := w.NewModel(1)
	if err != nil {
		t.Fatal(err)
	}
	a, b := filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b")
	if err := w.Save(m, a); err != nil {
		t.Fatal(err)
	}
	if err := m.SaveFile(b); err != nil {
		t.Fatal(err)
	}
	x, _ := os.ReadFile(a)
	y, _ := os.ReadFile(b)
	if len(x) == 0 || !bytes.Equal(x, y) {
		t.Errorf("Save wrote %d bytes, SaveFile %d", len(x), len(y))
	}
}
