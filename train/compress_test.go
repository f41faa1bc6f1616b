package train

import (
	"errors"
	"math"
	"path/filepath"
	"slices"
	"testing"

	"github.com/starling-ml/starling/aggregate"
	"github.com/starling-ml/starling/aggregate/aggtest"
	"github.com/starling-ml/starling/compression"
	"github.com/starling-ml/starling/nn"
	"github.com/starling-ml/starling/peerid"
)

func TestCompressionLayout(t *testing.T) {
	m, err := nn.New("mlp", 1)
	if err != nil {
		t.Fatal(err)
	}
	got := CompressionLayout(m)
	want := []compression.Shape{{Rows: 200, Cols: 784}, {Rows: 1, Cols: 200}, {Rows: 200, Cols: 200}, {Rows: 1, Cols: 200}, {Rows: 10, Cols: 200}, {Rows: 1, Cols: 10}}
	if !slices.Equal(got, want) {
		t.Fatalf("layout %v, want %v", got, want)
	}
	c, err := nn.New("cnn", 1)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, s := range CompressionLayout(c) {
		n += s.Rows * s.Cols
	}
	if n != len(c.Params) {
		t.Fatalf("cnn layout covers %d of %d values", n, len(c.Params))
	}
}

func TestBytesToWords(t *testing.T) {
	for n := range 10 {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(0xff - i)
		}
		got, err := wordsToBytes(bytesToWords(b))
		if err != nil || !slices.Equal(got, b) {
			t.Fatalf("%d bytes: %x, %v", n, got, err)
		}
	}
	for _, w := range [][]float32{nil, {math.Float32frombits(9), 0}, {math.Float32frombits(1)}} {
		if _, err := wordsToBytes(w); err == nil {
			t.Errorf("%v: want error", w)
		}
	}
}

// TestCompressionCheckpoint: the compressed all-reduce's state goes through
// a checkpoint file and back into a fresh runner, bit for bit; a state of
// another codec is refused.
func TestCompressionCheckpoint(t *testing.T) {
	for _, spec := range []string{"topk:0.1,ef", "powersgd:2,ef", "sign:ef"} {
		t.Run(spec, func(t *testing.T) {
			m, _ := nn.New("mlp:784-16-10", 1)
			d := len(m.Params)
			ids := []peerid.ID{"a", "b"}
			runners := func() []*aggregate.Runner {
				net := aggtest.NewNetwork(aggtest.Config{})
				cfg := aggregate.DefaultConfig()
				cfg.Compress = compression.MustSpec(spec)
				var rs []*aggregate.Runner
				for _, id := range ids {
					r, err := aggregate.NewRunner(id, net.Join(id), cfg)
					if err != nil {
						t.Fatal(err)
					}
					if err := PrepareCompression(r.Compression(), m, nil); err != nil {
						t.Fatal(err)
					}
					rs = append(rs, r)
				}
				return rs
			}
			rs := runners()
			srcs := [][]float32{make([]float32, d), make([]float32, d)}
			for round := uint64(1); round <= 3; round++ {
				for i := range srcs {
					for k := range srcs[i] {
						srcs[i][k] = float32(math.Sin(float64(k*int(round)+i)) / 10)
					}
				}
				g, _ := aggregate.Form(round, ids)
				for i, o := range aggtest.RunRound(t.Context(), rs, g, srcs, nil) {
					if o.Err != nil {
						t.Fatalf("peer %d: %v", i, o.Err)
					}
				}
			}
			path := filepath.Join(t.TempDir(), "ck.safetensors")
			ck := &Checkpoint{Arch: m.Arch, Mode: "sync", Params: m.Params}
			SaveCompression(ck, rs[0].Compression())
			if err := ck.Save(path); err != nil {
				t.Fatal(err)
			}
			back, err := LoadCheckpoint(path, 1<<24)
			if err != nil {
				t.Fatal(err)
			}
			fresh := runners()
			if err := PrepareCompression(fresh[0].Compression(), m, back); err != nil {
				t.Fatal(err)
			}
			if a, b := rs[0].Compression().AppendState(nil), fresh[0].Compression().AppendState(nil); !slices.Equal(a, b) {
				t.Fatal("state differs after the checkpoint")
			}
			if r := rs[0].Compression().Residual(); len(r) != d || slices.Max(r) == 0 {
				t.Fatalf("residual of %d values, max %v: error feedback did nothing", len(r), slices.Max(r))
			}

			net := aggtest.NewNetwork(aggtest.Config{})
			cfg := aggregate.DefaultConfig()
			cfg.Compress = compression.MustSpec("fp16")
			other, _ := aggregate.NewRunner("c", net.Join("c"), cfg)
			if err := LoadCompression(back, other.Compression()); !errors.Is(err, ErrCheckpoint) || !errors.Is(err, compression.ErrState) {
				t.Fatalf("state of %s into fp16: %v", spec, err)
			}
			back.Extra[ExtraCompression] = back.Extra[ExtraCompression][:3]
			if err := LoadCompression(back, fresh[1].Compression()); !errors.Is(err, ErrCheckpoint) {
				t.Fatalf("truncated state: %v", err)
			}
			if err := LoadCompression(&Checkpoint{}, fresh[1].Compression()); err != nil {
				t.Fatalf("checkpoint without state: %v", err)
			}
			if err := PrepareCompression(nil, m, back); err != nil {
				t.Fatalf("no compression: %v", err)
			}
		})
	}
}
