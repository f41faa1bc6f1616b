package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

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

// TestKeygenOut checks that every form of 'peer keygen' writes where --out
// (or --key) says and nowhere else: the default identity file must stay
// absent, and contradictory forms are refused.
func TestKeygenOut(t *testing.T) {
	cfgDir := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", cfgDir)
	t.Setenv("HOME", cfgDir)
	dir := t.TempDir()
	t.Chdir(dir)
	f := func(name string) string { return filepath.Join(dir, name) }
	for _, tc := range []struct {
		args    []string
		created string // "" when the command must fail
		psk     bool
	}{
		{args: []string{"--out", f("a.key")}, created: f("a.key")},
		{args: []string{"--key", f("b.key")}, created: f("b.key")},
		{args: []string{"--key", f("c.key"), "--out", f("c.key")}, created: f("c.key")},
		{args: []string{"--key", f("d.key"), "--out", f("e.key")}},
		{args: []string{"--psk", "--out", f("s1.key")}, created: f("s1.key"), psk: true},
		{args: []string{"--psk"}, created: f("swarm.key"), psk: true},
		{args: []string{"--psk", "--key", f("s2.key")}},
		{args: []string{f("g.key")}},
		{args: []string{"--out", f("a.key")}}, // exists: never overwritten
		{args: []string{"--psk", "--out", f("s1.key")}},
	} {
		before, _ := os.ReadFile(f("a.key"))
		var out, errOut bytes.Buffer
		err := run(context.Background(), append([]string{"keygen"}, tc.args...), &out, &errOut)
		if tc.created == "" {
			if err == nil {
				t.Errorf("keygen %v: succeeded, want an error", tc.args)
			}
			if after, _ := os.ReadFile(f("a.key")); !bytes.Equal(before, after) {
				t.Errorf("keygen %v changed a.key", tc.args)
			}
			continue
		}
		if err != nil {
			t.Errorf("keygen %v: %v", tc.args, err)
			continue
		}
		if tc.psk {
			if _, err := node.LoadPSK(tc.created); err != nil {
				t.Errorf("keygen %v: %v", tc.args, err)
			}
			continue
		}
		sk, err := node.LoadIdentity(tc.created)
		if err != nil {
			t.Errorf("keygen %v: %v", tc.args, err)
			continue
		}
		id, _ := peer.IDFromPrivateKey(sk)
		if got := strings.TrimSpace(out.String()); got != id.String() {
			t.Errorf("keygen %v printed %q, file holds %s", tc.args, got, id)
		}
	}
	for _, stray := range []string{f("d.key"), f("e.key"), f("g.key"), f("s2.key"), defaultKeyFile()} {
		if _, err := os.Stat(stray); err == nil {
			t.Errorf("%s was written", stray)
		}
	}
	if !strings.HasPrefix(defaultKeyFile(), cfgDir) {
		t.Fatalf("default key file %s is outside the test's config dir", defaultKeyFile())
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
