package spec

import (
	"errors"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, c := range []struct {
		in   string
		want string // terms' String joined by '+'
	}{
		{"mean", "mean"},
		{" TopK : 0.01 , EF ", "topk:0.01,EF"},
		{"krum:f=2,m=3", "krum:f=2,m=3"},
		{"poly:0.5+ssp:3", "poly:0.5+ssp:3"},
		{"warmup:100+cosine", "warmup:100+cosine"},
		{"mlp:784-200-10", "mlp:784-200-10"},
		{"int8:Block=256", "int8:block=256"},
	} {
		ts, err := Parse(c.in)
		if err != nil {
			t.Errorf("%q: %v", c.in, err)
			continue
		}
		var got []string
		for _, term := range ts {
			got = append(got, term.String())
		}
		if g := strings.Join(got, "+"); g != c.want {
			t.Errorf("%q: %q, want %q", c.in, g, c.want)
		}
	}
	for _, bad := range []string{"", "  ", "topk:", ":0.1", "a+", "krum:f=", "krum:=2", "krum:f=1,,m=2", "krum:f=1,f=2", strings.Repeat("x", MaxLen+1)} {
		if _, err := Parse(bad); !errors.Is(err, ErrSyntax) {
			t.Errorf("%q: %v, want ErrSyntax", bad, err)
		}
	}
	if _, err := One("a+b"); !errors.Is(err, ErrSyntax) {
		t.Errorf("One of two terms: %v", err)
	}
}

func TestReader(t *testing.T) {
	read := func(s string) (frac float64, block int, ef bool, mode string, err error) {
		term, err := One(s)
		if err != nil {
			return 0, 0, false, "", err
		}
		r := term.Reader()
		ef = r.Flag("ef")
		frac = r.Float("frac", 0.01, In(0, 1, false, true))
		block = r.Int("block", 256, 1, 1<<20)
		mode = r.String("mode", "auto", "auto", "none")
		return frac, block, ef, mode, r.Done()
	}
	for _, c := range []struct {
		in    string
		frac  float64
		block int
		ef    bool
		mode  string
	}{
		{"x", 0.01, 256, false, "auto"},
		{"x:0.5", 0.5, 256, false, "auto"},
		{"x:ef,0.5", 0.5, 256, true, "auto"},
		{"x:0.5,ef", 0.5, 256, true, "auto"},
		{"x:1%", 0.01, 256, false, "auto"},
		{"x:block=8,frac=0.2", 0.2, 8, false, "auto"},
		{"x:0.2,8", 0.2, 8, false, "auto"},
		{"x:ef=false,mode=NONE", 0.01, 256, false, "none"},
	} {
		frac, block, ef, mode, err := read(c.in)
		if err != nil || frac != c.frac || block != c.block || ef != c.ef || mode != c.mode {
			t.Errorf("%q: %v %v %v %v %v", c.in, frac, block, ef, mode, err)
		}
	}
	for in, want := range map[string]string{
		"x:2":            `frac="2": want a number in (0, 1]`,
		"x:nan":          `frac="nan": want a number in (0, 1]`,
		"x:frac=0.1,q=1": `unknown parameter "q" (has ef, frac, block, mode)`,
		"x:0.1,2,auto,4": `too many values`,
		"x:block=0":      `block="0": want an integer in [1, 1048576]`,
		"x:mode=zip":     `mode="zip": want one of auto, none`,
		"x:ef=maybe":     `ef="maybe": want true or false`,
	} {
		_, _, _, _, err := read(in)
		if !errors.Is(err, ErrSyntax) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), `"`+in+`"`) {
			t.Errorf("%q: %v, want …%s", in, err, want)
		}
	}
	term, _ := One("sum:1")
	if err := term.Reader().Done(); err == nil || !strings.Contains(err.Error(), "takes no arguments") {
		t.Errorf("sum:1: %v", err)
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"topk:0.01,ef", "poly:0.5+ssp:3", "krum:f=2,m=3", "a:b=c+d"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ts, err := Parse(s)
		if err != nil {
			return
		}
		for _, term := range ts {
			r := term.Reader()
			r.Flag("ef")
			r.Float("a", 0)
			r.Int("b", 0, 0, 10)
			r.String("c", "")
			_ = r.Done()
			if again, err := One(term.String()); err != nil || again.String() != term.String() {
				t.Fatalf("%q: term %q does not reparse: %v", s, term.String(), err)
			}
		}
	})
}
