package train

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/starling-ml/starling/device"
	"github.com/starling-ml/starling/internal/atomicfile"
	"github.com/starling-ml/starling/nn"
)

// ErrCheckpoint reports a checkpoint that cannot be used.
var ErrCheckpoint = errors.New("train: bad checkpoint")

// Checkpoint is everything a peer needs to continue where it stopped. It
// is stored as a safetensors file (tensors "state", "params",
// "opt.<name>", "extra.<name>"; the scalars in the metadata), written
// atomically, so a crash mid-write leaves the previous checkpoint intact.
// The metadata's "sha256" is a digest of everything else the file holds,
// which LoadCheckpoint checks (docs/design.md, "Checkpoints").
type Checkpoint struct {
	Arch     string // model architecture
	Mode     string // strategy family: federated, sync, gossip, async
	Strategy string // e.g. fedavg
	Version  uint64 // rounds applied, or the model version
	Steps    int    // local optimiser steps
	// State is the strategy's global state (for federated: global
	// parameters and server optimiser state).
	State []float32
	// Params are the local model's parameters.
	Params []float32
	// OptSteps and Opt are the local optimiser's state.
	OptSteps int
	Opt      map[string][]float32
	// Extra holds other per-peer vectors: error-feedback residuals,
	// staleness clocks, ….
	Extra map[string][]float32
}

// Save writes ck to path atomically.
func (ck *Checkpoint) Save(path string) error {
	ts := []nn.Tensor{}
	add := func(name string, v []float32) {
		if v != nil {
			ts = append(ts, nn.Tensor{Name: name, Shape: []int{len(v)}, Data: v})
		}
	}
	add("state", ck.State)
	add("params", ck.Params)
	for _, k := range sortedKeys(ck.Opt) {
		add("opt."+k, ck.Opt[k])
	}
	for _, k := range sortedKeys(ck.Extra) {
		add("extra."+k, ck.Extra[k])
	}
	meta := map[string]string{
		formatKey: format, "arch": ck.Arch, "mode": ck.Mode, "strategy": ck.Strategy,
		"version": strconv.FormatUint(ck.Version, 10), "steps": strconv.Itoa(ck.Steps), "opt_steps": strconv.Itoa(ck.OptSteps),
	}
	meta[digestKey] = digest(ts, meta)
	return atomicfile.Write(path, 0o644, func(w io.Writer) error { return nn.WriteSafetensors(w, ts, meta) })
}

// The metadata keys of the file's format and digest, and the format Save
// writes: "1" had no digest.
const (
	formatKey = "starling.checkpoint"
	digestKey = "sha256"
	format    = "2"
)

// digest returns the hex SHA-256 of a checkpoint's content: every
// metadata entry but the digest, by key, then every tensor's name, shape
// and values (little-endian float32), by name. Each string and list is
// preceded by its length, so no two contents encode alike. It covers what
// LoadCheckpoint reads, not how the header spells it.
func digest(ts []nn.Tensor, meta map[string]string) string {
	h := sha256.New()
	var buf []byte
	num := func(n int) { buf = binary.LittleEndian.AppendUint64(buf, uint64(n)) }
	str := func(s string) { num(len(s)); buf = append(buf, s...) }
	flush := func() { h.Write(buf); buf = buf[:0] }

	str("starling checkpoint " + format)
	keys := slices.DeleteFunc(slices.Sorted(maps.Keys(meta)), func(k string) bool { return k == digestKey })
	num(len(keys))
	for _, k := range keys {
		str(k)
		str(meta[k])
	}
	byName := slices.SortedFunc(slices.Values(ts), func(a, b nn.Tensor) int { return strings.Compare(a.Name, b.Name) })
	num(len(byName))
	for _, t := range byName {
		str(t.Name)
		num(len(t.Shape))
		for _, d := range t.Shape {
			num(d)
		}
		num(len(t.Data))
		for _, v := range t.Data {
			buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(v))
			if len(buf) >= 1<<16 {
				flush()
			}
		}
	}
	flush()
	return hex.EncodeToString(h.Sum(nil))
}

func sortedKeys(m map[string][]float32) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// LoadCheckpoint reads a checkpoint written by Save, holding at most
// maxValues float32 values in all. It refuses, with errors wrapping
// ErrCheckpoint, a file whose content does not match its digest (one
// changed byte anywhere in its tensors or metadata), a checkpoint of
// format 1, which has no digest, and values Save would not write.
func LoadCheckpoint(path string, maxValues int64) (*Checkpoint, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ts, meta, err := nn.ReadSafetensors(f, maxValues*4)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrCheckpoint, path, err)
	}
	switch meta[formatKey] {
	case format:
	case "1":
		return nil, fmt.Errorf("%w: %s is a checkpoint of format 1, which carries no digest to check its data against; it is not trusted (start afresh, or resume from a checkpoint this version wrote)", ErrCheckpoint, path)
	case "":
		return nil, fmt.Errorf("%w: %s is not a Starling checkpoint", ErrCheckpoint, path)
	default:
		return nil, fmt.Errorf("%w: %s is a checkpoint of format %q; this version reads format %s", ErrCheckpoint, path, meta[formatKey], format)
	}
	if got, want := digest(ts, meta), meta[digestKey]; got != want {
		return nil, fmt.Errorf("%w: %s: the SHA-256 digest of its data does not match the one it records (the file is damaged or was altered)", ErrCheckpoint, path)
	}
	ck := &Checkpoint{Arch: meta["arch"], Mode: meta["mode"], Strategy: meta["strategy"], Opt: map[string][]float32{}, Extra: map[string][]float32{}}
	if ck.Version, err = strconv.ParseUint(meta["version"], 10, 64); err != nil {
		return nil, fmt.Errorf("%w: %s: version %q", ErrCheckpoint, path, meta["version"])
	}
	if ck.Steps, err = count(meta["steps"]); err != nil {
		return nil, fmt.Errorf("%w: %s: steps %q", ErrCheckpoint, path, meta["steps"])
	}
	if ck.OptSteps, err = count(meta["opt_steps"]); err != nil {
		return nil, fmt.Errorf("%w: %s: opt_steps %q", ErrCheckpoint, path, meta["opt_steps"])
	}
	for _, t := range ts {
		switch {
		case t.Name == "state":
			ck.State = t.Data
		case t.Name == "params":
			ck.Params = t.Data
		case strings.HasPrefix(t.Name, "opt."):
			ck.Opt[strings.TrimPrefix(t.Name, "opt.")] = t.Data
		case strings.HasPrefix(t.Name, "extra."):
			ck.Extra[strings.TrimPrefix(t.Name, "extra.")] = t.Data
		default:
			return nil, fmt.Errorf("%w: %s: unknown tensor %q", ErrCheckpoint, path, t.Name)
		}
	}
	// A model with a NaN or ±Inf would only diverge later, far from the
	// cause (a damaged file, or one saved from a diverged run).
	for name, v := range map[string][]float32{"params": ck.Params, "state": ck.State} {
		if !device.AllFinite(v) {
			return nil, fmt.Errorf("%w: %s: %s holds NaN or ±Inf", ErrCheckpoint, path, name)
		}
	}
	return ck, nil
}

// count parses a non-negative count of steps.
func count(s string) (int, error) {
	n, err := strconv.ParseUint(s, 10, 62)
	return int(n), err
}

// Check reports whether ck fits a worker and mode: same architecture, and
// parameters of the model's size.
func (ck *Checkpoint) Check(w *Worker, mode string) error {
	if ck.Arch != w.Model.Arch {
		return fmt.Errorf("%w: checkpoint is for model %s, this run trains %s", ErrCheckpoint, ck.Arch, w.Model.Arch)
	}
	if ck.Mode != mode {
		return fmt.Errorf("%w: checkpoint is from --mode %s, this run is --mode %s", ErrCheckpoint, ck.Mode, mode)
	}
	return ck.checkParams(w.Model)
}

// checkParams reports whether ck's parameters, if it has any, fit m.
func (ck *Checkpoint) checkParams(m *nn.Model) error {
	if ck.Params != nil && len(ck.Params) != len(m.Params) {
		return fmt.Errorf("%w: checkpoint holds %d parameters, %s has %d", ErrCheckpoint, len(ck.Params), m.Arch, len(m.Params))
	}
	return nil
}

// ExportWeights writes the checkpoint's model (Params: in every mode, the
// parameters the peer held when it saved) to path as a PyTorch state dict,
// with m.SaveParams, the exporter of a live model's weights too. m is a
// model of the checkpoint's architecture; its names and shapes are used,
// its values are neither read nor changed. Errors wrap ErrCheckpoint for a
// checkpoint without parameters or of another model.
func (ck *Checkpoint) ExportWeights(m *nn.Model, path string) error {
	if ck.Params == nil {
		return fmt.Errorf("%w: checkpoint holds no model parameters", ErrCheckpoint)
	}
	if ck.Arch != m.Arch {
		return fmt.Errorf("%w: checkpoint is for model %s, not %s", ErrCheckpoint, ck.Arch, m.Arch)
	}
	if err := ck.checkParams(m); err != nil {
		return err
	}
	return m.SaveParams(path, ck.Params)
}

// Restore loads the checkpoint's local parameters and optimiser state into w.
func (ck *Checkpoint) Restore(w *Worker) error {
	if ck.Params != nil {
		copy(w.Model.Params, ck.Params)
	}
	w.Steps = ck.Steps
	return w.Opt.SetState(ck.OptSteps, ck.Opt)
}

// Capture fills the worker's part of a checkpoint (copies).
func (ck *Checkpoint) Capture(w *Worker) {
	ck.Arch = w.Model.Arch
	ck.Params = append(ck.Params[:0], w.Model.Params...)
	ck.Steps = w.Steps
	steps, st := w.Opt.State()
	ck.OptSteps = steps
	ck.Opt = map[string][]float32{}
	for k, v := range st {
		ck.Opt[k] = append([]float32(nil), v...)
	}
}
