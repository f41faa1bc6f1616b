package cli

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLayerPrecedence(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "c.json")
	os.WriteFile(cfg, []byte(`{"lr": 0.5, "model": "cnn", "peers": ["a", "b"], "rounds": 9}`), 0o644)
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	lr := fs.Float64("lr", 0.1, "")
	model := fs.String("model", "mlp", "")
	rounds := fs.Int("rounds", 1, "")
	var peers List
	fs.Var(&peers, "peers", "")
	fs.String("config", "", "")
	if err := fs.Parse([]string{"--lr", "0.2"}); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"STARLING_ROUNDS": "7"}
	if err := Layer(fs, cfg, func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	if *lr != 0.2 || *model != "cnn" || *rounds != 7 || peers.String() != "a,b" {
		t.Fatalf("lr %v model %v rounds %v peers %v", *lr, *model, *rounds, peers)
	}
}

func TestLayerErrors(t *testing.T) {
	dir := t.TempDir()
	newFS := func() *flag.FlagSet {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		fs.Int("rounds", 1, "")
		return fs
	}
	n := 0
	write := func(s string) string {
		n++
		p := filepath.Join(dir, fmt.Sprintf("c%d.json", n))
		os.WriteFile(p, []byte(s), 0o644)
		return p
	}
	cases := map[string]struct {
		path string
		env  map[string]string
		want string
	}{
		"unknown key": {write(`{"bogus": 1}`), nil, "unknown setting"},
		"not json":    {write(`rounds=3`), nil, "not a JSON object"},
		"bad value":   {write(`{"rounds": "many"}`), nil, "rounds"},
		"missing":     {filepath.Join(dir, "nope.json"), nil, "config file"},
		"bad env":     {"", map[string]string{"STARLING_ROUNDS": "x"}, "STARLING_ROUNDS"},
	}
	for name, c := range cases {
		err := Layer(newFS(), c.path, func(k string) string { return c.env[k] })
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want one mentioning %q", name, err, c.want)
		}
	}
}
