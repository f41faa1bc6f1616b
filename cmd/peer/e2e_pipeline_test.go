package main

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestPipelineKillAndResume runs a tiny charlm as a 2-stage pipeline of
// two peer processes over loopback, kills one with SIGKILL mid-run, checks
// that the other stops with an error naming the pipeline within its
// --pipe-timeout, then restarts both with --resume: they go on from their
// checkpoints (rewinding to one step both hold) and finish.
func TestPipelineKillAndResume(t *testing.T) {
	bin := binary(t)
	dir := t.TempDir()
	corpus := tinyCorpus(t)
	sw := swarmFlags(t, dir, 2)
	args := func(i int, steps int, extra ...string) []string {
		a := []string{"--mode", "pipeline", "--stages", "2", "--micro-batches", "2", "--steps", fmt.Sprint(steps), "--eval-every", "10",
			"--model", tinyCharLM, "--data", corpus, "--batch", "8", "--schedule", "constant", "--pipe-timeout", "3s",
			"--wait", "30s", "--linger", "0s", "--out", filepath.Join(dir, fmt.Sprint("o", i))}
		return append(append(a, sw(i)...), extra...)
	}
	procs := []*proc{start(t, bin, args(0, 1_000_000)...), start(t, bin, args(1, 1_000_000)...)}
	procs[1].waitRound(t, 20, 60*time.Second)
	procs[1].cmd.Process.Signal(syscall.SIGKILL)
	<-procs[1].done
	killed := time.Now()
	go func() {
		for range procs[0].lines {
		}
	}()
	select {
	case err := <-procs[0].done:
		if err == nil || !strings.Contains(err.Error(), "pipeline") {
			t.Fatalf("the surviving stage ended with %v, want a pipeline error", err)
		}
		t.Logf("survivor stopped %v after the kill: %s", time.Since(killed).Round(time.Millisecond), lastLine(err.Error()))
	case <-time.After(20 * time.Second):
		t.Fatal("the surviving stage did not stop within 20 s of its neighbour's death")
	}

	const steps = 60
	procs = []*proc{start(t, bin, args(0, steps, "--resume")...), start(t, bin, args(1, steps, "--resume")...)}
	lossSeen := false
	for i, p := range procs {
		first := p.waitRound(t, 1, 60*time.Second)
		if first.Round <= 20 {
			t.Errorf("peer %d's first report after --resume is step %d: it did not resume from step ≥ 20", i, first.Round)
		}
		last := p.final(t, i)
		if last.Round != steps {
			t.Errorf("peer %d ended at step %d, want %d", i, last.Round, steps)
		}
		if last.Loss > 0 {
			lossSeen = !math.IsNaN(last.Loss) && !math.IsInf(last.Loss, 0)
		}
	}
	if !lossSeen {
		t.Error("the last stage reported no finite training loss")
	}
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndex(s, "\n"); i >= 0 {
		return s[i+1:]
	}
	return s
}

// TestRunPipelineBadInput: pipeline settings that cannot work are one-line
// errors before the peer joins a swarm.
func TestRunPipelineBadInput(t *testing.T) {
	corpus := tinyCorpus(t)
	base := []string{"run", "--mode", "pipeline", "--model", tinyCharLM, "--data", corpus, "--min-peers", "1", "--mdns=false", "--listen", "/ip4/127.0.0.1/tcp/0"}
	cases := map[string]struct {
		args []string
		want string
	}{
		// tinyCharLM has 6 units: wte, wpe, 2 residual branches, ln_f, lm_head.
		"stages over layers": {[]string{"--stages", "7"}, "7 stages for a model of 6 layers"},
		"stage out of range": {[]string{"--stages", "2", "--stage", "2"}, "--stage 2 of --stages 2"},
		"micro-batches":      {[]string{"--micro-batches", "0"}, "0 micro-batches"},
		"schedule":           {[]string{"--pipe-schedule", "zigzag"}, `unknown schedule "zigzag"`},
		"other mode's flag":  {[]string{"--rounds", "3"}, "--rounds applies to --mode federated"},
		"mlp stages":         {[]string{"--model", "mlp", "--data", "", "--stages", "4"}, "4 stages for a model of 3 layers"},
	}
	for name, c := range cases {
		var out, errb strings.Builder
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err := run(ctx, append(slices.Clone(base), c.args...), &out, &errb)
		cancel()
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(strings.TrimSpace(err.Error()), "\n") {
			t.Errorf("%s: err = %v, want one line mentioning %q", name, err, c.want)
		}
	}
}

// TestPipelinesAverage runs two 2-stage pipelines of a tiny charlm as four
// peer processes (--pipelines 2): each stage all-reduces its gradient with
// its replica every step, so both pipelines end with the same model, which
// their last stages' equal validation losses show.
func TestPipelinesAverage(t *testing.T) {
	bin := binary(t)
	dir := t.TempDir()
	corpus := tinyCorpus(t)
	const n, steps = 4, 20
	sw := swarmFlags(t, dir, n)
	procs := make([]*proc, n)
	for i := range procs {
		args := append([]string{"--mode", "pipeline", "--stages", "2", "--pipelines", "2", "--micro-batches", "2", "--steps", fmt.Sprint(steps),
			"--eval-every", "10", "--model", tinyCharLM, "--data", corpus, "--batch", "8", "--pipe-timeout", "10s", "--stall-timeout", "10s",
			"--wait", "60s", "--linger", "0s", "--out", filepath.Join(dir, fmt.Sprint("o", i))}, sw(i)...)
		procs[i] = start(t, bin, args...)
	}
	var losses []float64
	for i, p := range procs {
		last := p.final(t, i)
		if last.Round != steps {
			t.Errorf("peer %d ended at step %d, want %d", i, last.Round, steps)
		}
		if last.Loss > 0 {
			losses = append(losses, last.Loss)
		}
	}
	if len(losses) != 2 || losses[0] != losses[1] {
		t.Errorf("the two pipelines' last stages report validation losses %v, want two equal ones", losses)
	}
}
