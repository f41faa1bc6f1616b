package main

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/starling-ml/starling/node"
	"github.com/starling-ml/starling/train"
)

func TestResultLine(t *testing.T) {
	got := resultLine("starling", 4, 64000000, 500*time.Millisecond)
	want := "starling world=4 bytes=64000000 time_s=0.5000 algbw_MBps=128.0 busbw_MBps=192.0"
	if got != want {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
}

func TestBenchAllReduceFlags(t *testing.T) {
	var stderr bytes.Buffer
	for _, bad := range [][]string{
		{"--world", "0"},
		{"--peers", "/ip4/127.0.0.1/tcp/1"}, // no /p2p/ID
		{"--peers", "/ip4/127.0.0.1/tcp/1/p2p/12D3KooWQaVtHLbhobY1PdCvP16JMLN4YCWgCUfYrAKH7KLTJPVA"},         // no --key
		{"--world", "2", "--algo", "hypercube"},                                                              // unknown algorithm
		{"--world", "2", "--rule", "median"},                                                                 // unknown rule
		{"--world", "2", "--size-mb", "0"},                                                                   // empty vector
		{"--world", "2", "--iters", "0"},                                                                     // nothing to time
		{"--world", "2", "--connect", "/ip4/127.0.0.1/tcp/1/p2p/x", "--peers", "/ip4/127.0.0.1/tcp/1/p2p/y"}, // both
	} {
		if _, err := parseAllReduceBench(bad, &stderr); err == nil {
			t.Errorf("%q: want an error", bad)
		}
	}
	b, err := parseAllReduceBench([]string{"--world", "3", "--connect", "/ip4/127.0.0.1/tcp/1/p2p/12D3KooWQaVtHLbhobY1PdCvP16JMLN4YCWgCUfYrAKH7KLTJPVA", "--algo", "tree", "--size-mb", "1.5"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if b.master || b.world != 3 || b.bytes != 1500000 || b.cfg.Aggregate.Algorithm.String() != "tree" || b.cfg.Node.Insecure {
		t.Fatalf("%+v", b)
	}
	stderr.Reset()
	b, err = parseAllReduceBench([]string{"--world", "2", "--insecure"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if !b.cfg.Node.Insecure || !strings.Contains(stderr.String(), "neither encrypted nor authenticated") {
		t.Fatalf("--insecure: Insecure %v, stderr %q", b.cfg.Node.Insecure, stderr.String())
	}
	if b.cfg.Node.Muxer != node.MuxerStarling {
		t.Fatalf("default muxer %q", b.cfg.Node.Muxer)
	}
	b, err = parseAllReduceBench([]string{"--world", "2", "--muxer", "yamux"}, &stderr)
	if err != nil || b.cfg.Node.Muxer != node.MuxerYamux {
		t.Fatalf("--muxer yamux: %v, Muxer %q", err, b.cfg.Node.Muxer)
	}
}

// TestBenchAllReduceProcesses runs `peer bench allreduce` as three
// processes on loopback, once with --peers and once with --connect, and
// checks rank 0's line (the processes check every result themselves).
func TestBenchAllReduceProcesses(t *testing.T) {
	bin := binary(t)
	dir := t.TempDir()
	line := regexp.MustCompile(`^starling world=3 bytes=2000000 time_s=[0-9.]+ algbw_MBps=[0-9.]+ busbw_MBps=[0-9.]+\n$`)
	const n = 3
	// Each subtest takes fresh ports: one left unbound between subtests
	// could be taken by another test binary's peer, and with SO_REUSEPORT
	// both would then listen on it.
	var ports []int
	keys, addrs := make([]string, n), make([]string, n)
	run := func(t *testing.T, args func(i int) []string) []string {
		ports = []int{freePort(t), freePort(t), freePort(t)}
		for i := range keys {
			keys[i], addrs[i] = identity(t, dir, i, ports[i])
		}
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		outs := make([]string, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				cmd := exec.CommandContext(ctx, bin, append([]string{"bench", "allreduce", "--listen", fmt.Sprintf("/ip4/127.0.0.1/tcp/%d", ports[i]),
					"--size-mb", "2", "--iters", "2", "--stall-timeout", "10s"}, args(i)...)...)
				cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
				var out, stderr bytes.Buffer
				cmd.Stdout, cmd.Stderr = &out, &stderr
				if err := cmd.Run(); err != nil {
					errs[i] = fmt.Errorf("%v: %s", err, stderr.String())
				}
				outs[i] = out.String()
			})
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("process %d: %v", i, err)
			}
		}
		return outs
	}
	t.Run("peers", func(t *testing.T) {
		outs := run(t, func(i int) []string {
			return []string{"--key", keys[i], "--peers", strings.Join(addrs, ","), "--algo", "butterfly"}
		})
		if !line.MatchString(outs[0]) || outs[1] != "" || outs[2] != "" {
			t.Fatalf("outputs %q", outs)
		}
	})
	t.Run("insecure", func(t *testing.T) {
		outs := run(t, func(i int) []string {
			return []string{"--key", keys[i], "--peers", strings.Join(addrs, ","), "--insecure"}
		})
		if !line.MatchString(outs[0]) || outs[1] != "" || outs[2] != "" {
			t.Fatalf("outputs %q", outs)
		}
	})
	t.Run("mean", func(t *testing.T) { // weighted by rank+1; each process checks (2W+1)/3
		outs := run(t, func(i int) []string {
			return []string{"--key", keys[i], "--peers", strings.Join(addrs, ","), "--insecure", "--algo", "ring", "--rule", "mean"}
		})
		if !line.MatchString(outs[0]) || outs[1] != "" || outs[2] != "" {
			t.Fatalf("outputs %q", outs)
		}
	})
	t.Run("connect", func(t *testing.T) {
		outs := run(t, func(i int) []string {
			a := []string{"--key", keys[i], "--world", "3", "--algo", "auto"}
			if i > 0 {
				a = append(a, "--connect", addrs[0])
			}
			return a
		})
		if !line.MatchString(outs[0]) || outs[1] != "" || outs[2] != "" {
			t.Fatalf("outputs %q", outs)
		}
	})
}

// TestSyncKillAndResume runs `peer run --mode sync` as three processes,
// kills one with SIGKILL mid-job and restarts it from its checkpoint: the
// survivors go on without it, the restarted peer rejoins by fetching their
// state, and all three end with the same parameters.
func TestSyncKillAndResume(t *testing.T) {
	bin := binary(t)
	dir := t.TempDir()
	// 900 steps take the survivors ~12 s: room for the restarted peer to
	// start, be left out of one step and join (300 were too few on a
	// loaded CI machine).
	const n, steps = 3, 900
	sw := swarmFlags(t, dir, n)
	args := func(i int) []string {
		return append([]string{"--mode", "sync", "--model", "mlp:784-32-10", "--limit", "6000", "--batch", "16", "--steps", fmt.Sprint(steps),
			"--eval-every", "20", "--stall-timeout", "2s", "--slowdown", "200", "--join-lead", "1s", "--wait", "30s",
			"--optimizer", "momentum", "--lr", "0.05", "--linger", "5s"}, sw(i)...)
	}
	procs := make([]*proc, n)
	for i := range procs {
		procs[i] = start(t, bin, args(i)...)
	}
	procs[2].waitRound(t, 40, 60*time.Second)
	procs[2].cmd.Process.Signal(syscall.SIGKILL)
	<-procs[2].done
	ck, err := train.LoadCheckpoint(filepath.Join(dir, "c2"), 1<<24)
	if err != nil {
		t.Fatalf("checkpoint after kill -9: %v", err)
	}
	restarted := start(t, bin, append(args(2), "--resume", "--min-peers", "1")...)
	// It tries the step it stopped at first. The others may still be
	// waiting on it there: then it takes part in that step with its
	// checkpoint's state, which is theirs. Or they have gone on without
	// it: then it is left out, fetches their state and joins them. Either
	// way it must be back in the group well before the last step.
	for {
		pr := restarted.waitRound(t, 1, 60*time.Second)
		t.Logf("restarted peer: step %d (group of %d) %s", pr.Round, pr.Peers, pr.Note)
		if strings.HasPrefix(pr.Note, "joined") || (pr.Note == "" && pr.Peers == n) {
			if pr.Round <= int(ck.Version) || pr.Round >= steps {
				t.Fatalf("restarted peer (checkpoint at step %d) back at step %d of %d", ck.Version, pr.Round, steps)
			}
			break
		}
	}
	for _, p := range []*proc{procs[0], procs[1], restarted} {
		p.wait(t, 120*time.Second)
	}
	sameSyncEnd(t, dir, n, steps)
}

// sameSyncEnd checks that the checkpoints dir/c0 … c<n−1> of a sync job
// are all at its last step with the same parameters.
func sameSyncEnd(t *testing.T, dir string, n, steps int) {
	t.Helper()
	var ref []float32
	for i := range n {
		ck, err := train.LoadCheckpoint(filepath.Join(dir, fmt.Sprintf("c%d", i)), 1<<24)
		if err != nil {
			t.Fatal(err)
		}
		if ck.Version != uint64(steps) || ck.Mode != "sync" {
			t.Fatalf("peer %d: checkpoint at step %d, mode %q", i, ck.Version, ck.Mode)
		}
		if ref == nil {
			ref = ck.Params
		} else if !slices.Equal(ref, ck.Params) {
			t.Fatalf("peer %d ended with other parameters", i)
		}
	}
}

// TestSyncStragglerTakesFinalState freezes one of three `peer run --mode
// sync` processes (SIGSTOP) near the end of the job, until the other two
// have finished, then thaws it. It was left out of the last steps; it must
// take the job's final state from the others, which stay up past their
// --linger (1 ms here) while a live peer is still on its way. (Before they
// did, they were gone by then and it trained the last steps alone, ending
// with other parameters.)
func TestSyncStragglerTakesFinalState(t *testing.T) {
	bin := binary(t)
	dir := t.TempDir()
	const n, steps = 3, 300
	sw := swarmFlags(t, dir, n)
	procs := make([]*proc, n)
	for i := range procs {
		// Short stall timeout and join lead: the two finish soon after the
		// freeze, well within the time it stays a live member (see below).
		// Peers 0 and 1 set the pace. Not the one to freeze: --slowdown
		// scales each batch's compute time, and a freeze inside one would
		// make it wait 199 times the freeze.
		slowdown := "200"
		if i == 2 {
			slowdown = "1"
		}
		procs[i] = start(t, bin, append([]string{"--mode", "sync", "--model", "mlp:784-32-10", "--limit", "6000", "--batch", "16",
			"--steps", fmt.Sprint(steps), "--eval-every", "20", "--stall-timeout", "500ms", "--step-timeout", "10s", "--join-lead", "200ms", "--slowdown", slowdown,
			"--wait", "30s", "--optimizer", "momentum", "--lr", "0.05", "--linger", "1ms"}, sw(i)...)...)
	}
	procs[2].waitRound(t, steps-20, 60*time.Second)
	procs[2].cmd.Process.Signal(syscall.SIGSTOP)
	frozen := time.Now()
	procs[0].waitRound(t, steps, 60*time.Second)
	procs[2].cmd.Process.Signal(syscall.SIGCONT)
	// Frozen for longer than the others' membership TTL (5 s), it would
	// no longer be a live peer to them: their linger would not wait.
	t.Logf("frozen for %v", time.Since(frozen).Round(time.Millisecond))
	for _, p := range procs {
		p.wait(t, 60*time.Second)
	}
	sameSyncEnd(t, dir, n, steps)
}
