//go:build attackmatrix

package main

// The full attack matrix, for docs/results: every mode × rule × attack,
// 4 honest peer processes and one liar each, six at a time: about 30
// minutes on 2 shared cores (-run selects rows: TestAttackMatrix/jobs/sync,.*):
//
//	go test -tags attackmatrix ./cmd/peer -run TestAttackMatrix -parallel 6 -timeout 60m -v \
//	    -args -matrix-out /tmp/attack-matrix.md

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
)

var matrixOut = flag.String("matrix-out", "", "write the attack matrix's table (markdown) to this file")

type matrixRow struct {
	mode, rule, attack string
	flags              []string
	end                int
}

func TestAttackMatrix(t *testing.T) {
	bin := binary(t)
	const rounds, steps = 60, 300
	attacksFed := []string{"none", "scale:-10", "signflip", "noise:1", "nan", "stale:5", "flood"}
	attacks := []string{"none", "scale:-10", "signflip", "nan", "noise:1", "stale:5", "flood"}
	var rows []matrixRow
	for _, r := range []string{"mean", "median", "trimmed:0.2", "krum:f=1", "cclip:tau=0.05,iters=3"} {
		for _, a := range attacksFed {
			rows = append(rows, matrixRow{"federated", r, a, append(fedAttackFlags(rounds), "--aggregate", r), rounds})
		}
	}
	syncFlags := []string{"--mode", "sync", "--model", "logreg", "--limit", "10000", "--steps", fmt.Sprint(steps), "--eval-every", "100",
		"--batch", "64", "--optimizer", "sgd", "--lr", "0.2", "--stall-timeout", "2s", "--step-timeout", "20s", "--wait", "60s", "--linger", "1s"}
	for _, r := range []string{"mean", "median", "trimmed:0.2", "krum:f=1", "cclip:tau=0.5,iters=3"} {
		for _, a := range attacks {
			rows = append(rows, matrixRow{"sync", r, a, append(slices.Clone(syncFlags), "--aggregate", r), steps})
		}
	}
	streaming := func(mode ...string) []string {
		return append(mode, "--model", "logreg", "--limit", "10000", "--steps", fmt.Sprint(steps), "--eval-every", "100",
			"--batch", "64", "--optimizer", "sgd", "--lr", "0.2", "--wait", "60s", "--linger", "1s")
	}
	for _, c := range []struct{ mode, rule string }{
		{"async fedasync", "--clip-peers=0"}, {"async fedasync", "--clip-peers=1"},
		{"async fedbuff", "--buffer-rule=mean"}, {"async fedbuff", "--buffer-rule=median"},
		{"gossip adpsgd", "--clip-peers=0"}, {"gossip adpsgd", "--clip-peers=1"},
	} {
		m := strings.Fields(c.mode)
		base := streaming("--mode", m[0])
		if m[0] == "async" {
			base = append(base, "--async", m[1])
			if m[1] == "fedbuff" {
				base = append(base, "--buffer-k", "4")
			}
		}
		for _, a := range attacks {
			rows = append(rows, matrixRow{c.mode, c.rule, a, append(slices.Clone(base), c.rule), steps})
		}
	}

	var mu sync.Mutex
	acc := map[int][]float64{}
	ran := map[int]bool{}
	t.Run("jobs", func(t *testing.T) {
		for i, r := range rows {
			t.Run(fmt.Sprintf("%s,%s,%s", r.mode, r.rule, r.attack), func(t *testing.T) {
				t.Parallel()
				mu.Lock()
				ran[i] = true
				mu.Unlock()
				a := attackRun(t, bin, 5, r.flags, r.attack, r.end)
				t.Logf("honest accuracies %v", a)
				mu.Lock()
				acc[i] = a
				mu.Unlock()
			})
		}
	})

	clean := map[string]float64{} // mode/rule → the clean job's accuracy
	for i, r := range rows {
		if a, ok := acc[i]; ok && r.attack == "none" {
			clean[r.mode+"/"+r.rule] = slices.Min(a)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "| mode | rule | attack | honest accuracy (worst of 4) | Δ vs the same rule clean |\n|---|---|---|---|---|\n")
	for i, r := range rows {
		a, ok := acc[i]
		if !ok {
			if ran[i] {
				fmt.Fprintf(&b, "| %s | %s | %s | failed | – |\n", r.mode, r.rule, r.attack)
			}
			continue
		}
		lo := slices.Min(a)
		d := "–"
		if c, ok := clean[r.mode+"/"+r.rule]; ok && r.attack != "none" {
			d = fmt.Sprintf("%+.1f pp", 100*(lo-c))
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %.2f %% | %s |\n", r.mode, r.rule, r.attack, 100*lo, d)
	}
	t.Logf("\n%s", b.String())
	if *matrixOut != "" {
		if err := os.WriteFile(*matrixOut, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
