package main

// End-to-end tests of the language-model workload: real peer processes
// over loopback training a tiny charlm in every mode.

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/starling-ml/starling/internal/peerrun"
)

// tinyCharLM trains a step in a millisecond or two.
const tinyCharLM = "charlm:layers=1,width=16,heads=2,ctx=16"

// tinyCorpus writes a corpus of about 20 kB of Go (this package's e2e
// test) and returns its path.
func tinyCorpus(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("e2e_test.go")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "corpus.go.txt")
	if err := os.WriteFile(path, b[:min(len(b), 20000)], 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// readSummary reads a peer's summary.json.
func readSummary(t *testing.T, dir string) peerrun.Summary {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "summary.json"))
	if err != nil {
		t.Fatal(err)
	}
	var s peerrun.Summary
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestCharLMModes runs two peer processes training a tiny charlm in each
// mode (federated FedAvg, DiLoCo and Streaming DiLoCo with fp4 outer
// gradients, sync in fp32 and fp4, async FedAsync and FedBuff in fp32 and
// int4, gossip AD-PSGD): both finish, report finite validation bits per
// character in summary.json, and agree on the model id. The federated
// swarm's --save then starts a single peer with --init (and another
// seed), whose first evaluation, after one step at a negligible rate,
// matches the swarm's last.
func TestCharLMModes(t *testing.T) {
	bin := binary(t)
	corpus := tinyCorpus(t)
	streaming := []string{"--steps", "0", "--duration", "2s", "--slowdown", "8", "--eval-every", "20"}
	modes := []struct {
		name string
		args []string
	}{
		{"fedavg", []string{"--rounds", "2", "--local-steps", "5", "--schedule", "constant", "--lr", "0.01"}},
		{"diloco", []string{"--strategy", "diloco:h=3", "--rounds", "2"}},
		{"sync", []string{"--mode", "sync", "--steps", "6", "--eval-every", "3"}},
		{"sync-fp4", []string{"--mode", "sync", "--steps", "6", "--eval-every", "3", "--compress", "fp4"}},
		{"streaming-fp4", []string{"--strategy", "streaming-diloco:h=4,fragments=2,overlap=1", "--rounds", "2", "--compress", "fp4"}},
		{"async-diloco", []string{"--strategy", "async-diloco:h=3", "--rounds", "2"}},
		{"fedasync", append([]string{"--mode", "async", "--publish-every", "5"}, streaming...)},
		{"fedbuff", append([]string{"--mode", "async", "--async", "fedbuff", "--buffer-k", "2", "--publish-every", "5"}, streaming...)},
		{"fedbuff-int4", append([]string{"--mode", "async", "--async", "fedbuff", "--buffer-k", "2", "--buffer-rule", "mean", "--publish-every", "5", "--compress", "int4"}, streaming...)},
		{"adpsgd", append([]string{"--mode", "gossip", "--gossip-every", "5"}, streaming...)},
	}
	saved := filepath.Join(t.TempDir(), "swarm.safetensors")
	var savedBits float64
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			if m.args[0] == "--mode" && m.args[1] != "sync" {
				// Bound by --duration, mostly asleep (--slowdown): run
				// together once the others are done.
				t.Parallel()
			}
			dir := t.TempDir()
			sw := swarmFlags(t, dir, 2)
			procs := make([]*proc, 2)
			for i := range procs {
				args := append(slices.Clone(m.args), "--model", tinyCharLM, "--data", corpus, "--batch", "8",
					"--stall-timeout", "2s", "--wait", "30s", "--linger", "500ms", "--out", filepath.Join(dir, fmt.Sprint("o", i)))
				if m.name == "fedavg" && i == 0 {
					args = append(args, "--save", saved)
				}
				procs[i] = start(t, bin, append(args, sw(i)...)...)
			}
			exchanged := false
			var ids []string
			for i, p := range procs {
				last := p.final(t, i)
				s := readSummary(t, filepath.Join(dir, fmt.Sprint("o", i)))
				if s.Error != "" || !(s.ValBitsPerChar > 0) || math.IsInf(s.ValBitsPerChar, 0) {
					t.Errorf("peer %d: val bits per char %v, error %q", i, s.ValBitsPerChar, s.Error)
				}
				if !(last.BitsPerChar > 0) {
					t.Errorf("peer %d: last progress without bits per char: %+v", i, last)
				}
				ids = append(ids, s.ModelID)
				var k int
				if _, err := fmt.Sscanf(last.Note, "merged %d", &k); err == nil && k > 0 {
					exchanged = true
				}
				if _, err := fmt.Sscanf(last.Note, "%d exchanges", &k); err == nil && k > 0 {
					exchanged = true
				}
				if last.Peers == 2 && !slices.Contains([]string{"fedasync", "fedbuff", "fedbuff-int4", "adpsgd"}, m.name) {
					exchanged = true
				}
				if m.name == "fedavg" && i == 0 {
					savedBits = s.ValBitsPerChar
				}
			}
			if ids[0] != ids[1] || !strings.HasPrefix(ids[0], "charlm-") {
				t.Errorf("model ids %q", ids)
			}
			if !exchanged {
				t.Error("the peers never averaged: no round of 2, no merge, no exchange")
			}
		})
	}
	t.Run("init", func(t *testing.T) {
		if savedBits == 0 {
			t.Fatal("the fedavg swarm saved no model")
		}
		dir := t.TempDir()
		p := start(t, bin, "--model", tinyCharLM, "--data", corpus, "--init", saved, "--seed", "7", "--rounds", "1", "--local-steps", "1",
			"--lr", "1e-9", "--min-peers", "1", "--linger", "0s", "--listen", "/ip4/127.0.0.1/tcp/0", "--out", dir)
		p.final(t, 0)
		if got := readSummary(t, dir).ValBitsPerChar; math.Abs(got-savedBits) > 1e-3 {
			t.Errorf("started from the swarm's model: %.5f bits per char, the swarm ended at %.5f", got, savedBits)
		}
	})
}
