package main

import (
	"bytes"
	"context"
	"runtime/debug"
	"strings"
	"testing"
)

func TestVersionLine(t *testing.T) {
	vcs := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "01e34b8a1b2c3d4e5f60718293a4b5c6d7e8f901"}, {Key: "vcs.modified", Value: "true"},
	}}
	for _, c := range []struct {
		release string
		info    *debug.BuildInfo
		want    string
	}{
		{"v0.3.0", vcs, "peer v0.3.0 (01e34b8a1b2c+dirty) go1.26.8 linux/arm64"},
		{"", vcs, "peer devel (01e34b8a1b2c+dirty) go1.26.8 linux/arm64"},
		{"", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v1.2.3"}}, "peer v1.2.3 go1.26.8 linux/arm64"},
	} {
		if got := versionLine(c.release, c.info, "linux", "arm64"); got != c.want {
			t.Errorf("versionLine(%q) = %q, want %q", c.release, got, c.want)
		}
	}
}

func TestVersionCommandAndHelp(t *testing.T) {
	var out, errb bytes.Buffer
	if err := run(context.Background(), []string{"version"}, &out, &errb); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "peer ") {
		t.Errorf("peer version printed %q", out.String())
	}
	if err := run(context.Background(), []string{"version", "x"}, &out, &errb); err == nil {
		t.Error("peer version accepts an argument")
	}
	// peer -h lists every registered command.
	out.Reset()
	if err := run(context.Background(), []string{"-h"}, &out, &errb); err != nil {
		t.Fatal(err)
	}
	for name := range commands {
		if !strings.Contains(out.String(), "\n  "+name+" ") {
			t.Errorf("peer -h does not list %q:\n%s", name, out.String())
		}
	}
}
