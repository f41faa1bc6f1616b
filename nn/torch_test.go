package nn

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// torchPython returns a python3 that can import torch, or skips the test
// naming what is missing. Debian's python3-torch installs for
// /usr/bin/python3, which a pyenv python3 earlier on PATH hides.
func torchPython(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("starts python3 with torch")
	}
	pythonOnce.Do(func() {
		var why []string
		for _, py := range []string{"python3", "/usr/bin/python3"} {
			out, err := exec.Command(py, "-c", "import torch").CombinedOutput()
			if err == nil {
				pythonPath = py
				return
			}
			msg := err.Error() // no such program
			if out := strings.TrimSpace(string(out)); out != "" {
				msg = out[strings.LastIndex(out, "\n")+1:] // ModuleNotFoundError: No module named 'torch'
			}
			why = append(why, py+": "+msg)
		}
		pythonMissing = "no python3 can import torch (" + strings.Join(why, "; ") + "); on Debian: apt-get install python3-torch python3-numpy"
	})
	if pythonPath == "" {
		t.Skip(pythonMissing)
	}
	return pythonPath
}

var (
	pythonOnce    sync.Once
	pythonPath    string
	pythonMissing string
)

// torchJob is one model for testdata/torch_check.py: the torch twin to
// build (Model, whose "kind" is charlm, mlp or cnn), the weights Starling
// saved, and a batch of n samples.
type torchJob struct {
	Name    string         `json:"name"`
	Model   map[string]any `json:"model"`
	Weights string         `json:"weights"`
	N       int            `json:"n"`
	X       []float32      `json:"x"`
	Y       []int32        `json:"y"`

	m *Model // what Starling runs the batch through
}

type torchResult struct {
	Logits []float64
	Loss   float64
}

// runTorch runs the jobs in one python3 (torch takes seconds to import).
func runTorch(t *testing.T, python string, jobs []torchJob) map[string]torchResult {
	t.Helper()
	req, err := json.Marshal(map[string]any{"jobs": jobs})
	if err != nil {
		t.Fatal(err)
	}
	// go test caches a result by the files the test itself opens; the
	// scripts are python's, so name them here.
	for _, f := range []string{"torch_check.py", "chargpt.py", "classifiers.py"} {
		if _, err := os.Stat(filepath.Join("testdata", f)); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(python, filepath.Join("testdata", "torch_check.py"))
	cmd.Stdin = bytes.NewReader(req)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("torch_check.py: %v\n%s", err, stderr.Bytes())
	}
	var got map[string]torchResult
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	return got
}

// TestTorchParity exports Starling models (SaveFile, SaveParams), loads
// them strictly into their torch twins (testdata/chargpt.py,
// testdata/classifiers.py: every name and shape must match) and compares
// torch's logits and loss on a fixed batch with Starling's: the MLP, the
// FedAvg CNN on MNIST's shape and on 3-channel non-square images (which
// would show a channels-last layout leaking into the weights or the
// Flatten order), the CharLM, and models whose parameters were set from a
// state vector as a strategy sets them. It needs a python3 with torch
// (Debian's python3-torch) and skips without.
func TestTorchParity(t *testing.T) {
	python := torchPython(t)
	dir := t.TempDir()
	r := rand.New(rand.NewPCG(23, 1))
	var jobs []torchJob
	add := func(name string, m *Model, kind map[string]any, n int, x []float32) {
		path := filepath.Join(dir, name+".safetensors")
		if err := m.SaveFile(path); err != nil {
			t.Fatal(err)
		}
		jobs = append(jobs, torchJob{Name: name, Model: kind, Weights: path, N: n, X: x, Y: randTargets(r, m, n), m: m})
	}
	uniform := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = r.Float32()
		}
		return x
	}

	mlp, _ := New("mlp", 1)
	add("mlp", mlp, map[string]any{"kind": "mlp", "widths": []int{784, 200, 200, 10}}, 4, uniform(4*784))
	cnn, _ := New("cnn", 1)
	add("cnn", cnn, map[string]any{"kind": "cnn", "h": 28, "w": 28, "c": 1, "classes": 10}, 3, uniform(3*784))
	rgb, err := NewCNN(12, 8, 3, 5, 1)
	if err != nil {
		t.Fatal(err)
	}
	add("cnn-rgb", rgb, map[string]any{"kind": "cnn", "h": 12, "w": 8, "c": 3, "classes": 5}, 3, randInput(r, 3*12*8*3))

	cfg := CharLMConfig{Vocab: 11, Context: 6, Dim: 8, Heads: 2, Layers: 2, MLPRatio: 2}
	gpt := map[string]any{
		"kind": "charlm", "vocab_size": cfg.Vocab, "block_size": cfg.Context, "n_embd": cfg.Dim,
		"n_head": cfg.Heads, "n_layer": cfg.Layers, "mlp_ratio": cfg.MLPRatio,
	}
	lm, err := NewCharLM(cfg, 5)
	if err != nil {
		t.Fatal(err)
	}
	// Move the LayerNorms and biases off their (1, 0) start, so that a
	// misplaced tensor shows.
	for i := range lm.Params {
		lm.Params[i] += float32(r.NormFloat64() * 0.1)
	}
	add("charlm", lm, gpt, 2, randTokens(r, 2*cfg.Context, cfg.Vocab))

	// A strategy's result: a global state vector (the model's parameters,
	// then a server optimiser's state) copied into a fresh model.
	lm2, _ := NewCharLM(cfg, 6)
	state := randInput(r, len(lm2.Params)+17)
	copy(lm2.Params, state)
	add("charlm-state", lm2, gpt, 2, randTokens(r, 2*cfg.Context, cfg.Vocab))
	// The same through SaveParams, from a model that holds other values.
	cnn2, _ := New("cnn", 2)
	vec := randInput(r, len(cnn2.Params))
	for i := range vec {
		vec[i] *= 0.05
	}
	path := filepath.Join(dir, "cnn-params.safetensors")
	if err := cnn2.SaveParams(path, vec); err != nil {
		t.Fatal(err)
	}
	copy(cnn2.Params, vec)
	jobs = append(jobs, torchJob{Name: "cnn-params", Model: jobs[1].Model, Weights: path, N: 2, X: uniform(2 * 784), Y: []int32{3, 7}, m: cnn2})

	got := runTorch(t, python, jobs)
	for _, j := range jobs {
		t.Run(j.Name, func(t *testing.T) {
			g, ok := got[j.Name]
			if !ok {
				t.Fatal("no result from torch")
			}
			want := j.m.Forward(j.X, j.N)
			if len(g.Logits) != len(want) {
				t.Fatalf("torch gave %d logits, Starling %d", len(g.Logits), len(want))
			}
			worst, at := 0.0, 0
			for i, w := range want {
				if d := math.Abs(g.Logits[i] - float64(w)); d > worst {
					worst, at = d, i
				}
			}
			loss, _ := j.m.Evaluate(j.X, j.Y, j.N)
			t.Logf("%d logits: max |torch − Starling| %.2e (logit %d: torch %.7f, Starling %.7f); loss torch %.7f, Starling %.7f",
				len(want), worst, at, g.Logits[at], want[at], g.Loss, loss)
			if worst > 1e-4 {
				t.Errorf("logits differ by up to %.2e, want ≤ 1e-4", worst)
			}
			if math.Abs(loss-g.Loss) > 1e-5*(1+loss) {
				t.Errorf("loss: torch %v, Starling %v", g.Loss, loss)
			}
		})
	}
}
