package train

import (
	"errors"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"
)

func TestCheckpointRoundTrip(t *testing.T) {
	tr, _ := mnist(t)
	wc := DefaultWorkerConfig()
	wc.Model = "logreg"
	w, err := NewWorker(wc, tr.Head(500))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if _, err := w.Step(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	ck := &Checkpoint{Mode: "federated", Strategy: "fedavg", Version: 7, State: []float32{1, 2, 3}, Extra: map[string][]float32{"ef": {4, 5}}}
	ck.Capture(w)
	path := filepath.Join(t.TempDir(), "ck.safetensors")
	if err := ck.Save(path); err != nil {
		t.Fatal(err)
	}
	got, err := LoadCheckpoint(path, 1<<24)
	if err != nil {
		t.Fatal(err)
	}
	if got.Version != 7 || got.Steps != 3 || got.OptSteps != 3 || !slices.Equal(got.State, ck.State) ||
		!slices.Equal(got.Params, w.Model.Params) || !slices.Equal(got.Opt["momentum"], ck.Opt["momentum"]) || !slices.Equal(got.Extra["ef"], []float32{4, 5}) {
		t.Fatalf("round trip: %+v", got)
	}
	w2, _ := NewWorker(wc, tr.Head(500))
	if err := got.Check(w2, "federated"); err != nil {
		t.Fatal(err)
	}
	if err := got.Restore(w2); err != nil || !slices.Equal(w2.Model.Params, w.Model.Params) || w2.Steps != 3 {
		t.Fatalf("restore: %v", err)
	}
	if err := got.Check(w2, "sync"); !errors.Is(err, ErrCheckpoint) {
		t.Fatalf("other mode: %v", err)
	}
	wc.Model = "mlp"
	w3, _ := NewWorker(wc, tr.Head(500))
	if err := got.Check(w3, "federated"); !errors.Is(err, ErrCheckpoint) {
		t.Fatalf("other model: %v", err)
	}
	os.WriteFile(path, []byte("garbage"), 0o644)
	if _, err := LoadCheckpoint(path, 1<<24); !errors.Is(err, ErrCheckpoint) {
		t.Fatalf("garbage: %v", err)
	}
}

// TestCheckpointRejectsBadValues: a checkpoint whose counts are negative
// or whose model holds NaN or ±Inf is refused on load, not trained from.
func TestCheckpointRejectsBadValues(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(-1))
	for name, ck := range map[string]*Checkpoint{
		"negative steps":     {Steps: -3, Params: []float32{1}},
		"negative opt steps": {OptSteps: -1, Params: []float32{1}},
		"NaN param":          {Params: []float32{1, nan}},
		"Inf in state":       {State: []float32{inf}, Params: []float32{1}},
	} {
		path := filepath.Join(t.TempDir(), "ck")
		if err := ck.Save(path); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadCheckpoint(path, 1<<20); !errors.Is(err, ErrCheckpoint) {
			t.Errorf("%s: %v, want ErrCheckpoint", name, err)
		}
	}
}

// TestCheckpointSurvivesKillMidWrite kills a process while it rewrites a
// large checkpoint and checks that the previous one is still whole.
func TestCheckpointSurvivesKillMidWrite(t *testing.T) {
	path := os.Getenv("STARLING_CKPT_CHILD")
	if path != "" {
		// Child: rewrite the checkpoint with a big state, forever.
		big := make([]float32, 64<<20)
		for {
			(&Checkpoint{Arch: "x", Mode: "federated", Version: 2, State: big}).Save(path)
		}
	}
	if testing.Short() {
		t.Skip("re-executes the test binary")
	}
	path = filepath.Join(t.TempDir(), "ck")
	want := []float32{1, 2, 3}
	if err := (&Checkpoint{Arch: "x", Mode: "federated", Version: 1, State: want}).Save(path); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestCheckpointSurvivesKillMidWrite$")
	cmd.Env = append(os.Environ(), "STARLING_CKPT_CHILD="+path)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Wait until the child is writing its temporary file, then kill it.
	deadline := time.Now().Add(20 * time.Second)
	for {
		m, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".ck.tmp*"))
		if len(m) > 0 {
			if st, err := os.Stat(m[0]); err == nil && st.Size() > 1<<20 {
				break
			}
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatal("child never started writing")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	ck, err := LoadCheckpoint(path, 1<<28)
	if err != nil {
		t.Fatalf("checkpoint after a kill mid-write: %v", err)
	}
	if ck.Version == 1 && !slices.Equal(ck.State, want) {
		t.Fatalf("version 1 with state %v", ck.State[:3])
	}
	if ck.Version != 1 && ck.Version != 2 {
		t.Fatalf("version %d", ck.Version)
	}
}
