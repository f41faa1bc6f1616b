package nn

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestTorchParity loads a small CharLM's saved weights into the PyTorch
// module of testdata/chargpt.py (strictly: every name and shape must
// match) and compares the logits and the loss. It needs python3 with torch
// (Debian's python3-torch) and skips without.
func TestTorchParity(t *testing.T) {
	if testing.Short() {
		t.Skip("starts python3")
	}
	python := ""
	for _, py := range []string{"python3", "/usr/bin/python3"} { // a pyenv python3 may hide Debian's
		if exec.Command(py, "-c", "import torch").Run() == nil {
			python = py
			break
		}
	}
	if python == "" {
		t.Skip("python3 with torch not found")
	}
	cfg := CharLMConfig{Vocab: 11, Context: 6, Dim: 8, Heads: 2, Layers: 2, MLPRatio: 2}
	m, err := NewCharLM(cfg, 5)
	if err != nil {
		t.Fatal(err)
	}
	// Move the LayerNorms and biases off their (1, 0) start, so that a
	// misplaced tensor shows.
	r := rand.New(rand.NewPCG(23, 1))
	for i := range m.Params {
		m.Params[i] += float32(r.NormFloat64() * 0.1)
	}
	path := filepath.Join(t.TempDir(), "charlm.safetensors")
	if err := m.SaveFile(path); err != nil {
		t.Fatal(err)
	}
	const n = 2
	x := randTokens(r, n*cfg.Context, cfg.Vocab)
	y := randTargets(r, m, n)
	xs, ys := make([][]int, n), make([][]int, n)
	for s := range n {
		for p := range cfg.Context {
			xs[s] = append(xs[s], int(x[s*cfg.Context+p]))
			ys[s] = append(ys[s], int(y[s*cfg.Context+p]))
		}
	}
	req, _ := json.Marshal(map[string]any{
		"weights": path, "x": xs, "y": ys,
		"config": map[string]any{
			"vocab_size": cfg.Vocab, "block_size": cfg.Context, "n_embd": cfg.Dim,
			"n_head": cfg.Heads, "n_layer": cfg.Layers, "mlp_ratio": cfg.MLPRatio,
		},
	})
	cmd := exec.Command(python, filepath.Join("testdata", "chargpt_check.py"))
	cmd.Stdin = bytes.NewReader(req)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("chargpt_check.py: %v\n%s", err, stderr.Bytes())
	}
	var got struct {
		Logits []float64
		Loss   float64
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	want := m.Forward(x, n)
	if len(got.Logits) != len(want) {
		t.Fatalf("torch gave %d logits, Starling %d", len(got.Logits), len(want))
	}
	for i, w := range want {
		if math.Abs(got.Logits[i]-float64(w)) > 1e-4*(1+math.Abs(float64(w))) {
			t.Fatalf("logit %d: torch %v, Starling %v", i, got.Logits[i], w)
		}
	}
	loss, _ := m.Evaluate(x, y, n)
	t.Logf("loss: torch %.7f, Starling %.7f; logit 0: %.7f, %.7f", got.Loss, loss, got.Logits[0], want[0])
	if math.Abs(loss-got.Loss) > 1e-5*(1+loss) {
		t.Fatalf("loss: torch %v, Starling %v", got.Loss, loss)
	}
}
