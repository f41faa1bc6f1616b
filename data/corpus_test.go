package data

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func docNames(c *Corpus) []string {
	var out []string
	for _, d := range c.Docs {
		out = append(out, d.Name)
	}
	return out
}

func TestReadCorpus(t *testing.T) {
	latin1 := []byte(strings.Repeat("plain ascii text ", 10) + "caf\xe9\n") // one bad byte in 175
	dir := writeFiles(t, map[string][]byte{
		"a.go":               []byte("package a\n"),
		"a/b.go":             []byte("package b // ünïcode\n"),
		"a/latin1.go":        latin1,
		"a/bin.go":           []byte("pack\x00age"),
		"a/mojibake.go":      []byte("\xff\xfe\xfd not text"),
		"a/empty.go":         nil,
		"a/notes.txt":        []byte("not go"),
		"a/testdata/x.go":    []byte("package x"),
		".git/config.go":     []byte("hidden"),
		"a/.hidden.go":       []byte("hidden"),
		"vendor/z/z.go":      []byte("package z"),
		"vendor/z/.git/h.go": []byte("hidden"),
	})
	c, err := ReadCorpus(dir, CorpusConfig{Ext: ".go", SkipDirs: []string{"testdata"}})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"a.go", "a/b.go", "a/latin1.go", "vendor/z/z.go"}; !reflect.DeepEqual(docNames(c), want) {
		t.Fatalf("documents %v, want %v", docNames(c), want)
	}
	if want := []string{"a/bin.go", "a/mojibake.go"}; !reflect.DeepEqual(c.Skipped, want) {
		t.Fatalf("skipped %v, want %v", c.Skipped, want)
	}
	if string(c.Docs[2].Text) != string(latin1) || c.Root != dir {
		t.Fatal("documents hold their files' text")
	}
	all, err := ReadCorpus(dir, CorpusConfig{})
	if err != nil || len(all.Docs) != 6 {
		t.Fatalf("no filter: %v %v", err, docNames(all))
	}
	one, err := ReadCorpus(filepath.Join(dir, "a", "b.go"), CorpusConfig{Ext: ".txt"})
	if err != nil || !reflect.DeepEqual(docNames(one), []string{"b.go"}) {
		t.Fatalf("one file (the filter applies to folders only): %v %v", err, docNames(one))
	}
}

func TestReadCorpusBad(t *testing.T) {
	dir := writeFiles(t, map[string][]byte{
		"empty/e.txt":      nil,
		"bin/b.dat":        {1, 2, 0, 3},
		"bin/c.dat":        []byte("\x80\x81\x82 high bytes"),
		"txt/notes.txt":    []byte("text"),
		"nul.txt":          []byte("a\x00b"),
		"zero.txt":         nil,
		"nothing/.keep":    []byte("hidden"),
		"hiddenonly/.x.go": []byte("package x"),
	})
	p := func(n string) string { return filepath.Join(dir, n) }
	cases := []struct {
		name, path string
		cfg        CorpusConfig
		want       error
	}{
		{"missing", p("nope"), CorpusConfig{}, ErrNoDataset},
		{"empty file", p("zero.txt"), CorpusConfig{}, ErrEmptyCorpus},
		{"empty files", p("empty"), CorpusConfig{}, ErrEmptyCorpus},
		{"binary file", p("nul.txt"), CorpusConfig{}, ErrBinary},
		{"binary files", p("bin"), CorpusConfig{}, ErrBinary},
		{"no matching files", p("txt"), CorpusConfig{Ext: ".go"}, ErrNoDataset},
		{"only hidden files", p("nothing"), CorpusConfig{}, ErrNoDataset},
		{"only hidden matches", p("hiddenonly"), CorpusConfig{Ext: ".go"}, ErrNoDataset},
	}
	for _, c := range cases {
		_, err := ReadCorpus(c.path, c.cfg)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: err = %v, want %v", c.name, err, c.want)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, c.path) || strings.Contains(msg, "\n") {
			t.Errorf("%s: %q is not one line naming %s", c.name, msg, c.path)
		}
	}
}

func TestCorpusSplit(t *testing.T) {
	files := map[string][]byte{}
	for i := range 40 {
		files[filepath.Join("d", string(rune('a'+i%26)), strings.Repeat("x", 1+i/26)+".txt")] = []byte{'a' + byte(i%26)}
	}
	dir := writeFiles(t, files)
	c, err := ReadCorpus(dir, CorpusConfig{})
	if err != nil {
		t.Fatal(err)
	}
	tr, va, err := c.Split(0.25, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(va.Docs) != 10 || len(tr.Docs) != 30 {
		t.Fatalf("split %d/%d, want 30/10", len(tr.Docs), len(va.Docs))
	}
	seen := map[string]bool{}
	for _, part := range []*Corpus{tr, va} {
		names := docNames(part)
		if !slices.IsSorted(names) {
			t.Fatalf("part not in name order: %v", names)
		}
		for _, n := range names {
			if seen[n] {
				t.Fatalf("%s on both sides", n)
			}
			seen[n] = true
		}
	}
	if len(seen) != 40 {
		t.Fatalf("split covers %d of 40 documents", len(seen))
	}

	// The same seed gives the same split, also for the same files under
	// another root read in another order.
	other := writeFiles(t, files)
	c2, _ := ReadCorpus(other, CorpusConfig{})
	for i, j := 0, len(c2.Docs)-1; i < j; i, j = i+1, j-1 {
		c2.Docs[i], c2.Docs[j] = c2.Docs[j], c2.Docs[i]
	}
	_, va2, _ := c2.Split(0.25, 3)
	if got := slices.Sorted(slices.Values(docNames(va2))); !reflect.DeepEqual(got, docNames(va)) {
		t.Fatalf("same seed, other root and order: %v, want %v", got, docNames(va))
	}
	_, va3, _ := c.Split(0.25, 4)
	if reflect.DeepEqual(docNames(va3), docNames(va)) {
		t.Fatal("seeds 3 and 4 hold out the same documents")
	}
	if tr0, va0, err := c.Split(0, 3); err != nil || len(va0.Docs) != 0 || len(tr0.Docs) != 40 {
		t.Fatalf("fraction 0: %v", err)
	}
	if _, va1, err := c.Split(0.001, 3); err != nil || len(va1.Docs) != 1 {
		t.Fatalf("a small fraction holds out one document: %v", err)
	}
	for _, f := range []float64{-0.1, 1, 0.99} {
		if _, _, err := c.Split(f, 3); !errors.Is(err, ErrPartition) {
			t.Errorf("fraction %v: err = %v, want ErrPartition", f, err)
		}
	}
}

func TestGoSourceMissing(t *testing.T) {
	_, err := goSourceIn([]string{t.TempDir(), ""})
	if !errors.Is(err, ErrNoDataset) || !strings.Contains(err.Error(), "pass a text file or a folder") {
		t.Fatalf("err = %v, want ErrNoDataset saying what to pass", err)
	}
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "src", "runtime"), 0o755); err != nil {
		t.Fatal(err)
	}
	if src, err := goSourceIn([]string{"", root}); err != nil || src != filepath.Join(root, "src") {
		t.Fatalf("src = %q, %v", src, err)
	}
}

func TestReadGoSource(t *testing.T) {
	if testing.Short() {
		t.Skip("reads the Go standard library")
	}
	c, err := ReadGoSource()
	if errors.Is(err, ErrNoDataset) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Docs) < 1000 {
		t.Fatalf("only %d documents", len(c.Docs))
	}
	for _, d := range c.Docs {
		if !strings.HasSuffix(d.Name, ".go") || strings.Contains("/"+d.Name, "/testdata/") {
			t.Fatalf("document %s", d.Name)
		}
	}
}
