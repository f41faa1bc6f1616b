package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"

	"github.com/starling-ml/starling/internal/atomicfile"
	"github.com/starling-ml/starling/trace"
)

func init() {
	register(&command{name: "trace", summary: "'peer trace merge': join several peers' --trace files into one timeline, aligned by round", run: runTrace})
}

func runTrace(_ context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "merge" {
		fmt.Fprintln(stderr, "usage: peer trace merge [-o FILE] TRACE.json…")
		if len(args) == 0 {
			return errors.New("trace: no subcommand given (want merge)")
		}
		return fmt.Errorf("trace: unknown subcommand %q (want merge)", args[0])
	}
	fs := flag.NewFlagSet("peer trace merge", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("o", "merged.trace.json", "write the merged timeline here (open it in ui.perfetto.dev or chrome://tracing)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return errors.New("trace merge: no trace files given")
	}
	var traces [][]trace.Event
	var names []string
	for _, name := range fs.Args() {
		evs, err := readTrace(name)
		if err != nil {
			return fmt.Errorf("trace merge: %s: %w", name, err)
		}
		traces = append(traces, evs)
		names = append(names, filepath.Base(name))
	}
	merged := trace.Merge(traces, names)
	err := atomicfile.Write(*out, 0o644, func(w io.Writer) error { return trace.Write(w, merged) })
	if err != nil {
		return fmt.Errorf("trace merge: %w", err)
	}
	fmt.Fprintf(stdout, "merged %d traces (%d events) into %s\n", len(traces), len(merged), *out)
	return nil
}
