package main

import (
	"context"
	"encoding/json"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestMain runs the test binary as a peer when the parent of TestSwarm
// started it as one (runParent re-executes os.Executable()).
func TestMain(m *testing.M) {
	k, v, _ := strings.Cut(childEnv, "=")
	if os.Getenv(k) == v {
		if err := run(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr); err != nil {
			os.Stderr.WriteString("library: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestSwarm runs the example end to end, small: 3 peer processes on
// loopback train for 200 steps; they must end with bit-identical models
// that beat both chance (33%) and a linear classifier (under 50%).
func TestSwarm(t *testing.T) {
	js := filepath.Join(t.TempDir(), "out.json")
	var out, errb strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := run(ctx, []string{"-steps", "200", "-points", "400", "-target", "0.6", "-timeout", "50s", "-json", js},
		strings.NewReader(""), &out, &errb)
	if err != nil {
		t.Fatalf("%v\nstdout:\n%s\nstderr:\n%s", err, out.String(), errb.String())
	}
	b, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	var res []result
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	if len(res) != 3 {
		t.Fatalf("%d results, want 3:\n%s", len(res), b)
	}
	t.Logf("%s", out.String())
	ids := map[string]bool{}
	for i, r := range res {
		ids[r.ID] = true
		if r.Peer != i || r.Steps != 200 || r.Digest != res[0].Digest || !(r.Accuracy > 0.6) {
			t.Errorf("peer %d: %+v; want 200 steps, the digest of peer 0 (%.12s) and accuracy > 60%%", i, r, res[0].Digest)
		}
	}
	if len(ids) != 3 {
		t.Errorf("peer IDs %v: want 3 distinct peers", ids)
	}
	if !strings.Contains(out.String(), "all 3 peers hold the same model") {
		t.Errorf("no summary line in:\n%s", out.String())
	}
}

// TestBadFlags: bad settings fail with one line before any peer starts.
func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-peers", "0"}, {"-peers", "3", "-peer", "3"}, {"-steps", "0"}, {"-target", "1.5"},
		{"-timeout", "0s"}, {"-points", "0"}, {"-noise", "-1"}, {"-classes", "1"}, {"extra"}, {"-nonsense"},
	} {
		var out, errb strings.Builder
		err := run(context.Background(), args, strings.NewReader(""), &out, &errb)
		if err == nil {
			t.Errorf("%v: want an error", args)
			continue
		}
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: error %q spans lines", args, err)
		}
		if out.Len() > 0 || strings.Contains(errb.String(), "peer 0:") {
			t.Errorf("%v: a peer started:\n%s%s", args, out.String(), errb.String())
		}
	}
}

// TestPublicImportsOnly: the example uses Starling as a library, so its
// program imports none of Starling's internal packages.
func TestPublicImportsOnly(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	seen := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, im := range af.Imports {
			path, _ := strconv.Unquote(im.Path.Value)
			if strings.HasPrefix(path, "github.com/starling-ml/starling/") {
				seen++
			}
			if path == "internal" || strings.HasPrefix(path, "internal/") || strings.Contains(path, "/internal/") || strings.HasSuffix(path, "/internal") {
				t.Errorf("%s imports %s", f, path)
			}
		}
	}
	if seen == 0 {
		t.Fatal("found no import of Starling: is the test looking at the right files?")
	}
}
