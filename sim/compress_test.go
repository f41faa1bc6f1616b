package sim

import (
	"errors"
	"strings"
	"testing"

	"github.com/starling-ml/starling/compression"
	"github.com/starling-ml/starling/data"
)

func compressMNIST(t *testing.T) (*data.Set, *data.Set) {
	t.Helper()
	tr, te, err := data.LoadMNIST("")
	if errors.Is(err, data.ErrNoDataset) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return tr.Head(2400), te.Head(1000)
}

// TestRunSmall trains a logistic regression on 2 400 samples for an epoch
// with three codecs: every run learns, compressed runs send fewer bytes by
// about the codec's ratio, and the fp32 row is the reference of the others.
func TestCompressionSmall(t *testing.T) {
	tr, te := compressMNIST(t)
	cfg := DefaultCompressConfig()
	cfg.Peers, cfg.Epochs = 3, 1
	cfg.Worker.Model, cfg.Worker.Batch, cfg.Worker.LR = "logreg", 32, 0.1
	cfg.Codecs = specs("fp32", "int8", "topk:0.05,ef")
	var lines []string
	rows, err := Compression(t.Context(), cfg, tr, te, func(s string) { lines = append(lines, s) })
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 3 || len(lines) != 3*(cfg.Epochs+1) {
		t.Fatalf("%d rows, %d progress lines", len(rows), len(lines))
	}
	steps := cfg.Epochs * ((2400/3 + 31) / 32)
	for _, r := range rows {
		if r.Steps != steps || len(r.Curve) != cfg.Epochs || r.FinalAccuracy < 0.75 || r.BytesPerPeer <= 0 {
			t.Fatalf("row %+v (want %d steps)", r, steps)
		}
	}
	if rows[0].Ratio != 1 || rows[0].DeltaPP != 0 || rows[0].ErrorFeedback || !rows[2].ErrorFeedback {
		t.Fatalf("fp32 row %+v, topk row %+v", rows[0], rows[2])
	}
	if r := rows[1].Ratio; r < 3.5 || r > 4 {
		t.Errorf("int8 sends %.2f× fewer bytes, want about 4", r)
	}
	if r := rows[2].Ratio; r < 5 {
		t.Errorf("topk:0.05 sends %.2f× fewer bytes", r)
	}
	for _, r := range rows[1:] {
		if d := rows[0].FinalAccuracy - r.FinalAccuracy; d > 0.05 {
			t.Errorf("%s loses %.1f pp", r.Codec, 100*d)
		}
	}
	tab := CompressTable(rows)
	if !strings.Contains(tab, "topk:0.05,ef") || strings.Count(tab, "\n") != 4 {
		t.Fatalf("table:\n%s", tab)
	}
	mean := MeanCompressRows([][]CompressRow{rows, rows})
	if mean[2].FinalAccuracy != rows[2].FinalAccuracy || mean[2].Ratio != rows[2].Ratio {
		t.Fatalf("mean of two equal runs: %+v", mean[2])
	}
}

func TestCompressConfigValidate(t *testing.T) {
	for _, f := range []func(*CompressConfig){
		func(c *CompressConfig) { c.Peers = 0 },
		func(c *CompressConfig) { c.Epochs = 0 },
		func(c *CompressConfig) { c.Codecs = nil },
		func(c *CompressConfig) { c.Worker.Batch = 0 },
	} {
		c := DefaultCompressConfig()
		f(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%+v: want error", c)
		}
	}
	if err := DefaultCompressConfig().Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestDiverged: a run whose loss blows up is a row that says so, and the
// runs after it still run.
func TestCompressionDiverged(t *testing.T) {
	tr, te := compressMNIST(t)
	cfg := DefaultCompressConfig()
	cfg.Peers, cfg.Epochs = 2, 1
	cfg.Worker.Model, cfg.Worker.Batch, cfg.Worker.LR = "mlp:784-32-32-10", 32, 1e30
	cfg.Codecs = specs("fp32", "fp16")
	rows, err := Compression(t.Context(), cfg, tr, te, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if r.DivergedAt < 1 || r.DivergedAt > r.Steps || len(r.Curve) != 0 || r.BytesPerStep <= 0 {
			t.Fatalf("row %+v: want a divergence in the first epoch", r)
		}
	}
	if !strings.Contains(CompressTable(rows), "diverged at step") {
		t.Fatalf("table:\n%s", CompressTable(rows))
	}
}

func specs(ss ...string) []compression.Spec {
	var out []compression.Spec
	for _, s := range ss {
		out = append(out, compression.MustSpec(s))
	}
	return out
}
