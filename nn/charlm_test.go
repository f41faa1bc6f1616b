package nn

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"

	"github.com/starling-ml/starling/device"
)

// tinyCharLM is a CharLM small enough for finite differences.
func tinyCharLM(t *testing.T, dropout float32) *Model {
	t.Helper()
	m, err := NewCharLM(CharLMConfig{Vocab: 11, Context: 6, Dim: 8, Heads: 2, Layers: 2, MLPRatio: 2, Dropout: dropout}, 5)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestGradCharLM(t *testing.T) {
	for _, p := range []float32{0, 0.2} {
		t.Run(fmt.Sprint("dropout=", p), func(t *testing.T) {
			m := tinyCharLM(t, p)
			r := rand.New(rand.NewPCG(20, 1))
			n := 3
			gradCheckXY(t, m, randTokens(r, n*6, 11), randTargets(r, m, n), 12, r)
		})
	}
}

// TestCharLMNames pins the state-dict names and shapes of minGPT's GPT
// (testdata/chargpt.py).
func TestCharLMNames(t *testing.T) {
	m := tinyCharLM(t, 0.1)
	var names []string
	for _, v := range m.Views() {
		if strings.HasPrefix(v.Name, "transformer.h.1.") {
			continue
		}
		names = append(names, fmt.Sprintf("%s%v", v.Name, v.Shape))
	}
	want := []string{
		"transformer.wte.weight[11 8]", "transformer.wpe.weight[6 8]",
		"transformer.h.0.ln_1.weight[8]", "transformer.h.0.ln_1.bias[8]",
		"transformer.h.0.attn.c_attn.weight[24 8]", "transformer.h.0.attn.c_attn.bias[24]",
		"transformer.h.0.attn.c_proj.weight[8 8]", "transformer.h.0.attn.c_proj.bias[8]",
		"transformer.h.0.ln_2.weight[8]", "transformer.h.0.ln_2.bias[8]",
		"transformer.h.0.mlp.c_fc.weight[16 8]", "transformer.h.0.mlp.c_fc.bias[16]",
		"transformer.h.0.mlp.c_proj.weight[8 16]", "transformer.h.0.mlp.c_proj.bias[8]",
		"transformer.ln_f.weight[8]", "transformer.ln_f.bias[8]",
		"lm_head.weight[11 8]",
	}
	if got := strings.Join(names, " "); got != strings.Join(want, " ") {
		t.Fatalf("names\n%s\nwant\n%s", got, strings.Join(want, " "))
	}
	if len(m.Views()) != len(want)+12 {
		t.Fatalf("%d tensors, want %d", len(m.Views()), len(want)+12)
	}
	ln := m.Param(m.Views()[2])
	if ln[0] != 1 || m.Param(m.Views()[3])[0] != 0 || m.Param(m.Views()[5])[0] != 0 {
		t.Fatal("LayerNorm must start at (1, 0) and biases at 0")
	}
}

func TestCharLMDefault(t *testing.T) {
	cfg := DefaultCharLMConfig()
	m, err := NewCharLM(cfg, 1)
	if err != nil {
		t.Fatal(err)
	}
	d, v, c, l := cfg.Dim, cfg.Vocab, cfg.Context, cfg.Layers
	block := 4*d + (3*d*d + 3*d) + (d*d + d) + (4*d*d + 4*d) + (4*d*d + d)
	want := v*d + c*d + l*block + 2*d + d*v
	if len(m.Params) != want {
		t.Fatalf("%d parameters, want %d", len(m.Params), want)
	}
	if m.Arch != "charlm:v65-t128-d128-h4-l4-r4-p0" || fmt.Sprint(m.Input, m.Output) != "[128] [128 65]" {
		t.Fatalf("arch %s, input %v, output %v", m.Arch, m.Input, m.Output)
	}
	for _, bad := range []CharLMConfig{{}, {Vocab: 5, Context: 4, Dim: 6, Heads: 4, Layers: 1, MLPRatio: 1}, {Vocab: 5, Context: 4, Dim: 8, Heads: 2, Layers: 1, MLPRatio: 1, Dropout: 1}} {
		if _, err := NewCharLM(bad, 1); !errors.Is(err, ErrArch) {
			t.Errorf("%+v: err = %v, want ErrArch", bad, err)
		}
	}
}

// TestCausal: the logits at position i do not depend on tokens after i.
func TestCausal(t *testing.T) {
	m := tinyCharLM(t, 0)
	x := []float32{1, 2, 3, 4, 5, 6}
	before := append([]float32(nil), m.Forward(x, 1)...)
	x[4] = 9
	after := m.Forward(x, 1)
	for i := range before {
		pos := i / m.Classes
		if changed := before[i] != after[i]; changed != (pos >= 4) {
			t.Fatalf("logit %d (position %d) changed = %v after editing position 4", i, pos, changed)
		}
	}
}

// TestCharLMLearns: a few Adam steps on one batch lower the loss.
func TestCharLMLearns(t *testing.T) {
	m := tinyCharLM(t, 0.1)
	r := rand.New(rand.NewPCG(21, 1))
	x := randTokens(r, 8*6, 11)
	y := make([]int32, len(x))
	for i := range y {
		y[i] = int32(x[i]+1) % 11 // predict the next id: learnable per position
	}
	opt := NewAdam(AdamConfig{}, WithBackend(m.Backend()))
	first, _ := m.ForwardBackward(x, y)
	for i := 0; i < 150; i++ {
		opt.Step(m.Params, m.Grads, 1e-2)
		m.ForwardBackward(x, y)
	}
	last, acc := m.Evaluate(x, y, 3)
	if !(last < first/4) || acc < 0.9 {
		t.Fatalf("loss %v → %v, accuracy %v", first, last, acc)
	}
}

func TestBadTokenPanics(t *testing.T) {
	m := tinyCharLM(t, 0)
	for _, bad := range []float32{11, -1, 2.5} {
		func() {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "token id") {
					t.Errorf("token %v: panic %v, want a token id message", bad, r)
				}
			}()
			m.Forward([]float32{1, 2, bad, 3, 4, 5}, 1)
		}()
	}
}

// TestCharLMStepAllocs: a training step allocates nothing but the
// arguments of the goroutines a split GEMM or GELU starts (one small object
// per split call, some 150 a step at batch 8): far below one buffer of any
// layer (a [T, Dim] activation of one sample is 64 KiB). It runs on the
// Fast backend (portable Go kernels with -tags purego): gonum's Sgemm,
// which the CPU backend calls, allocates on its own.
func TestCharLMStepAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("a few training steps of a 0.8 M-parameter model")
	}
	cfg := DefaultCharLMConfig()
	cfg.Dropout = 0.1
	m, err := NewCharLM(cfg, 1, WithBackend(device.NewFast()))
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(22, 1))
	n := 8
	x := randTokens(r, n*cfg.Context, cfg.Vocab)
	y := randTargets(r, m, n)
	opt := NewAdam(AdamConfig{}, WithBackend(m.Backend()))
	step := func() { m.ForwardBackward(x, y); opt.Step(m.Params, m.Grads, 1e-3) }
	step()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	const steps = 3
	for range steps {
		step()
	}
	runtime.ReadMemStats(&after)
	perStep := (after.TotalAlloc - before.TotalAlloc) / steps
	objects := (after.Mallocs - before.Mallocs) / steps
	t.Logf("%d B in %d objects per step", perStep, objects)
	if perStep > 16<<10 || objects > 400 {
		t.Fatalf("%d B in %d objects per step", perStep, objects)
	}
}
