package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/starling-ml/starling/node"
)

func init() {
	register(&command{name: "id", summary: "print this peer's ID (creating its identity key if missing)", run: runID})
	register(&command{name: "keygen", summary: "create an identity key, or a swarm key with --psk", run: runKeygen})
	register(&command{name: "bench", summary: "throughput and all-reduce benchmarks ('peer bench' lists them)", run: runBench})
	registerBench(&command{name: "transfer", summary: "one-to-one tensor throughput vs crypto/tls between two processes", run: runBenchTransfer})
}

// benchCommands are the subcommands of 'peer bench'; other files add theirs
// with registerBench from their init.
var benchCommands = map[string]*command{}

func registerBench(c *command) {
	if _, dup := benchCommands[c.name]; dup {
		panic("peer: duplicate bench command " + c.name)
	}
	benchCommands[c.name] = c
}

func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	names := make([]string, 0, len(benchCommands))
	for n := range benchCommands {
		names = append(names, n)
	}
	sort.Strings(names)
	if len(args) == 0 || benchCommands[args[0]] == nil {
		fmt.Fprintln(stderr, "usage: peer bench <benchmark> [flags]")
		for _, n := range names {
			fmt.Fprintf(stderr, "  %-10s %s\n", n, benchCommands[n].summary)
		}
		if len(args) == 0 {
			return errors.New("no benchmark given")
		}
		return fmt.Errorf("unknown benchmark %q", args[0])
	}
	return benchCommands[args[0]].run(ctx, args[1:], stdout, stderr)
}

// defaultKeyFile is where the identity lives unless --key says otherwise.
func defaultKeyFile() string {
	dir, err := os.UserConfigDir()
	if err != nil {
		dir = "."
	}
	return filepath.Join(dir, "starling", "identity.key")
}

func runID(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("id", stderr)
	key := fs.String("key", defaultKeyFile(), "identity key file (created, mode 0600, if missing)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	sk, err := node.LoadOrCreateIdentity(*key)
	if err != nil {
		return err
	}
	id, err := peer.IDFromPrivateKey(sk)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, id)
	return nil
}

func runKeygen(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fset := newFlagSet("keygen", stderr)
	key := fset.String("key", defaultKeyFile(), "identity key file to create (same as --out without --psk)")
	psk := fset.Bool("psk", false, "create a swarm key (IPFS swarm.key format) instead of an identity")
	out := fset.String("out", "", "the file to create (default: --key for an identity, swarm.key with --psk)")
	if err := fset.Parse(args); err != nil {
		return err
	}
	if fset.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (the file to create goes in --out)", fset.Arg(0))
	}
	path, err := keygenPath(*psk, *key, *out, flagSet(fset, "key"))
	if err != nil {
		return err
	}
	if *psk {
		k, err := node.GeneratePSK()
		if err != nil {
			return err
		}
		if err := node.WritePSK(path, k); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote swarm key %s (mode 0600); give the same file to every member (--psk %s)\n", path, path)
		return nil
	}
	if _, err := os.Stat(path); err == nil {
		return fmt.Errorf("%s: %w (peer id --key %s prints its ID)", path, fs.ErrExist, path)
	}
	sk, err := node.LoadOrCreateIdentity(path)
	if err != nil {
		return err
	}
	id, _ := peer.IDFromPrivateKey(sk)
	fmt.Fprintf(stdout, "%s\n", id)
	fmt.Fprintf(stderr, "wrote identity key %s (mode 0600)\n", path)
	return nil
}

// keygenPath picks the file 'peer keygen' creates. --out names it in every
// form; --key (kept for compatibility) names an identity key and is refused
// with --psk or when it disagrees with --out, so that no form silently writes
// somewhere the user did not ask for.
func keygenPath(psk bool, key, out string, keySet bool) (string, error) {
	switch {
	case psk && keySet:
		return "", errors.New("--key names an identity key; with --psk give the swarm key file in --out")
	case psk && out == "":
		return "swarm.key", nil
	case psk:
		return out, nil
	case out != "" && keySet && out != key:
		return "", fmt.Errorf("--key %s and --out %s name different files; give one", key, out)
	case out != "":
		return out, nil
	}
	return key, nil
}

// flagSet reports whether the flag name was given on the command line.
func flagSet(fset *flag.FlagSet, name string) bool {
	set := false
	fset.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// runBenchTransfer is both sides of the one-to-one benchmark. Without
// --connect it serves (libp2p and the crypto/tls baseline) until
// interrupted; with --connect it runs transfers against a server,
// alternating libp2p and TLS so that both see the same conditions.
func runBenchTransfer(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fset := newFlagSet("bench transfer", stderr)
	listen := fset.String("listen", "/ip4/0.0.0.0/tcp/4001", "server: libp2p listen multiaddr")
	tlsListen := fset.String("tls-listen", ":4002", "server: baseline (crypto/tls and plain TCP) listen address (empty: none)")
	addrFile := fset.String("addr-file", "", "server: write the libp2p address to this file once listening")
	connect := fset.String("connect", "", "client: the server's libp2p multiaddr (with /p2p/ID)")
	tlsAddr := fset.String("tls", "", "client: the server's baseline host:port (default: the --connect host, port 4002; 'none' to skip)")
	sizeMiB := fset.Int("size-mib", 256, "client: tensor size in MiB")
	count := fset.Int("count", 4, "client: transfers of each kind")
	stripes := fset.Int("stripes", node.DefaultConfig().Stripes, "streams per tensor")
	pskFile := fset.String("psk", "", "swarm key file (both sides)")
	insecure := fset.Bool("insecure", false, insecureUsage)
	muxer := fset.String("muxer", node.DefaultConfig().Muxer, muxerUsage)
	key := fset.String("key", "", "identity key file (default: a fresh identity)")
	metrics := fset.String("metrics-addr", "", "serve Prometheus metrics on this address")
	if err := fset.Parse(args); err != nil {
		return err
	}
	cfg := node.DefaultConfig()
	cfg.MDNS, cfg.DHT, cfg.NATPortMap, cfg.HolePunching, cfg.NATService = false, false, false, false, false
	cfg.Stripes = *stripes
	cfg.PSKFile = *pskFile
	cfg.Insecure = warnInsecure(*insecure, stderr)
	cfg.Muxer = *muxer
	cfg.KeyFile = *key
	cfg.MetricsAddr = *metrics
	size := *sizeMiB << 20
	if *count < 1 {
		return fmt.Errorf("--count must be >= 1")
	}
	if size <= 0 || int64(size) > cfg.MaxTensorBytes {
		return fmt.Errorf("--size-mib %d out of range (1..%d)", *sizeMiB, cfg.MaxTensorBytes>>20)
	}
	if *connect == "" {
		cfg.ListenAddrs = []string{*listen}
		return benchServe(ctx, cfg, *tlsListen, *addrFile, stdout)
	}
	cfg.ListenAddrs = []string{}
	return benchClient(ctx, cfg, *connect, *tlsAddr, size, *count, stdout)
}

func benchServe(ctx context.Context, cfg node.Config, tlsListen, addrFile string, stdout io.Writer) error {
	n, err := node.New(ctx, cfg)
	if err != nil {
		return err
	}
	defer n.Close()
	addrs := n.Addrs()
	for _, a := range addrs {
		fmt.Fprintf(stdout, "libp2p listening on %s\n", a)
	}
	errc := make(chan error, 2)
	if tlsListen != "" {
		ln, err := net.Listen("tcp", tlsListen)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "baseline listening on %s\n", ln.Addr())
		go func() { errc <- node.ServeBaseline(ctx, ln, cfg.MaxTensorBytes) }()
	}
	if addrFile != "" && len(addrs) > 0 {
		if err := os.WriteFile(addrFile, []byte(addrs[0].String()+"\n"), 0o644); err != nil {
			return err
		}
	}
	go func() { errc <- n.ServeBench(ctx) }()
	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		return err
	}
}

func benchClient(ctx context.Context, cfg node.Config, connect, tlsAddr string, size, count int, stdout io.Writer) error {
	ai, err := peer.AddrInfoFromString(connect)
	if err != nil {
		return fmt.Errorf("--connect: %w", err)
	}
	if tlsAddr == "" {
		host, err := hostOf(ai.Addrs[0])
		if err != nil {
			return err
		}
		tlsAddr = net.JoinHostPort(host, "4002")
	}
	n, err := node.New(ctx, cfg)
	if err != nil {
		return err
	}
	defer n.Close()
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = n.Connect(cctx, *ai)
	cancel()
	if err != nil {
		return err
	}
	payload := make([]byte, size)
	for i := range payload { // incompressible enough, cheap to make
		payload[i] = byte(i*2654435761>>13) ^ byte(i>>9)
	}
	// Baselines on their own connections to the same server: crypto/tls
	// (what libp2p's TLS+yamux should approach) and plain TCP (the link).
	type baseline struct {
		name string
		c    *node.BaselineClient
		res  []time.Duration
	}
	var bases []*baseline
	if tlsAddr != "none" {
		for _, b := range []struct {
			name string
			tls  bool
		}{{"crypto/tls", true}, {"plain tcp", false}} {
			c, err := node.DialBaseline(ctx, tlsAddr, b.tls)
			if err != nil {
				return fmt.Errorf("baseline at %s: %w", tlsAddr, err)
			}
			defer c.Close()
			bases = append(bases, &baseline{name: b.name, c: c})
		}
	}
	// Warm up every path (connection set-up, windows, buffers), then
	// alternate them so that all see the same conditions.
	if _, err := n.RunBench(ctx, ai.ID, payload, 1); err != nil {
		return err
	}
	for _, b := range bases {
		if _, err := b.c.Run(ctx, payload, 1); err != nil {
			return err
		}
	}
	var p2p []time.Duration
	for range count {
		r, err := n.RunBench(ctx, ai.ID, payload, 1)
		if err != nil {
			return err
		}
		p2p = append(p2p, r.Elapsed)
		for _, b := range bases {
			r, err := b.c.Run(ctx, payload, 1)
			if err != nil {
				return err
			}
			b.res = append(b.res, r.Elapsed)
		}
	}
	mode := "tls+yamux"
	if cfg.Insecure {
		mode = "plain+yamux"
	}
	if cfg.PSKFile != "" {
		mode = "psk+" + mode
	}
	// Median and best of the transfers: on a shared machine the best is
	// the least disturbed one.
	rate := func(d time.Duration) float64 { return float64(size) / d.Seconds() / 1e6 }
	med, best := medianBest(p2p)
	fmt.Fprintf(stdout, "%d x %d MiB, MB/s (median / best):\n", count, size>>20)
	fmt.Fprintf(stdout, "  libp2p %-14s %7.1f / %7.1f  (%d stripes)\n", mode, rate(med), rate(best), cfg.Stripes)
	for _, b := range bases {
		bm, bb := medianBest(b.res)
		fmt.Fprintf(stdout, "  %-21s %7.1f / %7.1f  libp2p/%s = %.3f / %.3f\n",
			b.name, rate(bm), rate(bb), b.name, bm.Seconds()/med.Seconds(), bb.Seconds()/best.Seconds())
	}
	return nil
}

// medianBest returns the median and the shortest of ds (sorted in place).
func medianBest(ds []time.Duration) (time.Duration, time.Duration) {
	slices.Sort(ds)
	return ds[len(ds)/2], ds[0]
}

// hostOf returns the IP or DNS name at the front of a multiaddr.
func hostOf(a ma.Multiaddr) (string, error) {
	for _, code := range []int{ma.P_IP4, ma.P_IP6, ma.P_DNS, ma.P_DNS4, ma.P_DNS6} {
		if v, err := a.ValueForProtocol(code); err == nil {
			return v, nil
		}
	}
	return "", fmt.Errorf("no host in %s", a)
}

// muxerUsage documents --muxer wherever a command has it.
const muxerUsage = "stream muxer offered first: starling (node/mux: less CPU per byte; yamux stays offered second), or yamux alone"

// insecureUsage documents --insecure wherever a command has it.
const insecureUsage = "no transport security (libp2p plaintext): saves the cipher's CPU on a trusted cluster network; traffic is neither encrypted nor authenticated, every process must set it, and --allow is refused"

// warnInsecure says on stderr what --insecure gives up, once it is set,
// and returns it.
func warnInsecure(on bool, stderr io.Writer) bool {
	if on {
		fmt.Fprintln(stderr, "warning: --insecure: connections are neither encrypted nor authenticated; use only on a trusted network")
	}
	return on
}
