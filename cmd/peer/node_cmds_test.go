package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/starling-ml/starling/node"
)

func TestKeygenAndID(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "id.key")
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"keygen", "--key", key}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	created := strings.TrimSpace(out.String())
	out.Reset()
	if err := run(context.Background(), []string{"id", "--key", key}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(out.String()); got != created || !strings.HasPrefix(got, "12D3KooW") {
		t.Fatalf("id printed %q, keygen %q", got, created)
	}
	if err := run(context.Background(), []string{"keygen", "--key", key}, &out, &errOut); err == nil {
		t.Fatal("keygen overwrote an existing key")
	}
	swarm := filepath.Join(dir, "swarm.key")
	if err := run(context.Background(), []string{"keygen", "--psk", "--out", swarm}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	if _, err := node.LoadPSK(swarm); err != nil {
		t.Fatal(err)
	}
}

// TestBenchTransfer runs both sides of 'peer bench transfer' in-process on
// loopback with a small tensor.
func TestBenchTransfer(t *testing.T) {
	dir := t.TempDir()
	addrFile := filepath.Join(dir, "addr")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srvCtx, stopSrv := context.WithCancel(ctx)
	srvErr := make(chan error, 1)
	var srvOut bytes.Buffer
	go func() {
		srvErr <- run(srvCtx, []string{"bench", "transfer", "--listen", "/ip4/127.0.0.1/tcp/0",
			"--tls-listen", "127.0.0.1:0", "--addr-file", addrFile}, &srvOut, os.Stderr)
	}()
	var addr string
	for addr == "" {
		select {
		case err := <-srvErr:
			t.Fatalf("server ended: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
		if b, err := os.ReadFile(addrFile); err == nil && len(b) > 0 && b[len(b)-1] == '\n' {
			addr = strings.TrimSpace(string(b))
		}
	}
	var out bytes.Buffer
	err := run(ctx, []string{"bench", "transfer", "--connect", addr, "--tls", "none", "--size-mib", "4", "--count", "2"}, &out, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "MB/s") {
		t.Fatalf("no throughput in output:\n%s", out.String())
	}
	stopSrv()
	if err := <-srvErr; err != nil {
		t.Fatal(err)
	}
	t.Log(out.String())
}
