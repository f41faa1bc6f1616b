package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

func init() {
	register(&command{name: "version", summary: "print the version, the commit and the Go toolchain this binary was built with", run: runVersion})
}

// version is set by release builds (-ldflags "-X main.version=v0.3.0");
// without it the module's version or the VCS revision is shown.
var version = ""

func runVersion(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("peer version", flag.ContinueOnError)
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("version: unexpected argument %q", fs.Arg(0))
	}
	info, _ := debug.ReadBuildInfo()
	fmt.Fprintln(stdout, versionLine(version, info, runtime.GOOS, runtime.GOARCH))
	return nil
}

// versionLine formats what `peer version` prints from the release version
// (may be empty) and the binary's build info (may be nil).
func versionLine(release string, info *debug.BuildInfo, goos, goarch string) string {
	v, rev, dirty, gover := release, "", "", runtime.Version()
	if info != nil {
		gover = info.GoVersion
		if v == "" && info.Main.Version != "" && info.Main.Version != "(devel)" {
			v = info.Main.Version
		}
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				if s.Value == "true" {
					dirty = "+dirty"
				}
			}
		}
	}
	if v == "" {
		v = "devel"
	}
	line := "peer " + v
	if rev != "" {
		line += fmt.Sprintf(" (%.12s%s)", rev, dirty)
	}
	return fmt.Sprintf("%s %s %s/%s", line, gover, goos, goarch)
}
