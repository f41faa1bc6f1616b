package train

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
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
