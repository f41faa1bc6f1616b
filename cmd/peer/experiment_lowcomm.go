package main

// peer experiment lowcomm: issue 25's comparison of low-communication
// strategies on charlm, with real peer processes (what
// scripts/lowcomm.sh runs, on loopback or the netbed).

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/starling-ml/starling/internal/peerrun"
	"github.com/starling-ml/starling/internal/spawn"
	"github.com/starling-ml/starling/node"
	"github.com/starling-ml/starling/trace"
)

// lowCommConfig is what `peer experiment lowcomm` runs.
type lowCommConfig struct {
	Peers     int    `json:"peers"`
	Steps     int    `json:"steps"`
	H         int    `json:"h"`
	Fragments int    `json:"fragments"`
	Tau       int    `json:"tau"`
	Model     string `json:"model"`
	Data      string `json:"data,omitempty"`
	// SDExtra, Async and Demo add strategy parameters to the
	// streaming-diloco, async-diloco and demo rows; DemoLR is demo's --lr.
	SDExtra string `json:"sd_extra,omitempty"`
	Async   string `json:"async,omitempty"`
	Demo    string `json:"demo,omitempty"`
	DemoLR  string `json:"demo_lr,omitempty"`
	// Extra is added to every peer's command line, before the row's own
	// flags (which win).
	Extra       []string      `json:"extra,omitempty"`
	PeerTimeout time.Duration `json:"peer_timeout_ns"`
	// Netns runs peer k in network namespace hk at 10.77.0.(k+1), as
	// ../shared/bench/netbed.sh makes them, instead of on 127.0.0.1.
	Netns bool `json:"netns,omitempty"`
}

// lowCommRow is one strategy of the comparison: the flags its peers run
// with. A solo row's peers train alone (the compute-only wall time).
type lowCommRow struct {
	Name string
	Args []string
	Solo bool
}

// lowCommRows lists every row, in the order they run. Every row trains
// c.Steps inner steps a peer (equal tokens); the DiLoCo rows do so in
// c.Steps/c.H outer steps.
func lowCommRows(c lowCommConfig) []lowCommRow {
	rounds := fmt.Sprint(c.Steps / c.H)
	fed := func(strategy string, more ...string) []string {
		return append([]string{"--mode", "federated", "--strategy", strategy, "--rounds", rounds}, more...)
	}
	steps := func(more ...string) []string {
		return append([]string{"--mode", "sync", "--steps", fmt.Sprint(c.Steps), "--eval-every", fmt.Sprint(c.Steps)}, more...)
	}
	with := func(s, params string) string {
		if params == "" {
			return s
		}
		return s + "," + params
	}
	fp4 := []string{"--compress", "fp4"}
	diloco := fmt.Sprintf("diloco:h=%d", c.H)
	sd := with(fmt.Sprintf("streaming-diloco:h=%d,fragments=%d", c.H, c.Fragments), c.SDExtra)
	overlap := fmt.Sprintf("overlap=%d", c.Tau)
	async := with(fmt.Sprintf("async-diloco:h=%d", c.H), c.Async)
	demo := []string{"--strategy", "demo"}
	if c.Demo != "" {
		demo[1] += ":" + c.Demo
	}
	if c.DemoLR != "" {
		demo = append(demo, "--lr", c.DemoLR)
	}
	return []lowCommRow{
		{Name: "solo", Args: fed(diloco), Solo: true},
		{Name: "sync", Args: steps()},
		{Name: "sdlc-fp4", Args: fed(sd, fp4...)},
		{Name: "sdlc-fp32", Args: fed(sd)},
		{Name: "diloco", Args: fed(diloco)},
		{Name: "sdlc-fp4-a0", Args: fed(with(sd, "alpha=0"), fp4...)},
		{Name: "sdlc-fp4-a75", Args: fed(with(sd, "alpha=0.75"), fp4...)},
		{Name: "sdlc-fp4-a90", Args: fed(with(sd, "alpha=0.9"), fp4...)},
		{Name: "sdlc-fp4-overlap", Args: fed(with(sd, overlap), fp4...)},
		{Name: "sdlc-fp32-overlap", Args: fed(with(sd, overlap))},
		{Name: "demo", Args: steps(demo...)},
		{Name: "diloco-fp4", Args: fed(fmt.Sprintf("streaming-diloco:h=%d,fragments=1,alpha=0", c.H), fp4...)},
		{Name: "async-diloco", Args: fed(async)},
		{Name: "async-diloco-fp4", Args: fed(async, fp4...)},
	}
}

// selectRows returns the rows named in names (all when empty), in run
// order, or an error naming one it does not know.
func selectRows(rows []lowCommRow, names []string) ([]lowCommRow, error) {
	if len(names) == 0 {
		return rows, nil
	}
	all := rowNames(rows)
	for _, n := range names {
		if !slices.Contains(all, n) {
			return nil, fmt.Errorf("experiment lowcomm: unknown row %q (have %s)", n, strings.Join(all, ", "))
		}
	}
	return slices.DeleteFunc(slices.Clone(rows), func(r lowCommRow) bool { return !slices.Contains(names, r.Name) }), nil
}

// lowCommResult is one row's outcome: means over its peers.
type lowCommResult struct {
	Row string `json:"row"`
	// BitsPerChar is the final validation bits per character (sync: the
	// one model; the DiLoCo rows: the global model).
	BitsPerChar float64 `json:"val_bits_per_char"`
	// BytesPerPeer is summary.json's tensor_bytes_sent: what a peer wrote
	// to tensor streams, framing included.
	BytesPerPeer float64 `json:"bytes_per_peer"`
	WallS        float64 `json:"wall_s"`
	// AllReduceS is the seconds of a peer's "allreduce" trace spans;
	// ExposedS the part that blocked its training: the "wait" spans of an
	// overlap row, else all of it (the loop runs the all-reduce itself).
	AllReduceS float64  `json:"allreduce_s"`
	ExposedS   float64  `json:"exposed_s"`
	Errors     []string `json:"errors,omitempty"`
}

// summarizeRow reads the summaries and traces of a row's n peers from
// dir (o<k>/summary.json, trace<k>.json).
func summarizeRow(dir string, n int, name string, wall time.Duration) lowCommResult {
	res := lowCommResult{Row: name, WallS: wall.Seconds()}
	var bits, sent, comm, exposed []float64
	for k := range n {
		if evs, err := readTrace(filepath.Join(dir, fmt.Sprintf("trace%d.json", k))); err == nil {
			var ar, wt float64
			for _, e := range evs {
				switch {
				case e.Cat == trace.Net && e.Name == "allreduce":
					ar += e.Dur / 1e6
				case e.Cat == trace.Train && e.Name == "wait":
					wt += e.Dur / 1e6
				}
			}
			comm = append(comm, ar)
			if strings.Contains(name, "overlap") {
				exposed = append(exposed, wt)
			} else {
				exposed = append(exposed, ar)
			}
		}
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("o%d", k), "summary.json"))
		var s peerrun.Summary
		if err == nil {
			err = json.Unmarshal(b, &s)
		}
		if err != nil {
			res.Errors = append(res.Errors, fmt.Sprintf("peer %d: %v", k, err))
			continue
		}
		if s.Error != "" {
			res.Errors = append(res.Errors, fmt.Sprintf("peer %d: %s", k, s.Error))
		}
		bits = append(bits, s.ValBitsPerChar)
		sent = append(sent, float64(s.TensorBytesSent))
	}
	res.BitsPerChar, res.BytesPerPeer = mean(bits), mean(sent)
	res.AllReduceS, res.ExposedS = mean(comm), mean(exposed)
	return res
}

// readTrace reads a trace file (trace.Read: a killed peer's cut-short
// file included).
func readTrace(path string) ([]trace.Event, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return trace.Read(f)
}

func mean(x []float64) float64 {
	if len(x) == 0 {
		return 0
	}
	var s float64
	for _, v := range x {
		s += v
	}
	return s / float64(len(x))
}

// againstSync writes each row's bytes and validation loss against the
// sync row's, if there is one.
func againstSync(w io.Writer, rows []lowCommResult) {
	i := slices.IndexFunc(rows, func(r lowCommResult) bool { return r.Row == "sync" })
	if i < 0 {
		return
	}
	base := rows[i]
	fmt.Fprintln(w, "# against sync: bytes × fewer, val loss change")
	for _, r := range rows {
		fewer := "inf"
		if r.BytesPerPeer > 0 {
			fewer = fmt.Sprintf("%.1f", base.BytesPerPeer/r.BytesPerPeer)
		}
		fmt.Fprintf(w, "%s\t%sx\t%+.2f%%\n", r.Row, fewer, 100*(r.BitsPerChar/base.BitsPerChar-1))
	}
}

const lowCommHeader = "row\tval_bits_per_char\tbytes_per_peer\twall_s\tallreduce_s\texposed_s\terrors"

func lowCommLine(w io.Writer, r lowCommResult) {
	errs := strings.Join(r.Errors, "; ")
	if len(errs) > 200 {
		errs = errs[:200]
	}
	fmt.Fprintf(w, "%s\t%.4f\t%.0f\t%.0f\t%.1f\t%.1f\t%s\n", r.Row, r.BitsPerChar, r.BytesPerPeer, r.WallS, r.AllReduceS, r.ExposedS, errs)
}

func runLowComm(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("experiment lowcomm", stderr)
	c := lowCommConfig{}
	fs.IntVar(&c.Peers, "peers", 4, "peer processes")
	fs.IntVar(&c.Steps, "steps", 600, "inner steps a peer, in every row (equal tokens)")
	fs.IntVar(&c.H, "h", 100, "inner steps per outer step of the DiLoCo rows")
	fs.IntVar(&c.Fragments, "fragments", 4, "Streaming DiLoCo's fragments")
	fs.IntVar(&c.Tau, "tau", -1, "overlap rows: inner steps a fragment's all-reduce overlaps (default h/fragments/2)")
	fs.StringVar(&c.Model, "model", "charlm:layers=2,width=64,heads=2,ctx=64", "model of every row (peer run --model)")
	fs.StringVar(&c.Data, "data", "", "text corpus (peer run --data; default: the Go standard library's sources)")
	fs.StringVar(&c.SDExtra, "sd-extra", "", "parameters added to the streaming-diloco rows' strategy, e.g. lr=1")
	fs.StringVar(&c.Async, "async", "", "parameters added to the async-diloco rows' strategy, e.g. momentum=0.5")
	fs.StringVar(&c.Demo, "demo", "", "parameters of the demo row's strategy, e.g. bits=3")
	fs.StringVar(&c.DemoLR, "demo-lr", "", "the demo row's --lr (default: the model's)")
	extra := fs.String("extra", "", "flags added to every peer's command line, space-separated (e.g. \"--stall-timeout 300s\")")
	rowsFlag := fs.String("rows", "", "comma-separated rows to run (default: all): "+strings.Join(rowNames(lowCommRows(lowCommConfig{H: 1})), ", "))
	fs.DurationVar(&c.PeerTimeout, "peer-timeout", 30*time.Minute, "stop a peer process after this long")
	fs.BoolVar(&c.Netns, "netns", false, "run peer k in network namespace hk at 10.77.0.(k+1) (../shared/bench/netbed.sh up N RATE makes them; needs root)")
	work := fs.String("work", "", "keep each row's logs, summaries and traces in this folder (default: a temporary one, removed)")
	jsonOut := fs.String("json", "", "also write the rows to this JSON file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("experiment lowcomm: unexpected argument %q", fs.Arg(0))
	case c.Peers < 1 || c.Peers > 250:
		return fmt.Errorf("experiment lowcomm: --peers %d, want 1 to 250", c.Peers)
	case c.H < 1 || c.Steps < c.H || c.Fragments < 1:
		return fmt.Errorf("experiment lowcomm: want --h ≥ 1, --steps ≥ --h and --fragments ≥ 1 (got %d, %d, %d)", c.H, c.Steps, c.Fragments)
	case c.PeerTimeout <= 0:
		return errors.New("experiment lowcomm: --peer-timeout must be positive")
	}
	if c.Tau < 0 {
		c.Tau = c.H / c.Fragments / 2
	}
	c.Extra = strings.Fields(*extra)
	var names []string
	if *rowsFlag != "" {
		names = strings.Split(*rowsFlag, ",")
	}
	rows, err := selectRows(lowCommRows(c), names)
	if err != nil {
		return err
	}
	dir := *work
	if dir == "" {
		if dir, err = os.MkdirTemp("", "lowcomm"); err != nil {
			return err
		}
		defer os.RemoveAll(dir)
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	ids := make([]peer.ID, c.Peers)
	for k := range ids {
		sk, err := node.LoadOrCreateIdentity(filepath.Join(dir, fmt.Sprintf("k%d", k)))
		if err != nil {
			return err
		}
		if ids[k], err = peer.IDFromPrivateKey(sk); err != nil {
			return err
		}
	}
	where := "127.0.0.1"
	if c.Netns {
		where = "the netbed"
	}
	fmt.Fprintf(stdout, "# %d peers, %s, %d inner steps a peer, H=%d, F=%d, on %s; %s\n", c.Peers, c.Model, c.Steps, c.H, c.Fragments, where, time.Now().UTC().Format(time.RFC3339))
	fmt.Fprintln(stdout, lowCommHeader)
	var results []lowCommResult
	var failed []string
	for _, row := range rows {
		res, err := runLowCommRow(ctx, c, row, self, dir, ids, stderr)
		if err != nil {
			return err
		}
		lowCommLine(stdout, res)
		results = append(results, res)
		if len(res.Errors) > 0 {
			failed = append(failed, row.Name)
		}
	}
	againstSync(stdout, results)
	if *jsonOut != "" {
		b, _ := json.MarshalIndent(struct {
			Config lowCommConfig   `json:"config"`
			Rows   []lowCommResult `json:"rows"`
		}{c, results}, "", "  ")
		if err := os.WriteFile(*jsonOut, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("experiment lowcomm: rows with errors: %s (logs: peer run's output, kept with --work)", strings.Join(failed, ", "))
	}
	return nil
}

func rowNames(rows []lowCommRow) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = r.Name
	}
	return out
}

// lowCommPorts returns a port for each peer: free ones on 127.0.0.1
// (bound and released), or, in fresh network namespaces, any.
func lowCommPorts(n int, netns bool) ([]int, error) {
	ports := make([]int, n)
	if netns {
		base := 20000 + rand.IntN(20000)
		for k := range ports {
			ports[k] = base + k
		}
		return ports, nil
	}
	return spawn.FreePorts(n)
}

// runLowCommRow runs a row's peers to their end (or c.PeerTimeout) and
// summarizes them. It reports progress to stderr every 30 s. An error is
// returned only for what stops the experiment (ctx ended, no process
// could start); a row's failures are its result's Errors.
func runLowCommRow(ctx context.Context, c lowCommConfig, row lowCommRow, self, dir string, ids []peer.ID, stderr io.Writer) (lowCommResult, error) {
	rd := filepath.Join(dir, row.Name)
	// A reused --work folder must not lend a failed peer an old summary.
	if err := os.RemoveAll(rd); err != nil {
		return lowCommResult{}, err
	}
	if err := os.MkdirAll(rd, 0o755); err != nil {
		return lowCommResult{}, err
	}
	ports, err := lowCommPorts(c.Peers, c.Netns)
	if err != nil {
		return lowCommResult{}, err
	}
	addr := func(k int) string {
		if c.Netns {
			return fmt.Sprintf("10.77.0.%d", k+1)
		}
		return "127.0.0.1"
	}
	minPeers := c.Peers
	if row.Solo {
		minPeers = 1
	}
	pctx, cancel := context.WithTimeout(ctx, c.PeerTimeout)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var last peerrun.Progress // peer 0's latest progress line
	for k := range c.Peers {
		args := []string{"run", "--progress-json", "--mdns=false", "--swarm", "lowcomm-" + row.Name,
			"--key", filepath.Join(dir, fmt.Sprintf("k%d", k)),
			"--listen", fmt.Sprintf("/ip4/%s/tcp/%d", addr(k), ports[k])}
		for j := range c.Peers {
			if j != k && !row.Solo {
				args = append(args, "--connect", fmt.Sprintf("/ip4/%s/tcp/%d/p2p/%s", addr(j), ports[j], ids[j]))
			}
		}
		args = append(args, "--shard", fmt.Sprintf("%d/%d", k, c.Peers), "--min-peers", fmt.Sprint(minPeers),
			"--model", c.Model, "--stall-timeout", "20s", "--wait", "60s", "--linger", "2s",
			"--out", filepath.Join(rd, fmt.Sprintf("o%d", k)), "--trace", filepath.Join(rd, fmt.Sprintf("trace%d.json", k)))
		if c.Data != "" {
			args = append(args, "--data", c.Data)
		}
		args = append(append(args, c.Extra...), row.Args...)
		name := self
		if c.Netns {
			name, args = "ip", append([]string{"netns", "exec", fmt.Sprintf("h%d", k), self}, args...)
		}
		cmd := exec.CommandContext(pctx, name, args...)
		cmd.SysProcAttr = spawn.DieWithParent()
		// Past the deadline a peer is asked to stop (and writes its
		// summary), then killed 10 s later.
		cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
		cmd.WaitDelay = 10 * time.Second
		logf, err := os.Create(filepath.Join(dir, fmt.Sprintf("%s.log%d", row.Name, k)))
		if err != nil {
			return lowCommResult{}, err
		}
		defer logf.Close()
		cmd.Stderr = logf
		out, err := cmd.StdoutPipe()
		if err != nil {
			return lowCommResult{}, err
		}
		if err := cmd.Start(); err != nil {
			cancel()
			wg.Wait()
			return lowCommResult{}, fmt.Errorf("experiment lowcomm: row %s, peer %d: %w", row.Name, k, err)
		}
		wg.Go(func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				var p peerrun.Progress
				if k == 0 && json.Unmarshal(sc.Bytes(), &p) == nil {
					mu.Lock()
					last = p
					mu.Unlock()
				}
			}
			if err := cmd.Wait(); err != nil {
				fmt.Fprintf(logf, "experiment lowcomm: %v\n", err)
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	tick := time.NewTicker(30 * time.Second)
	defer tick.Stop()
	fmt.Fprintf(stderr, "lowcomm: row %s: %d peers started\n", row.Name, c.Peers)
wait:
	for {
		select {
		case <-done:
			break wait
		case <-tick.C:
			mu.Lock()
			p := last
			mu.Unlock()
			fmt.Fprintf(stderr, "lowcomm: row %s: %.0f s, peer 0 at round %d of %d, %.4f bits/char\n", row.Name, time.Since(start).Seconds(), p.Round, p.Rounds, p.BitsPerChar)
		}
	}
	wall := time.Since(start)
	if err := ctx.Err(); err != nil {
		return lowCommResult{}, err
	}
	res := summarizeRow(rd, c.Peers, row.Name, wall)
	if pctx.Err() != nil {
		res.Errors = append([]string{fmt.Sprintf("stopped after --peer-timeout %v", c.PeerTimeout)}, res.Errors...)
	}
	return res, nil
}
