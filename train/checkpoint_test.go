package train

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/starling-ml/starling/nn"
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

// TestCheckpointDigest flips one byte of a saved checkpoint, at every
// offset, three ways: every flip is refused, and a flip in the tensors'
// data (parameters, optimiser and strategy state) is refused because the
// digest does not match. The untouched file loads, and saves again to the
// same bytes.
func TestCheckpointDigest(t *testing.T) {
	ck := &Checkpoint{
		Arch: "mlp:4-3", Mode: "federated", Strategy: "fedadam", Version: 9, Steps: 40, OptSteps: 40,
		State: []float32{1, -2, 3.5}, Params: []float32{0.25, -0.5, 1, 2, 4, 8, 16, 32, 64, 128, 0, -1, 3, 5, 7},
		Opt: map[string][]float32{"m": {1, 2}, "v": {3}}, Extra: map[string][]float32{"ef": {4, 5}},
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "ck")
	if err := ck.Save(path); err != nil {
		t.Fatal(err)
	}
	orig, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	got, err := LoadCheckpoint(path, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Params, ck.Params) || !slices.Equal(got.State, ck.State) || !slices.Equal(got.Opt["v"], ck.Opt["v"]) || got.Strategy != ck.Strategy {
		t.Fatalf("round trip: %+v", got)
	}
	again := filepath.Join(dir, "again")
	if err := got.Save(again); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(again); !bytes.Equal(b, orig) {
		t.Fatal("saving a loaded checkpoint wrote other bytes")
	}

	data := 8 + int(binary.LittleEndian.Uint64(orig)) // where the tensors' data starts
	bad := filepath.Join(dir, "bad")
	for off := range orig {
		for _, mask := range []byte{0x01, 0x80, 0xff} {
			b := slices.Clone(orig)
			b[off] ^= mask
			if err := os.WriteFile(bad, b, 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := LoadCheckpoint(bad, 1<<20)
			if !errors.Is(err, ErrCheckpoint) {
				t.Fatalf("byte %d ^ %#x: %v, want ErrCheckpoint", off, mask, err)
			}
			if off >= data && !strings.Contains(err.Error(), "digest of its data does not match") {
				t.Fatalf("byte %d ^ %#x, in the data: %v, want a digest mismatch", off, mask, err)
			}
		}
	}
}

// TestCheckpointFormat1Refused: a checkpoint written before checkpoints
// carried a digest cannot be checked, and is refused saying so.
func TestCheckpointFormat1Refused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "old")
	meta := map[string]string{"starling.checkpoint": "1", "arch": "x", "mode": "sync", "strategy": "sync", "version": "3", "steps": "3", "opt_steps": "3"}
	var b bytes.Buffer
	if err := nn.WriteSafetensors(&b, []nn.Tensor{{Name: "params", Shape: []int{2}, Data: []float32{1, 2}}}, meta); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(path, b.Bytes(), 0o644)
	_, err := LoadCheckpoint(path, 1<<20)
	if !errors.Is(err, ErrCheckpoint) || !strings.Contains(err.Error(), "format 1, which carries no digest") {
		t.Fatalf("format 1: %v", err)
	}
	meta["starling.checkpoint"] = "3"
	b.Reset()
	nn.WriteSafetensors(&b, nil, meta)
	os.WriteFile(path, b.Bytes(), 0o644)
	if _, err := LoadCheckpoint(path, 1<<20); !errors.Is(err, ErrCheckpoint) || !strings.Contains(err.Error(), `format "3"`) {
		t.Fatalf("format 3: %v", err)
	}
}

// TestCheckpointExportWeights: a checkpoint's parameters are written
// through the model's exporter and load into a fresh model; the model
// passed in is only a template.
func TestCheckpointExportWeights(t *testing.T) {
	m, err := nn.New("logreg", 1)
	if err != nil {
		t.Fatal(err)
	}
	ck := &Checkpoint{Arch: m.Arch, Params: make([]float32, len(m.Params))}
	for i := range ck.Params {
		ck.Params[i] = float32(i%13) - 6
	}
	before := slices.Clone(m.Params)
	path := filepath.Join(t.TempDir(), "w.safetensors")
	if err := ck.ExportWeights(m, path); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(m.Params, before) {
		t.Fatal("ExportWeights changed the template model")
	}
	fresh, _ := nn.New("logreg", 2)
	if err := fresh.LoadFile(path); err != nil || !slices.Equal(fresh.Params, ck.Params) {
		t.Fatalf("loading the export: %v", err)
	}
	mlp, _ := nn.New("mlp", 1)
	for name, c := range map[string]struct {
		ck *Checkpoint
		m  *nn.Model
	}{
		"other model":   {ck, mlp},
		"no parameters": {&Checkpoint{Arch: m.Arch}, m},
		"short":         {&Checkpoint{Arch: m.Arch, Params: ck.Params[1:]}, m},
	} {
		if err := c.ck.ExportWeights(c.m, path); !errors.Is(err, ErrCheckpoint) {
			t.Errorf("%s: %v, want ErrCheckpoint", name, err)
		}
	}
}
