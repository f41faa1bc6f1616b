package data

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"unicode/utf8"
)

// Errors returned by the corpus reader.
var (
	// ErrEmptyCorpus reports a corpus (or a split of one) holding no text.
	ErrEmptyCorpus = errors.New("data: empty corpus")
	// ErrBinary reports a corpus whose every file is binary.
	ErrBinary = errors.New("data: binary file")
)

// maxInvalidUTF8 is the share of bytes that may be invalid UTF-8 before a
// file counts as binary: a stray Latin-1 byte in a comment is tolerated.
const maxInvalidUTF8 = 0.01

// Document is one file of a corpus.
type Document struct {
	// Name is the file's path relative to the corpus root, with forward
	// slashes; a corpus read from one file names it by its base name.
	Name string
	Text []byte
}

// Corpus is a set of text documents in memory, sorted by name.
type Corpus struct {
	// Root is the path the corpus was read from.
	Root string
	// Docs holds the documents sorted by Name; none is empty.
	Docs []Document
	// Skipped names the files left out as binary (see ReadCorpus).
	Skipped []string
}

// Bytes returns the total size of the documents' text.
func (c *Corpus) Bytes() int {
	n := 0
	for _, d := range c.Docs {
		n += len(d.Text)
	}
	return n
}

// CorpusConfig selects the files of a folder that ReadCorpus reads. The
// zero value reads every file.
type CorpusConfig struct {
	// Ext keeps only files whose names end in it, such as ".go"; empty
	// keeps all.
	Ext string
	// SkipDirs names directories left out wherever they occur, such as
	// "testdata".
	SkipDirs []string
}

// ReadCorpus reads a text file (whatever its name), or every file of a
// folder and its subfolders that cfg selects, skipping entries whose names
// start with a dot. A file holding a NUL byte or more than 1% of bytes that are not
// valid UTF-8 is binary: it is skipped and named in Skipped, and an error
// wrapping ErrBinary is returned when nothing else is left. Empty files
// are dropped. Errors name the path and wrap ErrNoDataset (nothing to
// read), ErrBinary or ErrEmptyCorpus.
func ReadCorpus(path string, cfg CorpusConfig) (*Corpus, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoDataset, err)
	}
	c := &Corpus{Root: path}
	if !st.IsDir() {
		text, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrNoDataset, err)
		}
		if why := binaryReason(text); why != "" {
			return nil, fmt.Errorf("%s: %w: %s", path, ErrBinary, why)
		}
		if len(text) == 0 {
			return nil, fmt.Errorf("%s: %w: the file is empty", path, ErrEmptyCorpus)
		}
		c.Docs = []Document{{Name: filepath.Base(path), Text: text}}
		return c, nil
	}
	// Walk the folder a link names, not the link.
	root, err := filepath.EvalSymlinks(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoDataset, err)
	}
	files := 0
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == root {
			return nil
		}
		name := d.Name()
		if strings.HasPrefix(name, ".") || (d.IsDir() && slices.Contains(cfg.SkipDirs, name)) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() || !strings.HasSuffix(name, cfg.Ext) {
			return nil
		}
		if !d.Type().IsRegular() {
			// A link counts when it leads to a regular file.
			if st, err := os.Stat(p); err != nil || !st.Mode().IsRegular() {
				return nil
			}
		}
		files++
		text, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		switch {
		case binaryReason(text) != "":
			c.Skipped = append(c.Skipped, rel)
		case len(text) > 0:
			c.Docs = append(c.Docs, Document{Name: rel, Text: text})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %w", path, ErrNoDataset, err)
	}
	// WalkDir visits in lexical order of the path, which is not the order
	// of the slash-separated names ("a/b" vs "a.go"): sort by name.
	slices.SortFunc(c.Docs, func(a, b Document) int { return strings.Compare(a.Name, b.Name) })
	switch {
	case files == 0 && cfg.Ext != "":
		return nil, fmt.Errorf("%s: %w: no files ending in %q", path, ErrNoDataset, cfg.Ext)
	case files == 0:
		return nil, fmt.Errorf("%s: %w: no files", path, ErrNoDataset)
	case len(c.Docs) == 0 && len(c.Skipped) > 0:
		return nil, fmt.Errorf("%s: %w: all %d files are binary (NUL bytes or invalid UTF-8), such as %s", path, ErrBinary, len(c.Skipped), c.Skipped[0])
	case len(c.Docs) == 0:
		return nil, fmt.Errorf("%s: %w: all %d files are empty", path, ErrEmptyCorpus, files)
	}
	return c, nil
}

// binaryReason says why text is not text, or returns "" when it is.
func binaryReason(text []byte) string {
	if i := bytes.IndexByte(text, 0); i >= 0 {
		return fmt.Sprintf("NUL byte at offset %d", i)
	}
	if utf8.Valid(text) {
		return ""
	}
	bad := 0
	for b := text; len(b) > 0; {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n == 1 {
			bad++
		}
		b = b[n:]
	}
	if float64(bad) > maxInvalidUTF8*float64(len(text)) {
		return fmt.Sprintf("%d of %d bytes are not valid UTF-8", bad, len(text))
	}
	return ""
}

// Split divides the corpus by document into a training and a validation
// part, holding out round(valFraction·n) of the n documents (at least one
// when valFraction > 0). Each document's side depends only on its name,
// the seed and that count: the documents with the smallest keyed hashes
// of their names are held out. Both parts share the documents' text, keep
// name order and have no Skipped. Errors wrap ErrPartition.
func (c *Corpus) Split(valFraction float64, seed uint64) (train, val *Corpus, err error) {
	n := len(c.Docs)
	if !(valFraction >= 0 && valFraction < 1) {
		return nil, nil, fmt.Errorf("%w: validation fraction %v is not in [0, 1)", ErrPartition, valFraction)
	}
	held := int(math.Round(valFraction * float64(n)))
	if valFraction > 0 {
		held = max(held, 1)
	}
	if held >= n {
		return nil, nil, fmt.Errorf("%w: %s: holding out %v of %d documents leaves none for training", ErrPartition, c.Root, valFraction, n)
	}
	type ranked struct {
		key uint64
		doc int
	}
	order := make([]ranked, n)
	for i, d := range c.Docs {
		order[i] = ranked{splitKey(seed, d.Name), i}
	}
	slices.SortFunc(order, func(a, b ranked) int {
		if a.key != b.key {
			if a.key < b.key {
				return -1
			}
			return 1
		}
		return strings.Compare(c.Docs[a.doc].Name, c.Docs[b.doc].Name)
	})
	isVal := make([]bool, n)
	for _, r := range order[:held] {
		isVal[r.doc] = true
	}
	train, val = &Corpus{Root: c.Root}, &Corpus{Root: c.Root}
	for i, d := range c.Docs {
		if isVal[i] {
			val.Docs = append(val.Docs, d)
		} else {
			train.Docs = append(train.Docs, d)
		}
	}
	return train, val, nil
}

// splitKey hashes a document name under a seed (FNV-1a, then the
// SplitMix64 finaliser so that nearby seeds give unrelated orders).
func splitKey(seed uint64, name string) uint64 {
	h := fnv.New64a()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], seed)
	h.Write(b[:])
	h.Write([]byte(name))
	z := h.Sum64()
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// FindGoSource returns the src folder of the Go installation: GOROOT as
// `go env GOROOT` reports it, else as the running binary was built with.
func FindGoSource() (string, error) {
	var roots []string
	if out, err := exec.Command("go", "env", "GOROOT").Output(); err == nil {
		roots = append(roots, strings.TrimSpace(string(out)))
	}
	// runtime.GOROOT is deprecated (a build-time path may not exist on this
	// machine), but it is the one hint left when no go command is on PATH.
	roots = append(roots, runtime.GOROOT())
	return goSourceIn(roots)
}

func goSourceIn(roots []string) (string, error) {
	var tried []string
	for _, r := range roots {
		src := filepath.Join(r, "src")
		if r == "" || slices.Contains(tried, src) {
			continue
		}
		tried = append(tried, src)
		if st, err := os.Stat(filepath.Join(src, "runtime")); err == nil && st.IsDir() {
			return src, nil
		}
	}
	where := "GOROOT is unknown: no go command on PATH and none built in"
	if len(tried) > 0 {
		where = "looked in " + strings.Join(tried, ", ")
	}
	return "", fmt.Errorf("%w: no Go standard library sources (%s); pass a text file or a folder of text files as the corpus instead", ErrNoDataset, where)
}

// ReadGoSource reads the default corpus for the language-model workload:
// the .go files of the Go standard library (FindGoSource), without
// testdata directories.
func ReadGoSource() (*Corpus, error) {
	src, err := FindGoSource()
	if err != nil {
		return nil, err
	}
	return ReadCorpus(src, CorpusConfig{Ext: ".go", SkipDirs: []string{"testdata"}})
}
