package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/starling-ml/starling/aggregate"
	"github.com/starling-ml/starling/train"
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
