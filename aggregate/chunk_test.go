package aggregate

import "testing"

func TestChunkElems(t *testing.T) {
	c := DefaultConfig()
	for _, tc := range []struct {
		d, n int
		algo Algorithm
		want int
	}{
		{16 << 20, 4, Butterfly, 256 << 10}, // 64 MB: 1 MiB chunks, 16 per shard
		{1 << 20, 4, Butterfly, 32 << 10},   // 4 MB: 8 chunks of 128 KiB per shard
		{1 << 18, 4, Butterfly, 16 << 10},   // 1 MB: never below 64 KiB
		{1000, 4, Tree, 16 << 10},           // small: one chunk
		{1 << 20, 4, Tree, 128 << 10},       // the tree pipelines the whole vector
	} {
		if got := c.chunkElems(tc.d, tc.n, tc.algo); got != tc.want {
			t.Errorf("d=%d n=%d %v: %d, want %d", tc.d, tc.n, tc.algo, got, tc.want)
		}
	}
	c.ChunkElems = 7 // an explicit small chunk is kept
	if got := c.chunkElems(1<<20, 4, Butterfly); got != 7 {
		t.Errorf("ChunkElems 7: got %d", got)
	}
}
