package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/starling-ml/starling/internal/cli"
	"github.com/starling-ml/starling/internal/peerrun"
	"github.com/starling-ml/starling/nn"
	"github.com/starling-ml/starling/train"
	"github.com/starling-ml/starling/workload"
)

// runOptions parses `peer run` flags, layered over env, into Options.
func runOptions(t *testing.T, env map[string]string, args ...string) (peerrun.Options, error) {
	t.Helper()
	var errb strings.Builder
	fs := newFlagSet("run", &errb)
	build := runFlags(fs, &errb)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	if err := cli.Layer(fs, "", func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	return build()
}

// TestRunTuning: the language model's Tuning fills in every setting no
// flag, variable or config file set; the image models keep the flags'
// defaults; DiLoCo keeps its own H.
func TestRunTuning(t *testing.T) {
	tu := workload.CharLMTuning
	def := train.DefaultWorkerConfig()
	cases := []struct {
		name        string
		env         map[string]string
		args        []string
		opt         string
		lr          float32
		batch       int
		localSteps  int
		localEpochs int
		schedule    string
	}{
		{"mnist", nil, nil, def.Optimizer, def.LR, def.Batch, 0, 1, "constant"},
		{"charlm", nil, []string{"--model", "charlm"}, tu.Optimizer, tu.LR, tu.Batch, tu.LocalSteps, 0, tu.Schedule},
		{"charlm explicit", map[string]string{"STARLING_BATCH": "4"}, []string{"--model", "charlm:width=64", "--lr", "0.01", "--optimizer", "sgd"},
			"sgd", 0.01, 4, tu.LocalSteps, 0, tu.Schedule},
		{"charlm schedule", nil, []string{"--model", "charlm", "--schedule", "cosine"}, tu.Optimizer, tu.LR, tu.Batch, tu.LocalSteps, 0, "cosine"},
		{"charlm epochs", nil, []string{"--model", "charlm", "--local-epochs", "2"}, tu.Optimizer, tu.LR, tu.Batch, 0, 2, tu.Schedule},
		{"charlm diloco", nil, []string{"--model", "charlm", "--strategy", "diloco:h=7"}, tu.Optimizer, tu.LR, tu.Batch, 7, 0, tu.Schedule},
	}
	for _, c := range cases {
		o, err := runOptions(t, c.env, c.args...)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		w := o.Worker
		if w.Optimizer != c.opt || w.LR != c.lr || w.Batch != c.batch || w.Schedule != c.schedule {
			t.Errorf("%s: optimizer %s lr %v batch %d schedule %s, want %s %v %d %s", c.name, w.Optimizer, w.LR, w.Batch, w.Schedule, c.opt, c.lr, c.batch, c.schedule)
		}
		if o.Fed.LocalSteps != c.localSteps || o.Fed.LocalEpochs != c.localEpochs {
			t.Errorf("%s: local steps %d epochs %d, want %d %d", c.name, o.Fed.LocalSteps, o.Fed.LocalEpochs, c.localSteps, c.localEpochs)
		}
	}
	if o, _ := runOptions(t, nil, "--model", "charlm"); o.Worker.WeightDecay != tu.WeightDecay || o.Worker.ClipNorm != tu.ClipNorm {
		t.Errorf("charlm: weight decay %v clip %v, want %v %v", o.Worker.WeightDecay, o.Worker.ClipNorm, tu.WeightDecay, tu.ClipNorm)
	}
}

// TestRunDevice: --device names a backend, which reaches the options; an
// unknown name is a one-line error.
func TestRunDevice(t *testing.T) {
	o, err := runOptions(t, nil, "--device", "gonum")
	if err != nil || o.Backend == nil || o.Backend.Name() != "cpu/gonum" {
		t.Fatalf("--device gonum: %v, backend %v", err, o.Backend)
	}
	if o, err = runOptions(t, nil, "--precision", "bf16"); err != nil || o.Precision != nn.BF16 {
		t.Fatalf("--precision bf16: %v, %v", err, o.Precision)
	}
	if _, err = runOptions(t, nil, "--precision", "int8"); err == nil || !strings.Contains(err.Error(), `--precision: nn: unknown precision "int8"`) {
		t.Fatalf("--precision int8: %v", err)
	}
	_, err = runOptions(t, nil, "--device", "tpu")
	if err == nil || !strings.Contains(err.Error(), `--device: device: unknown backend "tpu"`) || strings.Contains(err.Error(), "\n") {
		t.Fatalf("--device tpu: %v", err)
	}
}

// TestRunCharLMBadInput: bad input to a charlm run is a one-line error
// that names the problem, given before the peer joins a swarm.
func TestRunCharLMBadInput(t *testing.T) {
	dir := t.TempDir()
	corpus := tinyCorpus(t)
	narrow, err := workload.Load(workload.Config{Model: "charlm:layers=1,width=8,heads=2,ctx=16", Data: corpus})
	if err != nil {
		t.Fatal(err)
	}
	m, err := narrow.NewModel(1)
	if err != nil {
		t.Fatal(err)
	}
	weights := filepath.Join(dir, "narrow.safetensors")
	if err := m.SaveFile(weights); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty.txt")
	os.WriteFile(empty, nil, 0o644)
	base := []string{"run", "--model", tinyCharLM, "--data", corpus, "--min-peers", "1", "--mdns=false", "--listen", "/ip4/127.0.0.1/tcp/0"}
	cases := map[string]struct {
		args []string
		want string
	}{
		"label partition":  {[]string{"--partition", "shards"}, "--partition shards splits by label"},
		"init shape":       {[]string{"--init", weights}, `tensor "transformer.wte.weight" has shape`},
		"init missing":     {[]string{"--init", filepath.Join(dir, "none.safetensors")}, "--init: open"},
		"init not weights": {[]string{"--init", corpus}, "is it a weights file"},
		"empty corpus":     {[]string{"--data", empty}, "empty"},
		"bad spec":         {[]string{"--model", "charlm:width=0"}, "width"},
		"unknown device":   {[]string{"--device", "tpu"}, "unknown backend"},
	}
	for name, c := range cases {
		var out, errb strings.Builder
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := run(ctx, append(slices.Clone(base), c.args...), &out, &errb)
		cancel()
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(strings.TrimSpace(err.Error()), "\n") {
			t.Errorf("%s: err = %v, want one line mentioning %q", name, err, c.want)
		}
	}
}
