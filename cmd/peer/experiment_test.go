package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestExperimentComparesRuns(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	err := run(context.Background(), []string{"experiment", "--peers", "2", "--strategy", "fedasync,local",
		"--policy", "const", "--policy", "hinge:10,4", "--slow", "1:2", "--duration", "800ms", "--train-limit", "2000",
		"--test-limit", "500", "--model", "mlp:784-16-10", "--local-steps", "5", "--target", "0.5", "--baseline", "local",
		"--snapshot", "100ms", "--out", dir}, &out, &errb)
	if err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	for _, label := range []string{"fedasync const", "fedasync hinge:10,4", "local"} {
		if !strings.Contains(out.String(), label) {
			t.Errorf("table lacks %q:\n%s", label, out.String())
		}
	}
	f, err := os.Open(filepath.Join(dir, "compare.csv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil || len(rows) != 4 {
		t.Fatalf("compare.csv: %d rows, %v", len(rows), err)
	}
	for _, sub := range []string{"fedasync_const-seed1", "fedasync_hinge_10_4-seed1", "local-seed1"} {
		b, err := os.ReadFile(filepath.Join(dir, sub, "summary.json"))
		if err != nil {
			t.Fatal(err)
		}
		var s map[string]any
		if err := json.Unmarshal(b, &s); err != nil {
			t.Fatal(err)
		}
		if acc, _ := s["final_accuracy"].(float64); acc < 0.5 {
			t.Errorf("%s: final accuracy %v", sub, s["final_accuracy"])
		}
		if _, err := os.Stat(filepath.Join(dir, sub, "accuracy_time.png")); err != nil {
			t.Error(err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "compare.png")); err != nil {
		t.Error(err)
	}
}

func TestExperimentFlagErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--slow", "0"},
		{"--slow", "9:2"},
		{"--bandwidth", "fast"},
		{"--strategy", "nope"},
		{"--policy", "poly:x"},
		{"--kill", "1:soon"},
		{"--repeat", "0"},
		{"--strategy", "fedasync", "--compress", "zip"},
		{"--strategy", "fedbuff", "--codec", "topk:2"},
		{"--quorum", "4"}, // 4 peers by default: 3 others at most
		{"--heartbeat", "-1s"},
		{"extra"},
	} {
		var out, errb bytes.Buffer
		if err := run(context.Background(), append([]string{"experiment"}, args...), &out, &errb); err == nil {
			t.Errorf("%v: accepted", args)
		}
	}
}

func TestParseBandwidth(t *testing.T) {
	for in, want := range map[string]float64{"1Gbit": 125e6, "100Mbit": 12.5e6, "8kbit": 1000, "50MB": 50e6, "2KB": 2000, "1000": 1000, "0": 0, "3B": 3} {
		got, err := parseBandwidth(in)
		if err != nil || got != want {
			t.Errorf("parseBandwidth(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := parseBandwidth("-1"); err == nil {
		t.Error("negative bandwidth accepted")
	}
}
