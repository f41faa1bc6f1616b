package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/starling-ml/starling/aggregate"
	"github.com/starling-ml/starling/nn"
	"github.com/starling-ml/starling/train"
	"github.com/starling-ml/starling/workload"
)

func TestTrainWritesSummary(t *testing.T) {
	dir := t.TempDir()
	js := filepath.Join(dir, "sum.json")
	w := filepath.Join(dir, "w.safetensors")
	var out, errb bytes.Buffer
	err := run(context.Background(), []string{"train", "--model", "logreg", "--epochs", "1", "--limit", "3000", "--json", js, "--save", w}, &out, &errb)
	if err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	if !strings.Contains(out.String(), "test accuracy") {
		t.Fatalf("stdout: %q", out.String())
	}
	b, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	var sum map[string]any
	if err := json.Unmarshal(b, &sum); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"test_accuracy", "train_loss", "epochs", "steps", "samples_per_sec", "wall_s"} {
		if _, ok := sum[k]; !ok {
			t.Errorf("summary lacks %q: %s", k, b)
		}
	}
	if acc := sum["test_accuracy"].(float64); acc < 0.8 {
		t.Errorf("logreg on 3000 samples: test accuracy %v", acc)
	}
	if st, err := os.Stat(w); err != nil || st.Size() < 7850*4 {
		t.Errorf("weights file: %v", err)
	}
}

func TestTrainBadInput(t *testing.T) {
	cases := map[string][]string{
		"unknown flag":  {"train", "--bogus"},
		"bad model":     {"train", "--model", "resnet", "--limit", "10"},
		"zero epochs":   {"train", "--epochs", "0"},
		"missing data":  {"train", "--data", "/nonexistent"},
		"bad optimizer": {"train", "--optimizer", "lbfgs", "--limit", "10"},
		"extra args":    {"train", "now"},
	}
	for name, args := range cases {
		var out, errb bytes.Buffer
		if err := run(context.Background(), args, &out, &errb); err == nil {
			t.Errorf("%s: want error", name)
		}
	}
	var out, errb bytes.Buffer
	err := run(context.Background(), []string{"train", "--data", t.TempDir()}, &out, &errb)
	if err == nil || !strings.Contains(err.Error(), "go mod download") {
		t.Errorf("missing dataset error must say how to get it: %v", err)
	}
	if err := run(context.Background(), []string{"frobnicate"}, &out, &errb); err == nil {
		t.Error("unknown command: want error")
	}
}

// TestRunFlagsOneDestination: every `peer run` flag lands in one field of
// the options: --compress in Options.Compress (which the sync and async
// modes read), the shared --steps and --eval-every in both modes'
// settings, and --stall-timeout defaults to the all-reduce's default.
func TestRunFlagsOneDestination(t *testing.T) {
	var errb strings.Builder
	fs := newFlagSet("run", &errb)
	build := runFlags(fs, &errb)
	if err := fs.Parse([]string{"--mode", "sync", "--compress", "fp16", "--steps", "7", "--eval-every", "3"}); err != nil {
		t.Fatal(err)
	}
	o, err := build()
	if err != nil {
		t.Fatal(err)
	}
	if o.Compress.String() != "fp16" || !o.Swarm.Aggregate.Compress.IsZero() || o.Async.Async.Codec.String() != train.DefaultAsyncConfig().Codec.String() {
		t.Errorf("--compress: Options.Compress %q, aggregate %q, async %q", o.Compress, o.Swarm.Aggregate.Compress, o.Async.Async.Codec)
	}
	if o.Sync.Sync.Steps != 7 || o.Async.Steps != 7 || o.Sync.EvalEvery != 3 || o.Async.EvalEvery != 3 {
		t.Errorf("--steps/--eval-every: sync %d/%d, async %d/%d", o.Sync.Sync.Steps, o.Sync.EvalEvery, o.Async.Steps, o.Async.EvalEvery)
	}
	if d := aggregate.DefaultConfig().StallTimeout; o.Swarm.Aggregate.StallTimeout != d {
		t.Errorf("--stall-timeout defaults to %v, want the all-reduce's %v", o.Swarm.Aggregate.StallTimeout, d)
	}
}

// tinyLM is a charlm that trains a few steps in milliseconds.
const tinyLM = "charlm:layers=1,width=16,heads=2,ctx=16"

// textCorpus writes a small text corpus of three files.
func textCorpus(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for i := range 3 {
		var b strings.Builder
		for j := range 60 {
			fmt.Fprintf(&b, "the quick brown fox %d jumps over the lazy dog %d\n", i, j)
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%d.txt", i)), []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// runPeer runs peer with args and returns stdout and stderr.
func runPeer(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var out, errb bytes.Buffer
	err := run(context.Background(), args, &out, &errb)
	return out.String(), errb.String(), err
}

// readSummary reads a JSON summary.
func readTrainJSON(t *testing.T, path string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var sum map[string]any
	if err := json.Unmarshal(b, &sum); err != nil {
		t.Fatal(err)
	}
	return sum
}

// readWeights reads a safetensors file's tensors by name.
func readWeights(t *testing.T, path string) map[string][]float32 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ts, _, err := nn.ReadSafetensors(f, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]float32{}
	for _, x := range ts {
		out[x.Name] = x.Data
	}
	return out
}

func TestTrainCharLM(t *testing.T) {
	dir, corpus := t.TempDir(), textCorpus(t)
	js := filepath.Join(dir, "sum.json")
	out, errOut, err := runPeer(t, "train", "--model", tinyLM, "--data", corpus, "--steps", "6", "--eval-every", "3", "--json", js)
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut)
	}
	if !strings.Contains(out, "bits/char") || !strings.Contains(errOut, "step 3  train loss") || !strings.Contains(errOut, "tokens/s") {
		t.Errorf("stdout %q\nstderr %q", out, errOut)
	}
	sum := readTrainJSON(t, js)
	bpc, ok := sum["val_bits_per_char"].(float64)
	// A uniform guess over the corpus's 30-odd bytes is about 5 bits.
	if !ok || !(bpc > 1 && bpc < 6.5) {
		t.Errorf("val_bits_per_char %v in %v", sum["val_bits_per_char"], sum)
	}
	if curve, _ := sum["curve"].([]any); len(curve) < 3 {
		t.Errorf("curve %v: want evaluations at steps 3 and 6 and the end", sum["curve"])
	}
	// The charlm's tuning, where no flag says otherwise.
	if sum["steps"].(float64) != 6 || sum["batch"].(float64) != 32 || !strings.HasPrefix(sum["optimizer"].(string), "adamw") ||
		!strings.HasPrefix(sum["model_id"].(string), "charlm-") || sum["data"] != corpus {
		t.Errorf("summary %v", sum)
	}
}

// TestTrainTuning: charlm's settings come from its workload.Tuning unless a
// flag sets them; the image models keep peer train's defaults.
func TestTrainTuning(t *testing.T) {
	parse := func(args ...string) trainOptions {
		t.Helper()
		fs := newFlagSet("train", io.Discard)
		read := trainFlags(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		o, err := read()
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	tu := workload.CharLMTuning
	c := parse("--model", "charlm", "--lr", "0.01", "--batch", "8", "--duration", "2m").Local
	if c.LR != 0.01 || c.Batch != 8 || c.Duration != 2*time.Minute ||
		c.Optimizer != tu.Optimizer || c.Schedule != tu.Schedule || c.WeightDecay != tu.WeightDecay || c.ClipNorm != tu.ClipNorm ||
		c.Epochs != 0 || c.EvalEvery != tu.EvalEvery || c.EvalSamples != tu.EvalSamples {
		t.Errorf("charlm with --lr, --batch, --duration: %+v", c)
	}
	// A flag set to its default value still wins.
	if c := parse("--model", tinyLM, "--optimizer", "momentum", "--epochs", "5").Local; c.Optimizer != "momentum" || c.Epochs != 5 || c.Duration != tu.Duration {
		t.Errorf("charlm with --optimizer momentum --epochs 5: %+v", c)
	}
	// With the duration turned off nothing bounds charlm's run.
	fs := newFlagSet("train", io.Discard)
	read := trainFlags(fs)
	if err := fs.Parse([]string{"--model", "charlm", "--duration", "0"}); err != nil {
		t.Fatal(err)
	}
	if _, err := read(); err == nil || !strings.Contains(err.Error(), "unless steps or a duration bound training") {
		t.Errorf("charlm --duration 0: %v", err)
	}
	def := train.DefaultLocalConfig()
	if c := parse("--model", "cnn").Local; c.Epochs != def.Epochs || c.Batch != def.Batch || c.LR != def.LR || c.Optimizer != def.Optimizer || c.Duration != 0 || c.EvalEvery != 0 {
		t.Errorf("cnn: %+v, want the defaults %+v", c, def)
	}
}

// TestTrainSaveInit: --save writes the trained charlm, and --init starts
// another run (of another seed) from it.
func TestTrainSaveInit(t *testing.T) {
	dir, corpus := t.TempDir(), textCorpus(t)
	w1, w2 := filepath.Join(dir, "w1.safetensors"), filepath.Join(dir, "w2.safetensors")
	if _, errOut, err := runPeer(t, "train", "--model", tinyLM, "--data", corpus, "--steps", "3", "--lr", "0.05", "--schedule", "constant", "--save", w1); err != nil {
		t.Fatalf("%v\n%s", err, errOut)
	}
	// A learning rate far below float32's resolution keeps the weights.
	if _, errOut, err := runPeer(t, "train", "--model", tinyLM, "--data", corpus, "--steps", "1", "--lr", "1e-30", "--wd", "0", "--seed", "2", "--init", w1, "--save", w2); err != nil {
		t.Fatalf("%v\n%s", err, errOut)
	}
	a, b := readWeights(t, w1), readWeights(t, w2)
	if len(a) == 0 || len(a) != len(b) {
		t.Fatalf("%d and %d tensors", len(a), len(b))
	}
	for name, x := range a {
		if !slices.Equal(x, b[name]) {
			t.Errorf("%s differs after --init", name)
		}
	}
	if _, ok := a["transformer.wte.weight"]; !ok {
		t.Errorf("no transformer.wte.weight among %d tensors", len(a))
	}

	_, _, err := runPeer(t, "train", "--model", "charlm:layers=1,width=8,heads=2,ctx=16", "--data", corpus, "--steps", "1", "--init", w1)
	if err == nil || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), w1) ||
		!strings.Contains(err.Error(), `"transformer.wte.weight" has shape [`) || !strings.Contains(err.Error(), "the model's is [") {
		t.Errorf("--init of another width: %v", err)
	}
	// Another corpus: a vocabulary of another size, then of the same.
	other := filepath.Join(dir, "other.txt")
	if err := os.WriteFile(other, []byte(strings.Repeat("0123456789 abc\n", 80)), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err = runPeer(t, "train", "--model", tinyLM, "--data", other, "--steps", "1", "--init", w1)
	if err == nil || !strings.Contains(err.Error(), `"transformer.wte.weight" has shape [`) {
		t.Errorf("--init from another corpus: %v", err)
	}
	w3 := filepath.Join(dir, "w3.safetensors")
	if _, errOut, err := runPeer(t, "train", "--model", tinyLM, "--data", other, "--steps", "1", "--save", w3); err != nil {
		t.Fatalf("%v\n%s", err, errOut)
	}
	shifted := filepath.Join(dir, "shifted.txt")
	if err := os.WriteFile(shifted, []byte(strings.Repeat("123456789: abc\n", 80)), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err = runPeer(t, "train", "--model", tinyLM, "--data", shifted, "--steps", "1", "--init", w3)
	if err == nil || !strings.Contains(err.Error(), "trained on a byte vocabulary of 16 tokens") {
		t.Errorf("--init with another vocabulary of the same size: %v", err)
	}
	_, _, err = runPeer(t, "train", "--model", tinyLM, "--data", corpus, "--init", filepath.Join(dir, "none.safetensors"))
	if err == nil || !strings.Contains(err.Error(), "none.safetensors") {
		t.Errorf("--init of a missing file: %v", err)
	}
}

func TestTrainBadTextAndDevice(t *testing.T) {
	dir := t.TempDir()
	empty, binary := filepath.Join(dir, "empty.txt"), filepath.Join(dir, "model.bin")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(binary, []byte("PK\x03\x04\x00\x00"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"--data", empty}, []string{empty, "empty"}},
		{[]string{"--data", binary}, []string{binary, "binary", "NUL byte"}},
		{[]string{"--device", "tpu"}, []string{`"tpu"`, "cpu", "gonum"}},
		{[]string{"--precision", "fp16"}, []string{"--precision", `"fp16"`, "bf16"}},
		{[]string{"--model", "charlm:width=10,heads=3"}, []string{"3 heads do not divide width 10"}},
		{[]string{"--optimizer", "lbfgs"}, []string{"lbfgs"}},
		{[]string{"--schedule", "sawtooth"}, []string{"sawtooth"}},
	} {
		args := append([]string{"train", "--model", tinyLM, "--steps", "1"}, c.args...)
		_, _, err := runPeer(t, args...)
		if err == nil || strings.Contains(err.Error(), "\n") {
			t.Errorf("%q: %v, want a one-line error", c.args, err)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%q: %v does not mention %q", c.args, err, w)
			}
		}
	}
}

// TestTrainBF16: --precision bf16 trains (a logistic regression on 3000
// samples reaches 80 %) and the summary records the precision and the
// peak memory.
func TestTrainBF16(t *testing.T) {
	js := filepath.Join(t.TempDir(), "sum.json")
	out, _, err := runPeer(t, "train", "--model", "logreg", "--epochs", "1", "--limit", "3000", "--precision", "bf16", "--json", js)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "bf16") {
		t.Errorf("stdout does not name the precision: %q", out)
	}
	b, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	var sum struct {
		Acc       float64 `json:"test_accuracy"`
		Precision string  `json:"precision"`
		PeakRSSMB float64 `json:"peak_rss_mb"`
	}
	if err := json.Unmarshal(b, &sum); err != nil {
		t.Fatal(err)
	}
	if sum.Precision != "bf16" || sum.Acc < 0.8 || (runtime.GOOS == "linux" && sum.PeakRSSMB <= 0) {
		t.Errorf("summary %s", b)
	}
}
