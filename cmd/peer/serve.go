package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/starling-ml/starling/internal/serve"
)

func init() {
	register(&command{name: "serve", summary: "serve one local process (the Python package) a swarm membership: all-reduce through shared memory", run: runServe})
}

// defaultSocket is where peer serve listens without --socket.
func defaultSocket() string {
	dir := os.Getenv("XDG_RUNTIME_DIR")
	if dir == "" {
		dir = os.TempDir()
	}
	return filepath.Join(dir, "starling-peer.sock")
}

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("serve", stderr)
	socket := fs.String("socket", defaultSocket(), "Unix socket to listen on (the client's control channel)")
	once := fs.Bool("once", false, "exit when the first client's session ends (the Python package starts serve so)")
	clientWait := fs.Duration("client-wait", 0, "exit with an error if no client connects within this long (0: wait for ever)")
	logLevel := fs.String("log-level", "warn", "log level: debug, info, warn, error")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("serve: unexpected arguments %q (swarm flags come with the client's join)", fs.Args())
	}
	log, err := textLogger(*logLevel, stderr)
	if err != nil {
		return err
	}
	cfg := serve.Config{Socket: *socket, Once: *once, ClientWait: *clientWait, Log: log, Join: serveJoin(stderr)}
	return serve.Serve(ctx, cfg, func(s string) { fmt.Fprintf(stdout, "peer serve: listening on %s\n", s) })
}

// serveJoin parses a join request's arguments with peer run's flags: the
// network, membership and all-reduce flags count (--swarm, --listen,
// --connect, --psk, --min-peers, --wait, --aggregate, --compress,
// --stall-timeout, …); the training flags are accepted and ignored.
func serveJoin(stderr io.Writer) serve.JoinFunc {
	return func(args []string) (serve.JoinConfig, error) {
		fs := newFlagSet("serve join", io.Discard)
		build := runFlags(fs, stderr)
		if err := fs.Parse(args); err != nil {
			return serve.JoinConfig{}, err
		}
		if fs.NArg() > 0 {
			return serve.JoinConfig{}, fmt.Errorf("unexpected arguments %q", fs.Args())
		}
		o, err := build()
		if err != nil {
			return serve.JoinConfig{}, err
		}
		o.Swarm.Aggregate.Compress = o.Compress
		if err := o.Swarm.Validate(); err != nil {
			return serve.JoinConfig{}, err
		}
		o.Swarm.Log = o.Log
		wait := o.Wait
		if wait <= 0 {
			wait = 2 * time.Minute
		}
		return serve.JoinConfig{Swarm: o.Swarm, Connect: o.Connect, MinPeers: o.MinPeers, Wait: wait}, nil
	}
}
