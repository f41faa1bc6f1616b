package node

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	rcmgr "github.com/libp2p/go-libp2p/p2p/host/resource-manager"
	ma "github.com/multiformats/go-multiaddr"
)

func TestIdentityPersists(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "identity.key")
	sk, err := LoadOrCreateIdentity(path)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v, want 0600", st.Mode().Perm())
	}
	again, err := LoadOrCreateIdentity(path)
	if err != nil {
		t.Fatal(err)
	}
	if !sk.Equals(again) {
		t.Fatal("reloaded a different key")
	}
	id, _ := peer.IDFromPrivateKey(sk)
	if got, _ := PeerIDFromKeyFile(path); got != id {
		t.Fatalf("PeerIDFromKeyFile %s, want %s", got, id)
	}
	// A node started from the key file has that identity.
	n := newTestNode(t, func(c *Config) { c.KeyFile = path })
	if n.ID() != id {
		t.Fatalf("node ID %s, want %s", n.ID(), id)
	}
}

func TestKeyFileRefused(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "identity.key")
	if _, err := LoadOrCreateIdentity(path); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []fs.FileMode{0o644, 0o640, 0o604, 0o660} {
		os.Chmod(path, mode)
		if _, err := LoadOrCreateIdentity(path); !errors.Is(err, ErrKeyPermissions) {
			t.Fatalf("mode %v: got %v, want ErrKeyPermissions", mode, err)
		}
	}
	junk := filepath.Join(dir, "junk.key")
	os.WriteFile(junk, []byte("not a key"), 0o600)
	if _, err := LoadIdentity(junk); !errors.Is(err, ErrBadKey) {
		t.Fatalf("junk: got %v, want ErrBadKey", err)
	}
	huge := filepath.Join(dir, "huge.key")
	os.WriteFile(huge, make([]byte, 1<<20), 0o600)
	if _, err := LoadIdentity(huge); !errors.Is(err, ErrBadKey) {
		t.Fatalf("huge: got %v, want ErrBadKey", err)
	}
}

func TestPSKFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "swarm.key")
	psk, err := GeneratePSK()
	if err != nil {
		t.Fatal(err)
	}
	if err := WritePSK(path, psk); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	if !strings.HasPrefix(string(b), "/key/swarm/psk/1.0.0/\n/base16/\n") {
		t.Fatalf("not in swarm.key format:\n%s", b)
	}
	got, err := LoadPSK(path)
	if err != nil || string(got) != string(psk) {
		t.Fatalf("LoadPSK: %v", err)
	}
	if err := WritePSK(path, psk); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("overwrite: got %v, want ErrExist", err)
	}
	os.Chmod(path, 0o644)
	if _, err := LoadPSK(path); !errors.Is(err, ErrKeyPermissions) {
		t.Fatalf("got %v, want ErrKeyPermissions", err)
	}
	bad := filepath.Join(dir, "bad.key")
	os.WriteFile(bad, []byte("/key/swarm/psk/1.0.0/\n/base16/\nzz\n"), 0o600)
	if _, err := LoadPSK(bad); !errors.Is(err, ErrBadPSK) {
		t.Fatalf("got %v, want ErrBadPSK", err)
	}
	// Two nodes sharing the file form a swarm.
	os.Chmod(path, 0o600)
	a := newTestNode(t, func(c *Config) { c.PSKFile = path })
	bn := newTestNode(t, func(c *Config) { c.PSKFile = path })
	connect(t, a, bn)
}

func TestConfigValidate(t *testing.T) {
	def := DefaultConfig()
	if err := def.Validate(); err != nil {
		t.Fatalf("DefaultConfig invalid: %v", err)
	}
	tc := TestConfig()
	if err := tc.Validate(); err != nil {
		t.Fatalf("TestConfig invalid: %v", err)
	}
	psk, _ := GeneratePSK()
	// Private networks and plaintext cannot run over QUIC: their default
	// addresses are TCP only.
	for name, mut := range map[string]func(*Config){
		"a PSK":    func(c *Config) { c.PSK = psk },
		"Insecure": func(c *Config) { c.Insecure = true },
	} {
		c := DefaultConfig()
		mut(&c)
		if err := c.Validate(); err != nil {
			t.Fatalf("default addresses with %s: %v", name, err)
		}
		for _, a := range c.listenAddrs() {
			if strings.Contains(a, "quic") {
				t.Fatalf("default with %s listens on %s", name, a)
			}
		}
	}
	_, pub, err := crypto.GenerateEd25519Key(nil)
	if err != nil {
		t.Fatal(err)
	}
	someone, err := peer.IDFromPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		mut  func(c *Config)
		want error
	}{
		{"quic insecure", func(c *Config) { c.Insecure = true; c.ListenAddrs = []string{"/ip4/127.0.0.1/udp/0/quic-v1"} }, ErrInvalidConfig},
		{"allowlist insecure", func(c *Config) { c.Insecure = true; c.Allowlist = []peer.ID{someone} }, ErrInvalidConfig},
		{"quic with psk", func(c *Config) { c.PSK = psk; c.ListenAddrs = []string{"/ip4/127.0.0.1/udp/0/quic-v1"} }, ErrQUICWithPSK},
		{"short psk", func(c *Config) { c.PSK = psk[:16] }, ErrInvalidConfig},
		{"bad listen", func(c *Config) { c.ListenAddrs = []string{"tcp://x"} }, ErrInvalidConfig},
		{"bootstrap without id", func(c *Config) { c.Bootstrap = []string{"/ip4/1.2.3.4/tcp/1"} }, ErrInvalidConfig},
		{"swarm name with slash", func(c *Config) { c.SwarmName = "a/b" }, ErrInvalidConfig},
		{"no stripes", func(c *Config) { c.Stripes = 0 }, ErrInvalidConfig},
		{"tiny window", func(c *Config) { c.StreamWindow = 1000 }, ErrInvalidConfig},
		{"unknown muxer", func(c *Config) { c.Muxer = "mplex" }, ErrInvalidConfig},
		{"memory below windows", func(c *Config) { c.MemoryLimit = 1 << 20 }, ErrInvalidConfig},
		{"conn watermarks", func(c *Config) { c.ConnLow, c.ConnHigh = 10, 5 }, ErrInvalidConfig},
		{"zero timeout", func(c *Config) { c.IOTimeout = 0 }, ErrInvalidConfig},
	}
	for _, c := range cases {
		cfg := DefaultConfig()
		c.mut(&cfg)
		before := cfg
		if err := cfg.Validate(); !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
		if cfg.Stripes != before.Stripes || cfg.SwarmName != before.SwarmName {
			t.Errorf("%s: Validate modified the config", c.name)
		}
	}
}

func TestResourceLimitsFitWindows(t *testing.T) {
	cfg := DefaultConfig()
	l := resourceLimits(&cfg)
	need := int64(2*cfg.Stripes) * int64(cfg.StreamWindow) // all receive windows of one peer at full size
	if got := l.ToPartialLimitConfig().Conn.Memory; int64(got) < 2*need {
		t.Fatalf("conn memory %d < 2 * %d (priority-128 headroom)", got, need)
	}
	if got := l.ToPartialLimitConfig().PeerDefault.Memory; int64(got) < 2*need {
		t.Fatalf("peer memory %d < 2 * %d", got, need)
	}
}

// TestResourceManagerGrantsWindows reserves memory on a connection the way
// yamux grows its receive windows (priority 128) and checks that our limits
// grant the windows of 2*Stripes streams at full size, where libp2p's
// defaults stop at half of 32 MiB.
func TestResourceManagerGrantsWindows(t *testing.T) {
	cfg := DefaultConfig()
	need := int64(2*cfg.Stripes) * int64(cfg.StreamWindow)
	ours, err := rcmgr.NewResourceManager(rcmgr.NewFixedLimiter(resourceLimits(&cfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer ours.Close()
	scaling := rcmgr.DefaultLimits
	libp2p.SetDefaultServiceLimits(&scaling)
	def, err := rcmgr.NewResourceManager(rcmgr.NewFixedLimiter(scaling.AutoScale()))
	if err != nil {
		t.Fatal(err)
	}
	defer def.Close()
	sk, _, _ := crypto.GenerateEd25519Key(nil)
	pid, _ := peer.IDFromPrivateKey(sk)
	grant := func(rm network.ResourceManager) int64 {
		conn, err := rm.OpenConnection(network.DirInbound, true, ma.StringCast("/ip4/10.0.0.1/tcp/1"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Done()
		if err := conn.SetPeer(pid); err != nil {
			t.Fatal(err)
		}
		span, err := conn.BeginSpan()
		if err != nil {
			t.Fatal(err)
		}
		defer span.Done()
		var got int64
		for got < 4*need && span.ReserveMemory(1<<20, 128) == nil {
			got += 1 << 20
		}
		return got
	}
	o, d := grant(ours), grant(def)
	t.Logf("window memory granted per connection: ours %d MiB, libp2p defaults %d MiB (need %d MiB)", o>>20, d>>20, need>>20)
	if o < need {
		t.Fatalf("our limits grant %d MiB of windows, need %d MiB", o>>20, need>>20)
	}
	if d >= need {
		t.Fatalf("libp2p defaults grant %d MiB: the test no longer shows why we raise them", d>>20)
	}
}
