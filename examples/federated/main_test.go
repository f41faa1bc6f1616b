package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSmallFederation runs the example end to end at a small scale: 10
// clients with pathological non-IID shards, a few rounds.
func TestSmallFederation(t *testing.T) {
	js := filepath.Join(t.TempDir(), "out.json")
	var out, errb strings.Builder
	err := run(context.Background(), []string{"--clients", "10", "--fraction", "0.3", "--rounds", "4", "--partition", "shards",
		"--target", "0.5", "--json", js}, &out, &errb)
	if err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	b, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		RoundsToTarget int     `json:"rounds_to_target"`
		FinalAccuracy  float64 `json:"final_accuracy"`
	}
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	if res.FinalAccuracy <= 0.2 || res.RoundsToTarget > 4 {
		t.Fatalf("result %+v\n%s%s", res, out.String(), errb.String())
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{{"--partition", "zipf"}, {"--strategy", "fedmagic"}, {"--fraction", "0"}, {"--nonsense"}} {
		var out, errb strings.Builder
		if err := run(context.Background(), append(args, "--rounds", "1"), &out, &errb); err == nil {
			t.Errorf("%v: want error", args)
		}
	}
}
