package main

// Tests of peer serve through the Python package (python/): its unit
// tests, a 4-process run on loopback with known tensors and bad input,
// and a short data-parallel MNIST training by 3 processes.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// python returns a python3 that imports every module of mods, or skips
// the test naming what is missing. Debian's python3-torch and
// python3-numpy install for /usr/bin/python3, which a python3 earlier on
// PATH may hide.
func python(t *testing.T, mods ...string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("starts python3 processes")
	}
	imp := "import " + strings.Join(mods, ", ")
	var why []string
	for _, py := range []string{"/usr/bin/python3", "python3"} {
		out, err := exec.Command(py, "-c", imp).CombinedOutput()
		if err == nil {
			return py
		}
		msg := err.Error()
		if o := strings.TrimSpace(string(out)); o != "" {
			msg = o[strings.LastIndex(o, "\n")+1:]
		}
		why = append(why, py+": "+msg)
	}
	t.Skipf("no python3 can %q (%s); on Debian: apt-get install python3-numpy python3-torch", imp, strings.Join(why, "; "))
	return ""
}

// pyCmd runs a python script with STARLING_PEER set to the test's binary;
// it is killed with the test binary and at ctx's end.
func pyCmd(ctx context.Context, py, bin string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, py, args...)
	cmd.Env = append(os.Environ(), "STARLING_PEER="+bin, "PYTHONDONTWRITEBYTECODE=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

func TestServePythonUnit(t *testing.T) {
	bin := binary(t)
	py := python(t, "numpy")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := pyCmd(ctx, py, bin, "-m", "unittest", "discover", "-s", "../../python/tests", "-p", "test_*.py", "-v")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python unit tests: %v\n%s", err, out)
	}
	t.Logf("%s", out)
	if bytes.Contains(out, []byte("skipped")) && !bytes.Contains(out, []byte("torch not importable")) {
		t.Fatalf("a python test skipped:\n%s", out)
	}
}

// joinFlags returns the join flags of n processes on loopback, each
// --connect-ing to every other.
func joinFlags(t *testing.T, n int, extra ...string) [][]string {
	dir := t.TempDir()
	ports, keys, addrs := make([]int, n), make([]string, n), make([]string, n)
	for i := range n {
		ports[i] = freePort(t)
		keys[i], addrs[i] = identity(t, dir, i, ports[i])
	}
	out := make([][]string, n)
	for i := range n {
		a := append([]string{"--mdns=false", "--swarm", "serve-e2e", "--min-peers", fmt.Sprint(n), "--key", keys[i],
			"--listen", fmt.Sprintf("/ip4/127.0.0.1/tcp/%d", ports[i])}, extra...)
		for j := range n {
			if j != i {
				a = append(a, "--connect", addrs[j])
			}
		}
		out[i] = a
	}
	return out
}

// runAll starts one python process per args, waits for all, and returns
// their stdout lines.
func runAll(t *testing.T, ctx context.Context, py, bin string, args [][]string) [][]string {
	t.Helper()
	lines := make([][]string, len(args))
	errs := make([]error, len(args))
	stderr := make([]bytes.Buffer, len(args))
	var wg sync.WaitGroup
	for i, a := range args {
		cmd := pyCmd(ctx, py, bin, a...)
		cmd.Stderr = &stderr[i]
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				lines[i] = append(lines[i], sc.Text())
			}
			errs[i] = cmd.Wait()
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Logf("process %d: %v\nstdout: %s\nstderr: %s", i, err, strings.Join(lines[i], "\n"), tail(stderr[i].String(), 3000))
		}
	}
	return lines
}

func tail(s string, n int) string { return s[max(0, len(s)-n):] }

// TestServeE2E runs python/tests/swarm_worker.py in 4 processes: exact
// means and sums of known tensors (numpy, float64 converted), fp16, an
// integer dtype, a second client, a peer whose shape differs (left out:
// the other three go on), and a client that dies in the middle of a call
// (its peer leaves: the other two go on).
func TestServeE2E(t *testing.T) {
	bin := binary(t)
	py := python(t, "numpy")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	flags := joinFlags(t, 4, "--stall-timeout", "3s")
	args := make([][]string, 4)
	for i := range args {
		j, _ := json.Marshal(flags[i])
		args[i] = []string{"../../python/tests/swarm_worker.py", fmt.Sprint(i), string(j)}
	}
	lines := runAll(t, ctx, py, bin, args)
	want := map[int][]string{
		0: {"join", "mean", "sum", "fp16", "dtype", "second-client", "shape", "died-mid-call", "after-death", "metrics"},
		2: {"join", "mean", "sum", "fp16", "dtype", "second-client", "shape"},
		3: {"join", "mean", "sum", "fp16", "dtype", "second-client", "shape"},
	}
	want[1] = want[0]
	for rank, ls := range lines {
		var got []string
		done := false
		for _, l := range ls {
			var r struct {
				Check string `json:"check"`
				OK    bool   `json:"ok"`
				Done  bool   `json:"done"`
			}
			if err := json.Unmarshal([]byte(l), &r); err != nil {
				t.Fatalf("rank %d: %q: %v", rank, l, err)
			}
			if r.Done {
				done = true
				continue
			}
			if !r.OK {
				t.Errorf("rank %d: check %s failed: %s", rank, r.Check, l)
			}
			got = append(got, r.Check)
		}
		if !done || strings.Join(got, ",") != strings.Join(want[rank], ",") {
			t.Errorf("rank %d: checks %v (done %v), want %v", rank, got, done, want[rank])
		}
	}
}

// TestServeTorchTraining trains examples/torch/mnist.py's MLP by
// synchronous data parallelism over 3 processes for a few steps: the
// averaged gradients keep the models identical (the same test accuracy
// everywhere) and they learn.
func TestServeTorchTraining(t *testing.T) {
	bin := binary(t)
	py := python(t, "numpy", "torch")
	if _, err := os.Stat("../../examples/torch/mnist.py"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	flags := joinFlags(t, 3)
	args := make([][]string, 3)
	for i := range args {
		args[i] = append([]string{filepath.Join("..", "..", "examples", "torch", "mnist.py"), "--rank", fmt.Sprint(i), "--world", "3",
			"--mode", "dp", "--steps", "40", "--hidden", "64", "--lr", "3e-3", "--limit", "6000", "--test-limit", "2000", "--"}, flags[i]...)
	}
	lines := runAll(t, ctx, py, bin, args)
	var accs []float64
	for rank, ls := range lines {
		if len(ls) != 1 {
			t.Fatalf("rank %d printed %q, want one JSON line", rank, ls)
		}
		var r struct {
			Accuracy float64 `json:"accuracy"`
			Rounds   int     `json:"rounds"`
			Group    int     `json:"group"`
		}
		if err := json.Unmarshal([]byte(ls[0]), &r); err != nil {
			t.Fatal(err)
		}
		if r.Rounds != 40 || r.Group != 3 {
			t.Errorf("rank %d: %s: want 40 rounds in a group of 3", rank, ls[0])
		}
		accs = append(accs, r.Accuracy)
	}
	t.Logf("accuracies %v; %s", accs, lines[0][0])
	if accs[0] != accs[1] || accs[1] != accs[2] {
		t.Errorf("accuracies %v differ: the averaged gradients should keep the models identical", accs)
	}
	if accs[0] < 0.8 {
		t.Errorf("accuracy %v after 40 steps, want ≥ 0.8", accs[0])
	}
}
