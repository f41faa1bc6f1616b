package p2p_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/starling-ml/starling/aggregate"
	"github.com/starling-ml/starling/aggregate/aggtest"
	"github.com/starling-ml/starling/compression"
)

// TestCompressedOnMocknet: a compressed all-reduce over node/ streams gives
// the same bits as over aggtest's in-memory network (the packed bytes,
// NaN-looking words included, cross the wire unchanged), round after round
// with error feedback.
func TestCompressedOnMocknet(t *testing.T) {
	const n, d = 4, 20_000
	// The words on the wire are bytes, not floats: some read as NaN.
	srcs, _ := randVecs(9, 1, d)
	c, _ := compression.Parse("topk:0.05,entropy=none")
	b := c.Encode(nil, srcs[0])
	nan := 0
	for i := 0; i+4 <= len(b); i += 4 {
		if w := binary.LittleEndian.Uint32(b[i:]); w&0x7f800000 == 0x7f800000 && w&0x7fffff != 0 {
			nan++
		}
	}
	if nan == 0 {
		t.Fatal("no NaN-looking word in a top-k encoding: the test would not show that they survive")
	}
	nodes := newMocknet(t, n, time.Millisecond, 0)
	for _, algo := range []aggregate.Algorithm{aggregate.Tree, aggregate.Butterfly} {
		for _, spec := range []string{"topk:0.05,ef", "int8:ef", "powersgd:2,ef"} {
			t.Run(fmt.Sprintf("%v/%s", algo, spec), func(t *testing.T) {
				cfg := aggregate.DefaultConfig()
				cfg.Algorithm, cfg.StallTimeout, cfg.Compress, cfg.ChunkElems = algo, 5*time.Second, compression.MustSpec(spec), 1024
				ps := newPeers(t, nodes, cfg, nil)
				mem := aggtest.NewNetwork(aggtest.Config{})
				var ref []*aggregate.Runner
				for _, id := range ps.ids {
					r, err := aggregate.NewRunner(id, mem.Join(id), cfg)
					if err != nil {
						t.Fatal(err)
					}
					ref = append(ref, r)
				}
				ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
				defer cancel()
				for round := uint64(1); round <= 3; round++ {
					g, _ := aggregate.Form(round, ps.ids)
					srcs, w := randVecs(round, n, d)
					outs := aggtest.RunRound(ctx, ps.runners, g, srcs, w)
					want := aggtest.RunRound(ctx, ref, g, srcs, w)
					for i := range n {
						if outs[i].Err != nil || want[i].Err != nil {
							t.Fatalf("round %d peer %d: %v / %v", round, i, outs[i].Err, want[i].Err)
						}
						for k, v := range outs[i].Out {
							if math.Float32bits(v) != math.Float32bits(want[i].Out[k]) {
								t.Fatalf("round %d peer %d coord %d: %v over node/, %v in memory", round, i, k, v, want[i].Out[k])
							}
						}
					}
					for i := range n {
						st := ps.runners[i].Compression().AppendState(nil)
						if string(st) != string(ref[i].Compression().AppendState(nil)) {
							t.Fatalf("round %d peer %d: compression state differs", round, i)
						}
					}
				}
			})
		}
	}
}
