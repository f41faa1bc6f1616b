// Command library trains a model and a dataset of its own over a real
// libp2p swarm, using Starling as a library: only the public packages nn,
// data, train, swarm and node.
//
// Run with no flags, it starts 3 peer processes on loopback (it runs
// itself again with -peer i), connects each to the ones started before it
// by their multiaddrs (no mDNS, no DHT), and trains a residual GELU MLP on
// a synthetic 3-class spirals task with synchronous data-parallel SGD:
// every step, the peers average their gradients by all-reduce. Each peer
// prints its final test loss and accuracy and a digest of its parameters;
// the parent prints a summary and exits 0 only if every peer holds the
// same model and reached -target accuracy.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/starling-ml/starling/data"
	"github.com/starling-ml/starling/node"
	"github.com/starling-ml/starling/swarm"
	"github.com/starling-ml/starling/train"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "library:", err)
		os.Exit(1)
	}
}

// childEnv marks the processes the parent starts as peers, so that a test
// binary re-executed as a peer knows to run as one (see TestMain).
const childEnv = "STARLING_LIBRARY_PEER=1"

// config is what the flags say.
type config struct {
	peers, steps, batch   int
	lr                    float64
	width, blocks         int
	classes, perClass     int
	noise                 float64
	seed                  uint64
	target                float64
	timeout               time.Duration
	jsonOut               string
	peer                  int    // ≥ 0: run as this peer (set by the parent)
	connect               string // comma-separated multiaddrs of the peers started before
	testPerClass, logEach int
}

func parse(args []string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("library", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&c.peers, "peers", 3, "number of peer processes")
	fs.IntVar(&c.steps, "steps", 400, "synchronous steps of the job")
	fs.IntVar(&c.batch, "batch", 32, "samples per peer per step")
	fs.Float64Var(&c.lr, "lr", 0.01, "peak learning rate (Adam, cosine decay)")
	fs.IntVar(&c.width, "width", 32, "width of the residual blocks")
	fs.IntVar(&c.blocks, "blocks", 2, "number of residual blocks")
	fs.IntVar(&c.classes, "classes", 3, "spiral arms (classes)")
	fs.IntVar(&c.perClass, "points", 1000, "training points per class, shared out among the peers")
	fs.IntVar(&c.testPerClass, "test-points", 300, "test points per class")
	fs.Float64Var(&c.noise, "noise", 0.3, "standard deviation of the angle noise, in radians")
	fs.Uint64Var(&c.seed, "seed", 1, "seed of the data, the partition and the initial model")
	fs.Float64Var(&c.target, "target", 0.9, "test accuracy every peer must reach")
	fs.DurationVar(&c.timeout, "timeout", 2*time.Minute, "deadline of the whole run")
	fs.StringVar(&c.jsonOut, "json", "", "write the peers' results to this file")
	fs.IntVar(&c.logEach, "log-every", 100, "log the loss every this many steps")
	fs.IntVar(&c.peer, "peer", -1, "run as peer `i` of -peers (the parent sets it)")
	fs.StringVar(&c.connect, "connect", "", "comma-separated multiaddrs to dial (the parent sets it)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	switch {
	case fs.NArg() > 0:
		return c, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case c.peers < 1 || c.peers > 16:
		return c, fmt.Errorf("-peers %d: want 1 to 16", c.peers)
	case c.peer >= c.peers:
		return c, fmt.Errorf("-peer %d: want below -peers %d", c.peer, c.peers)
	case c.steps < 1 || c.batch < 1 || c.width < 1 || c.blocks < 0 || c.testPerClass < 1 || c.logEach < 1:
		return c, fmt.Errorf("-steps, -batch, -width, -test-points and -log-every must be positive, -blocks not negative")
	case c.classes < 2:
		return c, fmt.Errorf("-classes %d: want at least 2", c.classes)
	case !(c.noise >= 0) || math.IsInf(c.noise, 0):
		return c, fmt.Errorf("-noise %v: want a finite angle in radians, not negative", c.noise)
	case c.perClass < 1 || c.perClass*c.classes < c.peers:
		return c, fmt.Errorf("-points %d × -classes %d: want at least one sample per peer", c.perClass, c.classes)
	case !(c.target >= 0 && c.target <= 1):
		return c, fmt.Errorf("-target %v: want an accuracy in [0, 1]", c.target)
	case c.timeout <= 0:
		return c, fmt.Errorf("-timeout must be positive")
	}
	return c, nil
}

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	c, err := parse(args, stderr)
	if err != nil {
		return err
	}
	if c.peer >= 0 {
		return runPeer(ctx, c, stdin, stdout, stderr)
	}
	return runParent(ctx, c, args, stdout, stderr)
}

// message is one line a peer writes to its stdout for the parent: first
// its addresses, then its result.
type message struct {
	Addrs  []string `json:"addrs,omitempty"`
	Result *result  `json:"result,omitempty"`
}

// result is how one peer ended.
type result struct {
	Peer     int     `json:"peer"`
	ID       string  `json:"id"`
	Steps    int     `json:"steps"`
	Loss     float64 `json:"test_loss"`
	Accuracy float64 `json:"test_accuracy"`
	Digest   string  `json:"params_sha256"`
	Seconds  float64 `json:"train_seconds"`
}

// runPeer is one peer process: it builds its shard and model, joins the
// swarm, trains, reports, and stays up until the parent closes its stdin
// (every peer has finished) or the deadline passes.
func runPeer(ctx context.Context, c config, stdin io.Reader, stdout, stderr io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	logf := func(format string, a ...any) {
		fmt.Fprintf(stderr, "peer %d: "+format+"\n", append([]any{c.peer}, a...)...)
	}

	// Every peer derives the same dataset and partition from the seed and
	// trains on its own part; the test set is drawn with another seed.
	trainSet, err := NewSpirals(c.classes, c.perClass, c.noise, c.seed)
	if err != nil {
		return err
	}
	testSet, err := NewSpirals(c.classes, c.testPerClass, c.noise, c.seed+1)
	if err != nil {
		return err
	}
	parts, err := data.Partition(trainSet, c.peers, "iid", c.seed)
	if err != nil {
		return err
	}
	shard := data.Subset(trainSet, parts[c.peer])

	wc := train.DefaultWorkerConfig()
	wc.Batch, wc.LR, wc.Optimizer = c.batch, float32(c.lr), "adam"
	wc.Schedule, wc.TotalSteps = "cosine", c.steps
	wc.ModelSeed = c.seed                     // the same initial model on every peer
	wc.DataSeed = c.seed + 1 + uint64(c.peer) // a different batch order on each
	w, err := train.NewWorker(wc, shard, train.WithModel(modelFunc(c.width, c.blocks, c.classes)))
	if err != nil {
		return err
	}

	cfg := swarm.DefaultConfig()
	cfg.Node.ListenAddrs = []string{"/ip4/127.0.0.1/tcp/0"} // loopback, a free port
	cfg.Node.MDNS, cfg.Node.DHT = false, false              // peers are dialled directly
	cfg.Node.NATPortMap, cfg.Node.HolePunching, cfg.Node.NATService = false, false, false
	cfg.Gossip.Namespace = "library-example"
	cfg.Gossip.Model = archID(w.Model) // peers of another architecture are ignored
	p, err := swarm.Start(ctx, cfg)
	if err != nil {
		return err
	}
	defer p.Close()
	if err := connectAll(ctx, p.Node, c.connect); err != nil {
		return err
	}
	var addrs []string
	for _, a := range p.Node.Addrs() {
		addrs = append(addrs, a.String())
	}
	if err := json.NewEncoder(stdout).Encode(message{Addrs: addrs}); err != nil {
		return err
	}

	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	err = p.WaitPeers(wctx, c.peers)
	wcancel()
	if err != nil {
		return fmt.Errorf("waiting for %d peers (have %d): %w", c.peers, len(p.Members()), err)
	}
	logf("%s: %d samples, model %s (%d parameters), %d peers", p.ID(), shard.Len(), w.Model.Arch, len(w.Model.Params), c.peers)

	job := train.DefaultSyncConfig()
	job.Steps = c.steps
	job.StepTimeout = 30 * time.Second
	start := time.Now()
	err = train.Sync(ctx, w, p.Net(c.batch), job, nil, func(si train.StepInfo) bool {
		if si.Step%uint64(c.logEach) == 0 || si.Joined || si.Failed {
			logf("step %d  batch loss %.4f  group %d", si.Step, si.Loss, len(si.Group))
		}
		return false
	})
	if err != nil {
		return fmt.Errorf("training: %w", err)
	}
	loss, acc := w.Evaluate(testSet)
	res := &result{Peer: c.peer, ID: string(p.ID()), Steps: w.Steps, Loss: loss, Accuracy: acc,
		Digest: paramDigest(w.Model), Seconds: time.Since(start).Seconds()}
	logf("done: %d steps in %.1fs, test loss %.4f, accuracy %.2f%%, params sha256 %.12s",
		res.Steps, res.Seconds, loss, 100*acc, res.Digest)
	if err := json.NewEncoder(stdout).Encode(message{Result: res}); err != nil {
		return err
	}

	// Stay up while others may still need this peer (a late all-reduce, a
	// state fetch): until the parent says all are done by closing stdin.
	eof := make(chan struct{})
	go func() {
		io.Copy(io.Discard, stdin)
		close(eof)
	}()
	select {
	case <-eof:
	case <-ctx.Done():
	}
	return nil
}

// connectAll dials every peer in addrs (comma-separated multiaddrs ending
// in /p2p/ID), retrying each for up to 10 s: it may still be starting.
func connectAll(ctx context.Context, n *node.Node, addrs string) error {
	var mas []ma.Multiaddr
	for _, s := range strings.Split(addrs, ",") {
		if s == "" {
			continue
		}
		m, err := ma.NewMultiaddr(s)
		if err != nil {
			return fmt.Errorf("-connect %q: %w", s, err)
		}
		mas = append(mas, m)
	}
	infos, err := peer.AddrInfosFromP2pAddrs(mas...)
	if err != nil {
		return fmt.Errorf("-connect: %w", err)
	}
	for _, ai := range infos {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := n.ConnectRetry(cctx, ai)
		cancel()
		if err != nil {
			return fmt.Errorf("connecting to %s: %w", ai.ID, err)
		}
	}
	return nil
}

// child is a peer process the parent started.
type child struct {
	i     int
	cmd   *exec.Cmd
	stdin io.WriteCloser
	msgs  chan message // closed at the end of its stdout
}

// runParent starts c.peers peer processes one after another, each told
// the addresses of those before it, collects their results and checks
// that they agree and reached the target.
func runParent(ctx context.Context, c config, args []string, stdout, stderr io.Writer) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	start := time.Now()
	logs := &lockedWriter{w: stderr}
	var children []*child
	defer func() {
		cancel() // kills the peers still running
		for _, ch := range children {
			ch.cmd.Wait()
		}
	}()
	var addrs []string
	for i := range c.peers {
		a := append(append([]string(nil), args...), "-peer", strconv.Itoa(i), "-connect", strings.Join(addrs, ","))
		ch, err := startChild(ctx, exe, i, a, logs)
		if err != nil {
			return err
		}
		children = append(children, ch)
		m, err := ch.next(ctx, "addresses")
		if err != nil {
			return err
		}
		if len(m.Addrs) == 0 {
			return fmt.Errorf("peer %d: first message has no addresses", i)
		}
		addrs = append(addrs, m.Addrs...)
	}
	results := make([]result, len(children))
	for i, ch := range children {
		m, err := ch.next(ctx, "result")
		if err != nil {
			return err
		}
		if m.Result == nil {
			return fmt.Errorf("peer %d: expected its result", i)
		}
		results[i] = *m.Result
	}
	var errs []error
	for _, ch := range children {
		ch.stdin.Close() // all finished: the peers may leave
	}
	for _, ch := range children {
		if err := ch.wait(); err != nil {
			errs = append(errs, err)
		}
	}
	children = nil

	for _, r := range results {
		fmt.Fprintf(stdout, "peer %d  %s  %d steps  test loss %.4f  accuracy %6.2f%%  params sha256 %.12s\n",
			r.Peer, r.ID, r.Steps, r.Loss, 100*r.Accuracy, r.Digest)
	}
	if c.jsonOut != "" {
		b, err := json.MarshalIndent(results, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(c.jsonOut, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	worst := results[0].Accuracy
	for _, r := range results {
		if r.Digest != results[0].Digest {
			errs = append(errs, fmt.Errorf("peer %d's parameters (sha256 %.12s) differ from peer 0's (%.12s)", r.Peer, r.Digest, results[0].Digest))
		}
		if r.Steps != c.steps {
			errs = append(errs, fmt.Errorf("peer %d took %d steps, want %d", r.Peer, r.Steps, c.steps))
		}
		worst = min(worst, r.Accuracy)
	}
	if worst < c.target {
		errs = append(errs, fmt.Errorf("lowest test accuracy %.2f%% is below the target %.2f%%", 100*worst, 100*c.target))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "all %d peers hold the same model and reached %.2f%% ≥ %.2f%% in %.1fs\n",
		len(results), 100*worst, 100*c.target, time.Since(start).Seconds())
	return nil
}

// startChild starts peer i as exe args; its stderr goes to logs.
func startChild(ctx context.Context, exe string, i int, args []string, logs io.Writer) (*child, error) {
	cmd := exec.CommandContext(ctx, exe, args...)
	cmd.Env = append(os.Environ(), childEnv)
	cmd.Stderr = logs
	cmd.WaitDelay = 5 * time.Second
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting peer %d: %w", i, err)
	}
	ch := &child{i: i, cmd: cmd, stdin: stdin, msgs: make(chan message, 4)}
	go func() {
		defer close(ch.msgs)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var m message
			if json.Unmarshal(sc.Bytes(), &m) == nil {
				ch.msgs <- m
			}
		}
	}()
	return ch, nil
}

// next returns the child's next message, which should be what; an error
// if the child or ctx ended first.
func (ch *child) next(ctx context.Context, what string) (message, error) {
	select {
	case m, ok := <-ch.msgs:
		if !ok {
			return message{}, fmt.Errorf("peer %d exited before sending its %s: %v", ch.i, what, ch.wait())
		}
		return m, nil
	case <-ctx.Done():
		return message{}, fmt.Errorf("peer %d: no %s before the deadline (-timeout): %w", ch.i, what, ctx.Err())
	}
}

// wait reads the child's stdout to its end and waits for it to exit; the
// end of the context it was started with kills it (exec.CommandContext).
func (ch *child) wait() error {
	for range ch.msgs {
	}
	if err := ch.cmd.Wait(); err != nil {
		return fmt.Errorf("peer %d: %w", ch.i, err)
	}
	return nil
}

// lockedWriter serialises the writes of the peers' stderr copiers.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
