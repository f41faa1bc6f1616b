package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/starling-ml/starling/data"
)

// TestSmallTable runs the command end to end at a small scale: 2 peers, a
// logistic regression, one epoch, two codecs.
func TestSmallTable(t *testing.T) {
	if _, _, err := data.LoadMNIST(""); errors.Is(err, data.ErrNoDataset) {
		t.Skip(err)
	}
	if testing.Short() {
		t.Skip("trains on all of MNIST for an epoch")
	}
	js := filepath.Join(t.TempDir(), "out.json")
	var out, errb strings.Builder
	err := run(context.Background(), []string{"--peers", "2", "--model", "logreg", "--epochs", "1", "--batch", "256",
		"--codecs", "fp32; fp16", "--json", js}, &out, &errb)
	if err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	b, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Rows []struct {
			Codec         string  `json:"codec"`
			FinalAccuracy float64 `json:"final_accuracy"`
			Ratio         float64 `json:"ratio"`
		} `json:"rows"`
	}
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != 2 || res.Rows[1].Codec != "fp16" || res.Rows[1].FinalAccuracy < 0.85 || res.Rows[1].Ratio < 1.9 {
		t.Fatalf("result %+v\n%s%s", res, out.String(), errb.String())
	}
	if !strings.Contains(out.String(), "fp16") {
		t.Fatalf("table:\n%s", out.String())
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{{"--codecs", "zip"}, {"--algo", "ring"}, {"--peers", "0"}, {"--repeat", "0"}, {"--nonsense"}} {
		var out, errb strings.Builder
		if err := run(context.Background(), args, &out, &errb); err == nil {
			t.Errorf("%v: want error", args)
		}
	}
}
