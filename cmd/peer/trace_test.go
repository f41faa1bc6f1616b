package main

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/starling-ml/starling/trace"
)

// TestTraceMerge runs two federated peers with --trace and merges their
// timelines: each has its compute, all-reduce and apply spans for every
// round, and the merged view ends each round's all-reduce together.
func TestTraceMerge(t *testing.T) {
	bin := binary(t)
	dir := t.TempDir()
	sw := swarmFlags(t, dir, 2)
	const rounds = 3
	files := make([]string, 2)
	procs := make([]*proc, 2)
	for i := range procs {
		files[i] = filepath.Join(dir, fmt.Sprintf("t%d.json", i))
		procs[i] = start(t, bin, append(append(common(rounds), "--trace", files[i]), sw(i)...)...)
	}
	for i, p := range procs {
		p.final(t, i)
	}
	for i, name := range files {
		f, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		evs, err := trace.Read(f)
		f.Close()
		if err != nil {
			t.Fatalf("peer %d's trace: %v", i, err)
		}
		have := map[string]bool{}
		for _, e := range evs {
			if r, ok := e.Args.Round(); ok && e.Ph == "X" {
				have[fmt.Sprintf("%s/%d", e.Name, r)] = true
			}
		}
		for r := 1; r <= rounds; r++ {
			for _, span := range []string{"compute", "allreduce", "apply"} {
				if !have[fmt.Sprintf("%s/%d", span, r)] {
					t.Errorf("peer %d's trace has no %s span in round %d", i, span, r)
				}
			}
		}
	}
	merged := filepath.Join(dir, "merged.json")
	var out, errb bytes.Buffer
	if err := run(context.Background(), append([]string{"trace", "merge", "-o", merged}, files...), &out, &errb); err != nil {
		t.Fatalf("peer trace merge: %v\n%s", err, errb.String())
	}
	f, err := os.Open(merged)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	evs, err := trace.Read(f)
	if err != nil {
		t.Fatal(err)
	}
	ends := map[int]map[int64]float64{}
	for _, e := range evs {
		if r, ok := e.Args.Round(); ok && e.Name == "allreduce" {
			if ends[e.PID] == nil {
				ends[e.PID] = map[int64]float64{}
			}
			ends[e.PID][r] = e.TS + e.Dur
		}
	}
	if len(ends) != 2 {
		t.Fatalf("merged trace has all-reduces of %d peers, want 2", len(ends))
	}
	for r := int64(1); r <= rounds; r++ {
		d := math.Abs(ends[1][r] - ends[2][r])
		if d > float64(500*time.Millisecond/time.Microsecond) {
			t.Errorf("round %d's all-reduce ends %.0f µs apart in the merged view", r, d)
		}
	}
	for _, bad := range [][]string{{"trace"}, {"trace", "split"}, {"trace", "merge"}, {"trace", "merge", filepath.Join(dir, "none.json")}} {
		if err := run(context.Background(), bad, &out, &errb); err == nil {
			t.Errorf("peer %s succeeds", strings.Join(bad, " "))
		}
	}
}
