package aggregate

import (
	"testing"

	"github.com/starling-ml/starling/aggregate/rule"
)

func TestResolveAuto(t *testing.T) {
	c := DefaultConfig() // mean, TreeMaxBytes 64 KiB
	for _, tc := range []struct {
		bytes, n int
		want     Algorithm
	}{
		{4 << 10, 2, Tree},
		{64 << 10, 3, Tree},
		{64 << 10, 4, Tree},
		{64<<10 + 4, 4, Ring},
		{80 << 10, 5, Tree}, // 64 KiB·4/3 = 85.3 KiB
		{88 << 10, 5, Ring},
		{128 << 10, 8, Tree}, // 64 KiB·7/3 = 149.3 KiB
		{160 << 10, 8, Ring},
		{640 << 10, 32, Tree}, // 661 KiB
		{1 << 20, 32, Ring},
	} {
		if got := c.resolve(tc.bytes/4, tc.n); got != tc.want {
			t.Errorf("%d bytes among %d: %v, want %v", tc.bytes, tc.n, got, tc.want)
		}
	}
	c.TreeMaxBytes = 0
	if got := c.resolve(1, 8); got != Ring {
		t.Errorf("TreeMaxBytes 0: %v for one value, want ring", got)
	}
	c.TreeMaxBytes = 64 << 10
	c.Rule = rule.Median{}
	if got := c.resolve(1, 8); got != Butterfly {
		t.Errorf("median: %v, want butterfly", got)
	}
	c.Rule, c.Algorithm = rule.Mean{}, Ring
	if got := c.resolve(1, 8); got != Ring {
		t.Errorf("told ring: %v", got)
	}
}
