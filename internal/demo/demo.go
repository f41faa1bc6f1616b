// Package demo is `peer demo`: it starts a small swarm of `peer run`
// processes on this machine over loopback TCP, shows one progress view for
// all of them, and writes plots and a summary when they finish. It cleans
// up its processes on exit or Ctrl-C.
package demo

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/starling-ml/starling/internal/peerrun"
	"github.com/starling-ml/starling/internal/plot"
	"github.com/starling-ml/starling/internal/progress"
	"github.com/starling-ml/starling/internal/spawn"
	"github.com/starling-ml/starling/internal/ui"
	"github.com/starling-ml/starling/node"
)

// Options configures the demo.
type Options struct {
	Exe       string   // the peer binary to start (os.Executable())
	Peers     int      // number of peer processes
	Out       string   // output folder
	Rounds    int      // federated rounds
	Target    float64  // accuracy to report time-to-target for
	Partition string   // data split
	Extra     []string // more `peer run` flags, passed to every peer
	Timeout   time.Duration
	// UI serves a live dashboard of the swarm on this address ("" for
	// none; port 0 picks one); its URL is printed.
	UI string
}

// DefaultOptions returns the demo the README runs: 4 peers, non-IID MNIST
// (Dirichlet α=0.5), FedAvg of the 2NN MLP.
func DefaultOptions() Options {
	return Options{Peers: 4, Out: filepath.Join("out", "demo"), Rounds: 15, Target: 0.97, Partition: "dirichlet:0.5", Timeout: 15 * time.Minute, UI: "127.0.0.1:0"}
}

// Result is the demo's summary.json.
type Result struct {
	Peers           int                `json:"peers"`
	Partition       string             `json:"partition"`
	Rounds          int                `json:"rounds"`
	FinalAccuracy   float64            `json:"final_accuracy"`
	Target          float64            `json:"target"`
	SecondsToTarget float64            `json:"seconds_to_target"` // -1 if not reached
	WallS           float64            `json:"wall_s"`
	Curve           []peerrun.Progress `json:"curve"` // one point per round
	PeerSummaries   []string           `json:"peer_summaries"`
}

// Run runs the demo.
func Run(ctx context.Context, o Options, stdout, stderr io.Writer) (*Result, error) {
	if o.Peers < 2 {
		return nil, fmt.Errorf("demo: needs at least 2 peers, got %d", o.Peers)
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	// Identities and ports are fixed up front, so that every peer can be
	// told where the others are (mDNS needs multicast on loopback, which
	// most machines do not enable).
	ports, err := spawn.FreePorts(o.Peers)
	if err != nil {
		return nil, err
	}
	addrs := make([]string, o.Peers)
	keys := make([]string, o.Peers)
	for i := range addrs {
		keys[i] = filepath.Join(o.Out, fmt.Sprintf("peer%d.key", i))
		os.Remove(keys[i])
		sk, err := node.LoadOrCreateIdentity(keys[i])
		if err != nil {
			return nil, err
		}
		id, err := peer.IDFromPrivateKey(sk)
		if err != nil {
			return nil, err
		}
		addrs[i] = fmt.Sprintf("/ip4/127.0.0.1/tcp/%d/p2p/%s", ports[i], id)
	}
	fmt.Fprintf(stderr, "starting %d peers on loopback (non-IID MNIST, %s), output in %s\n", o.Peers, o.Partition, o.Out)

	type line struct {
		peer int
		p    peerrun.Progress
	}
	lines := make(chan line, 1024)
	var wg sync.WaitGroup
	errs := make([]error, o.Peers)
	var (
		failMu sync.Mutex
		failed = -1 // the first peer that failed while the demo ran
	)
	logs := make([]*os.File, o.Peers)
	start := time.Now()
	for i := 0; i < o.Peers; i++ {
		args := []string{"run",
			"--listen", fmt.Sprintf("/ip4/127.0.0.1/tcp/%d", ports[i]),
			"--key", keys[i], "--swarm", "demo", "--mdns=true",
			"--shard", fmt.Sprintf("%d/%d", i, o.Peers), "--partition", o.Partition,
			"--min-peers", strconv.Itoa(o.Peers), "--rounds", strconv.Itoa(o.Rounds),
			"--progress-json", "--out", filepath.Join(o.Out, fmt.Sprintf("peer%d", i)),
			"--checkpoint", filepath.Join(o.Out, fmt.Sprintf("peer%d.ckpt", i)),
		}
		for j := 0; j < i; j++ {
			args = append(args, "--connect", addrs[j])
		}
		args = append(args, o.Extra...)
		cmd := exec.CommandContext(ctx, o.Exe, args...)
		cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
		cmd.WaitDelay = 5 * time.Second
		cmd.SysProcAttr = spawn.DieWithParent()
		logf, err := os.Create(filepath.Join(o.Out, fmt.Sprintf("peer%d.log", i)))
		if err != nil {
			return nil, err
		}
		logs[i] = logf
		cmd.Stderr = logf
		outPipe, err := cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			cancel()
			wg.Wait()
			return nil, fmt.Errorf("demo: starting peer %d: %w", i, err)
		}
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			sc := bufio.NewScanner(outPipe)
			for sc.Scan() {
				var p peerrun.Progress
				if json.Unmarshal(sc.Bytes(), &p) == nil {
					lines <- line{i, p}
				}
			}
			errs[i] = cmd.Wait()
			if errs[i] != nil && ctx.Err() == nil {
				// One peer failing ends the demo: the others would wait
				// for it until their deadlines.
				failMu.Lock()
				if failed < 0 {
					failed = i
				}
				failMu.Unlock()
				cancel()
			}
		}(i)
	}
	go func() { wg.Wait(); close(lines) }()

	res := &Result{Peers: o.Peers, Partition: o.Partition, Rounds: o.Rounds, Target: o.Target, SecondsToTarget: -1}
	var board *ui.Board
	if o.UI != "" {
		board = ui.New(fmt.Sprintf("demo: %d peers, FedAvg on MNIST (%s)", o.Peers, o.Partition), o.Rounds, nil, nil)
		url, err := ui.Serve(ctx, o.UI, board)
		if err != nil {
			cancel()
			return nil, fmt.Errorf("demo: %w", err)
		}
		fmt.Fprintf(stdout, "live dashboard: %s\n", url)
	}
	bar := progress.New(stderr)
	byRound := map[int]peerrun.Progress{}
	for l := range lines {
		p := l.p
		if board != nil && p.Round > 0 {
			board.Point(p.Peer, ui.Point{Round: p.Round, Seconds: time.Since(start).Seconds(), Accuracy: p.Accuracy, Loss: p.Loss, Peers: p.Peers})
			if p.Note != "" {
				board.Event(p.Peer, fmt.Sprintf("round %d", p.Round), p.Note)
			}
		}
		if _, seen := byRound[p.Round]; seen || p.Round == 0 {
			continue
		}
		p.Seconds = time.Since(start).Seconds()
		byRound[p.Round] = p
		if p.Accuracy >= o.Target && res.SecondsToTarget < 0 {
			res.SecondsToTarget = p.Seconds
		}
		bar.Update(p.Round, o.Rounds, fmt.Sprintf("round %d/%d  test accuracy %.2f%%  peers %d  %.0fs", p.Round, o.Rounds, 100*p.Accuracy, p.Peers, p.Seconds))
	}
	bar.Done()
	if board != nil {
		board.Done()
	}
	for _, f := range logs {
		f.Close()
	}
	res.WallS = time.Since(start).Seconds()
	rounds := make([]int, 0, len(byRound))
	for r := range byRound {
		rounds = append(rounds, r)
	}
	sort.Ints(rounds)
	for _, r := range rounds {
		res.Curve = append(res.Curve, byRound[r])
	}
	if n := len(res.Curve); n > 0 {
		res.FinalAccuracy = res.Curve[n-1].Accuracy
	}
	for i := 0; i < o.Peers; i++ {
		res.PeerSummaries = append(res.PeerSummaries, filepath.Join(o.Out, fmt.Sprintf("peer%d", i), "summary.json"))
	}
	if err := writeOutputs(o.Out, res); err != nil {
		return res, err
	}
	peerErr := func(i int) error {
		log := filepath.Join(o.Out, fmt.Sprintf("peer%d.log", i))
		return fmt.Errorf("demo: peer %d failed (%v): %s (log: %s)", i, errs[i], lastLine(log), log)
	}
	// The peer that failed first, not the others it stopped, nor the
	// cancellation it caused.
	if failed >= 0 {
		return res, peerErr(failed)
	}
	if ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return res, ctx.Err()
	}
	for i, err := range errs {
		if err != nil {
			return res, peerErr(i)
		}
	}
	if len(res.Curve) < o.Rounds {
		return res, fmt.Errorf("demo: finished %d of %d rounds", len(res.Curve), o.Rounds)
	}
	return res, nil
}

// lastLine returns the last non-empty line of the file at path (at most
// its last 4 KiB), or a note that there is none.
func lastLine(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return "no log"
	}
	defer f.Close()
	var buf [4096]byte
	if fi, err := f.Stat(); err == nil && fi.Size() > int64(len(buf)) {
		f.Seek(fi.Size()-int64(len(buf)), io.SeekStart)
	}
	n, _ := io.ReadFull(f, buf[:])
	lines := strings.Split(strings.TrimSpace(string(buf[:n])), "\n")
	if last := strings.TrimSpace(lines[len(lines)-1]); last != "" {
		return last
	}
	return "its log is empty"
}

func writeOutputs(dir string, res *Result) error {
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "summary.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	var xs, acc, loss, secs []float64
	for _, p := range res.Curve {
		xs = append(xs, float64(p.Round))
		acc = append(acc, p.Accuracy)
		loss = append(loss, p.Loss)
		secs = append(secs, p.Seconds)
	}
	if err := plot.Lines(filepath.Join(dir, "accuracy.png"), "Test accuracy of the global model", "round", "accuracy",
		[]plot.Series{{Name: "FedAvg, " + res.Partition, X: xs, Y: acc}}); err != nil {
		return err
	}
	if err := plot.Lines(filepath.Join(dir, "accuracy_time.png"), "Test accuracy over wall-clock time", "seconds", "accuracy",
		[]plot.Series{{Name: "FedAvg, " + res.Partition, X: secs, Y: acc}}); err != nil {
		return err
	}
	return plot.Lines(filepath.Join(dir, "loss.png"), "Test loss of the global model", "round", "loss",
		[]plot.Series{{Name: "FedAvg, " + res.Partition, X: xs, Y: loss}})
}
