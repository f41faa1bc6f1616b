package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
