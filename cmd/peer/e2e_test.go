package main

// End-to-end tests: real peer processes over loopback TCP.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/starling-ml/starling/internal/peerrun"
	"github.com/starling-ml/starling/internal/ui"
	"github.com/starling-ml/starling/node"
	"github.com/starling-ml/starling/train"
)

var (
	buildOnce sync.Once
	peerBin   string
	buildErr  error
)

// binary builds the peer command once per test run.
func binary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end: builds and runs peer processes")
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "peer-e2e")
		if err != nil {
			buildErr = err
			return
		}
		peerBin = filepath.Join(dir, "peer")
		out, err := exec.Command("go", "build", "-o", peerBin, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return peerBin
}

type proc struct {
	// joined lists the rounds whose all-reduce this peer took part in
	// (filled by waitGaps).
	joined []int
	cmd    *exec.Cmd
	lines  chan peerrun.Progress
	done   chan error
	stderr *syncBuffer
}

// syncBuffer is a strings.Builder safe to read while a process writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// tail returns the last n bytes written.
func (s *syncBuffer) tail(n int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	str := s.b.String()
	return str[max(0, len(str)-n):]
}

// freePort returns a loopback port that was free a moment ago, below
// Linux's ephemeral range (32768 up): a port the kernel handed out for :0
// and got back may go to another process binding :0 (two test binaries
// running at once were seen to) or become a connection's source port
// before our peer binds it. It never returns a port twice in one test
// binary: the peers bind with SO_REUSEPORT, so two of them given the same
// port would both listen on it (one then refused to dial the other, "dial
// to self attempted").
func freePort(t *testing.T) int {
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 1000 {
		port := 20000 + rand.IntN(12000)
		if portsGiven[port] {
			continue
		}
		if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			l.Close()
			portsGiven[port] = true
			return port
		}
	}
	t.Fatal("no free loopback port left in 20000–32000")
	return 0
}

var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{}
)

// identity creates a key file and returns the peer's address on port.
func identity(t *testing.T, dir string, i, port int) (key, addr string) {
	key = filepath.Join(dir, fmt.Sprintf("k%d", i))
	sk, err := node.LoadOrCreateIdentity(key)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := peer.IDFromPrivateKey(sk)
	return key, fmt.Sprintf("/ip4/127.0.0.1/tcp/%d/p2p/%s", port, id)
}

// swarmFlags makes n identities in dir on free loopback ports and returns
// the flags of peer i in a swarm whose peers all start together: its
// address and key, shard i/n, --min-peers n, checkpoint dir/c<i>, and
// --connect to every other peer.
func swarmFlags(t *testing.T, dir string, n int) func(i int) []string {
	ports, keys, addrs := make([]int, n), make([]string, n), make([]string, n)
	for i := range n {
		ports[i] = freePort(t)
		keys[i], addrs[i] = identity(t, dir, i, ports[i])
	}
	return func(i int) []string {
		a := []string{"--listen", fmt.Sprintf("/ip4/127.0.0.1/tcp/%d", ports[i]), "--key", keys[i],
			"--shard", fmt.Sprintf("%d/%d", i, n), "--min-peers", fmt.Sprint(n),
			"--checkpoint", filepath.Join(dir, fmt.Sprintf("c%d", i))}
		for j := range n {
			if j != i {
				a = append(a, "--connect", addrs[j])
			}
		}
		return a
	}
}

func start(t *testing.T, bin string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"run", "--progress-json", "--mdns=false", "--swarm", "e2e"}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, lines: make(chan peerrun.Progress, 1000), done: make(chan error, 1), stderr: stderr}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var pr peerrun.Progress
			if json.Unmarshal(sc.Bytes(), &pr) == nil {
				p.lines <- pr
			}
		}
		err := cmd.Wait()
		if err != nil {
			err = fmt.Errorf("%v: %s", err, stderr.tail(1<<20))
		}
		close(p.lines)
		p.done <- err
	}()
	t.Cleanup(func() { cmd.Process.Kill() })
	return p
}

// waitRound reads p's progress until it reports round r or more.
func (p *proc) waitRound(t *testing.T, r int, timeout time.Duration) peerrun.Progress {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case pr, ok := <-p.lines:
			if !ok {
				t.Fatalf("peer exited before round %d: %v", r, <-p.done)
			}
			if pr.Round >= r {
				return pr
			}
		case <-deadline:
			t.Fatalf("no round %d within %v; the peer's log ends:\n%s", r, timeout, p.stderr.tail(4000))
		}
	}
}

func (p *proc) wait(t *testing.T, timeout time.Duration) {
	t.Helper()
	p.waitGaps(t, timeout)
}

// waitGaps is wait, and returns the time between each of the peer's
// progress lines and the one before (by their Seconds), keyed by round.
func (p *proc) waitGaps(t *testing.T, timeout time.Duration) map[int]float64 {
	t.Helper()
	gaps := map[int]float64{}
	read := make(chan struct{})
	go func() {
		defer close(read)
		last := -1.0
		for pr := range p.lines {
			if pr.Note != "" {
				t.Logf("%s round %d: %s", pr.Peer[len(pr.Peer)-6:], pr.Round, pr.Note)
			}
			if pr.Peers > 0 && pr.Note == "" {
				p.joined = append(p.joined, pr.Round)
			}
			if last >= 0 && pr.Round > 0 {
				gaps[pr.Round] = pr.Seconds - last
			}
			last = pr.Seconds
		}
	}()
	select {
	case err := <-p.done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(timeout):
		t.Fatalf("peer did not finish within %v; its log ends:\n%s", timeout, p.stderr.tail(4000))
	}
	<-read
	return gaps
}

// final waits for peer i's process to end well and returns its last
// progress line, logged.
func (p *proc) final(t *testing.T, i int) peerrun.Progress {
	t.Helper()
	var last peerrun.Progress
	for pr := range p.lines {
		last = pr
	}
	if err := <-p.done; err != nil {
		t.Fatalf("peer %d: %v", i, err)
	}
	t.Logf("peer %d: step %d, accuracy %.4f, %s", i, last.Round, last.Accuracy, last.Note)
	return last
}

func common(rounds int) []string {
	return []string{"--model", "logreg", "--limit", "3000", "--rounds", fmt.Sprint(rounds), "--stall-timeout", "2s", "--slowdown", "4",
		"--round-timeout", "20s", "--wait", "30s", "--optimizer", "sgd", "--lr", "0.1"}
}

// startAndKillThird starts n peers with args, kills the third with
// SIGKILL once it reported round 3, and returns the processes and the
// checkpoint it left in dir/c2.
func startAndKillThird(t *testing.T, bin, dir string, n int, args func(int) []string) ([]*proc, *train.Checkpoint) {
	t.Helper()
	procs := make([]*proc, n)
	for i := range procs {
		procs[i] = start(t, bin, args(i)...)
	}
	procs[2].waitRound(t, 3, 60*time.Second)
	procs[2].cmd.Process.Signal(syscall.SIGKILL)
	<-procs[2].done
	ck, err := train.LoadCheckpoint(filepath.Join(dir, "c2"), 1<<24)
	if err != nil {
		t.Fatalf("checkpoint after kill -9: %v", err)
	}
	return procs, ck
}

func TestKillAndResume(t *testing.T) {
	bin := binary(t)
	dir := t.TempDir()
	const n, rounds = 3, 40
	sw := swarmFlags(t, dir, n)
	args := func(i int) []string {
		return append(append(common(rounds), sw(i)...), "--out", filepath.Join(dir, fmt.Sprintf("o%d", i)))
	}
	procs, ck := startAndKillThird(t, bin, dir, n, args)
	if ck.Version < 3 {
		t.Fatalf("checkpoint at version %d, want ≥ 3", ck.Version)
	}
	restarted := start(t, bin, append(args(2), "--resume", "--min-peers", "1")...)
	first := restarted.waitRound(t, 1, 60*time.Second)
	if first.Round <= int(ck.Version) {
		t.Fatalf("restarted peer redid round %d (checkpoint was at %d)", first.Round, ck.Version)
	}
	for _, p := range []*proc{procs[0], procs[1], restarted} {
		p.wait(t, 120*time.Second)
	}
	// The three end on the same global state.
	var states [][]float32
	for i := range n {
		c, err := train.LoadCheckpoint(filepath.Join(dir, fmt.Sprintf("c%d", i)), 1<<24)
		if err != nil {
			t.Fatal(err)
		}
		if c.Version != rounds {
			t.Fatalf("peer %d ended at version %d", i, c.Version)
		}
		states = append(states, c.State)
	}
	if !slices.Equal(states[0], states[1]) || !slices.Equal(states[0], states[2]) {
		t.Fatalf("peers ended with different global states (0=1 %v, 0=2 %v)", slices.Equal(states[0], states[1]), slices.Equal(states[0], states[2]))
	}
}

// TestRejoinNoStall: a peer killed with -9 and restarted with --resume
// while the others train rejoins at a round boundary: no round of the
// survivors but the one the peer died in takes more than 1.5 stall
// timeouts, and the restarted peer takes part in rounds again.
func TestRejoinNoStall(t *testing.T) {
	bin := binary(t)
	dir := t.TempDir()
	const n, rounds, stall = 3, 30, 2.0
	sw := swarmFlags(t, dir, n)
	args := func(i int) []string {
		a := append(common(rounds), sw(i)...)
		return append(a, "--local-epochs", "8")
	}
	procs, ck := startAndKillThird(t, bin, dir, n, args)
	killedAt := int(ck.Version) + 1 // the round it died in
	restarted := start(t, bin, append(args(2), "--resume", "--min-peers", "1")...)
	res := make([]map[int]float64, n)
	var wg sync.WaitGroup
	for i, p := range []*proc{procs[0], procs[1], restarted} {
		wg.Go(func() { res[i] = p.waitGaps(t, 120*time.Second) })
	}
	wg.Wait()
	var all []float64
	for i := range 2 {
		worst, at := 0.0, 0
		for r, g := range res[i] {
			all = append(all, g)
			if r > killedAt+1 && g > worst {
				worst, at = g, r
			}
		}
		t.Logf("peer %d: longest round after round %d (the kill) %.2f s, round %d; %s", i, killedAt+1, worst, at, fmtGaps(res[i]))
		if worst > 1.5*stall {
			t.Errorf("peer %d: round %d took %.2f s, more than 1.5 stall timeouts", i, at, worst)
		}
	}
	slices.Sort(all)
	t.Logf("survivors' round times: median %.3f s, max %.3f s", all[len(all)/2], all[len(all)-1])
	t.Logf("the restarted peer took part in rounds %v", restarted.joined)
	if len(restarted.joined) == 0 {
		t.Error("the restarted peer never took part in a round again")
	}
}

func fmtGaps(g map[int]float64) string {
	var b strings.Builder
	for _, r := range slices.Sorted(maps.Keys(g)) {
		fmt.Fprintf(&b, " %d:%.2f", r, g[r])
	}
	return b.String()
}

// TestDeadConnectAddress: a --connect address nobody answers at (a peer
// that is down) does not keep two live peers from running with
// --min-peers 2; it is logged, with its cause, and redialled in the
// background.
func TestDeadConnectAddress(t *testing.T) {
	bin := binary(t)
	dir := t.TempDir()
	sw := swarmFlags(t, dir, 2)
	_, dead := identity(t, dir, 9, freePort(t)) // nothing listens there
	procs := make([]*proc, 2)
	for i := range procs {
		procs[i] = start(t, bin, append(append(common(100), sw(i)...), "--connect", dead)...)
	}
	for _, p := range procs {
		p.waitRound(t, 2, 60*time.Second)
	}
	port := strings.Split(dead, "/")[4]
	if log := procs[0].stderr.tail(1 << 16); !strings.Contains(log, "cannot reach a --connect address") ||
		!strings.Contains(log, "127.0.0.1:"+port+": connect: connection refused") {
		t.Fatalf("the dead address was not logged with its cause:\n%s", log)
	}
}

func TestLateJoinerSyncs(t *testing.T) {
	bin := binary(t)
	dir := t.TempDir()
	const rounds = 120
	ports := []int{freePort(t), freePort(t), freePort(t)}
	keys, addrs := make([]string, 3), make([]string, 3)
	for i := range keys {
		keys[i], addrs[i] = identity(t, dir, i, ports[i])
	}
	args := func(i int, min int) []string {
		a := append(common(rounds), "--listen", fmt.Sprintf("/ip4/127.0.0.1/tcp/%d", ports[i]), "--key", keys[i],
			"--shard", fmt.Sprintf("%d/3", i), "--min-peers", fmt.Sprint(min), "--checkpoint", filepath.Join(dir, fmt.Sprintf("c%d", i)))
		for j := range i {
			a = append(a, "--connect", addrs[j])
		}
		return a
	}
	a := start(t, bin, args(0, 2)...)
	b := start(t, bin, args(1, 2)...)
	b.waitRound(t, 10, 60*time.Second)
	late := start(t, bin, args(2, 1)...)
	first := late.waitRound(t, 1, 60*time.Second)
	if first.Round <= 10 {
		t.Fatalf("late joiner started at round %d instead of syncing past round 10", first.Round)
	}
	for _, p := range []*proc{a, b, late} {
		p.wait(t, 120*time.Second)
	}
	var ref []float32
	for i := range 3 {
		c, err := train.LoadCheckpoint(filepath.Join(dir, fmt.Sprintf("c%d", i)), 1<<24)
		if err != nil {
			t.Fatal(err)
		}
		if ref == nil {
			ref = c.State
		} else if !slices.Equal(ref, c.State) {
			t.Fatalf("peer %d's final state (version %d) differs; its log ends:\n%s", i, c.Version, []*proc{a, b, late}[i].stderr.tail(8000))
		}
		t.Logf("peer %d: version %d", i, c.Version)
	}
}

func TestDemoSmall(t *testing.T) {
	bin := binary(t)
	out := t.TempDir()
	cmd := exec.Command(bin, "demo", "--peers", "2", "--rounds", "2", "--out", out,
		"--peer-flag=--model=logreg", "--peer-flag=--limit=2000", "--timeout", "2m")
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	if !strings.Contains(string(b), "final test accuracy") {
		t.Fatalf("output: %s", b)
	}
	for _, f := range []string{"summary.json", "accuracy.png", "loss.png", "peer0/summary.json"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Error(err)
		}
	}
}

// TestDemoPeerFails: a peer that exits on bad flags ends the demo with an
// error that names it and quotes its log, not with the cancellation of
// the others ("context canceled", before).
func TestDemoPeerFails(t *testing.T) {
	bin := binary(t)
	out := t.TempDir()
	cmd := exec.Command(bin, "demo", "--peers", "2", "--rounds", "2", "--out", out,
		"--peer-flag=--mode=async", "--timeout", "1m")
	b, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the demo succeeded with peers that cannot start:\n%s", b)
	}
	for _, want := range []string{"demo: peer ", " failed", "--rounds applies to --mode federated", ".log)"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("output lacks %q:\n%s", want, b)
		}
	}
}

func TestRunBadInput(t *testing.T) {
	dir := t.TempDir()
	badCfg := filepath.Join(dir, "bad.json")
	os.WriteFile(badCfg, []byte("{not json"), 0o644)
	wrongCk := filepath.Join(dir, "ck")
	ck := &train.Checkpoint{Arch: "cnn:28x28x1-10", Mode: "federated", Strategy: "fedavg", Version: 3, State: []float32{1}}
	if err := ck.Save(wrongCk); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(wrongCk)
	// The same checkpoint with one weight's lowest mantissa bit flipped
	// (the file ends with the state tensor's last float32): still a
	// finite number, so only the digest can tell.
	flipped := filepath.Join(dir, "flipped")
	damaged := append([]byte(nil), before...)
	damaged[len(damaged)-4] ^= 0x01
	if err := os.WriteFile(flipped, damaged, 0o644); err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		args []string
		want string
	}{
		"unknown flag":       {[]string{"run", "--frobnicate"}, "flag provided but not defined"},
		"unreadable config":  {[]string{"run", "--config", filepath.Join(dir, "missing.json")}, "config file"},
		"bad config":         {[]string{"run", "--config", badCfg}, "not a JSON object"},
		"conflicting modes":  {[]string{"run", "--mode", "sync", "--rounds", "5"}, "conflicting"},
		"sync strategy":      {[]string{"run", "--mode", "sync", "--strategy", "fedprox"}, `unknown sync strategy "fedprox" (want dp or demo)`},
		"demo optimizer":     {[]string{"run", "--mode", "sync", "--strategy", "demo", "--optimizer", "adamw"}, "--strategy demo takes a sign step with plain SGD"},
		"unknown mode":       {[]string{"run", "--mode", "telepathy"}, "unknown --mode"},
		"compress federated": {[]string{"run", "--compress", "fp16"}, "--compress applies to --mode sync, async, ps and federated with --strategy streaming-diloco"},
		"endless async":      {[]string{"run", "--mode", "async", "--steps", "0"}, "needs a --duration"},
		"bad policy":         {[]string{"run", "--mode", "async", "--policy", "hinge:x"}, "policy"},
		"bad gossip":         {[]string{"run", "--mode", "gossip", "--gossip", "flood"}, "gossip algorithm"},
		"ps servers":         {[]string{"run", "--mode", "ps", "--servers", "3", "--min-peers", "2"}, "--servers 3 needs --min-peers ≥ 3"},
		"ps lambda":          {[]string{"run", "--mode", "ps", "--dc-lambda", "-1"}, "DC-ASGD λ -1"},
		"ps flag elsewhere":  {[]string{"run", "--mode", "async", "--servers", "2"}, "--servers applies to --mode ps"},
		"bad shard":          {[]string{"run", "--shard", "3/2"}, "--shard"},
		"resume without":     {[]string{"run", "--resume"}, "--checkpoint"},
		"other model":        {[]string{"run", "--resume", "--checkpoint", wrongCk, "--limit", "100", "--min-peers", "1", "--mdns=false", "--listen", "/ip4/127.0.0.1/tcp/0"}, "checkpoint is for model"},
		"flipped weight":     {[]string{"run", "--resume", "--checkpoint", flipped, "--limit", "100", "--min-peers", "1"}, "SHA-256 digest of its data does not match"},
		// Refused before the peer starts, not after it waited for others.
		"fraction":         {[]string{"run", "--fraction", "1.5"}, "fraction C must be in (0, 1]"},
		"negative rounds":  {[]string{"run", "--rounds", "-1"}, "rounds must be positive"},
		"group size":       {[]string{"run", "--group-size", "-1"}, "group size must not be negative"},
		"sync group size":  {[]string{"run", "--mode", "sync", "--group-size", "-2"}, "group size must not be negative"},
		"agree every":      {[]string{"run", "--mode", "sync", "--agree-every", "0"}, "agreement interval must be at least 1"},
		"sync steps":       {[]string{"run", "--mode", "sync", "--steps", "0"}, "steps must be positive"},
		"sync eval":        {[]string{"run", "--mode", "sync", "--eval-every", "0"}, "--eval-every must be positive"},
		"negative wait":    {[]string{"run", "--wait", "-1s"}, "must not be negative"},
		"negative limit":   {[]string{"run", "--limit", "-5"}, "must not be negative"},
		"checkpoint dir":   {[]string{"run", "--checkpoint", filepath.Join(dir, "no", "ck")}, "no folder"},
		"negative clip":    {[]string{"run", "--mode", "gossip", "--clip-peers", "-1"}, "clip factor"},
		"clip federated":   {[]string{"run", "--clip-peers", "2"}, "--clip-peers applies to --mode async|gossip"},
		"buffer rule":      {[]string{"run", "--mode", "async", "--async", "fedbuff", "--buffer-rule", "krum:f=1"}, "not coordinate-wise"},
		"robust sparse":    {[]string{"run", "--mode", "async", "--async", "fedbuff", "--buffer-rule", "median", "--compress", "topk:0.01,ef"}, "sends models"},
		"buffer rule sync": {[]string{"run", "--mode", "sync", "--buffer-rule", "median"}, "--buffer-rule applies to --mode async"},
		"overlap fedavg":   {[]string{"run", "--overlap", "2"}, "--overlap applies to --strategy streaming-diloco"},
		"overlap too long": {[]string{"run", "--strategy", "streaming-diloco:h=8,fragments=4", "--overlap", "8"}, "overlap 8 must be below h = 8"},
		"streaming ef":     {[]string{"run", "--strategy", "streaming-diloco", "--compress", "fp4:ef"}, "no error-feedback residual"},
		"attack unasked":   {[]string{"run", "--attack", "signflip"}, "add --allow-attack"},
		"attack unknown":   {[]string{"run", "--attack", "bribe", "--allow-attack"}, "unknown attack"},
		"attack bad stale": {[]string{"run", "--attack", "stale:0", "--allow-attack"}, "stale: k="},
	}
	for name, c := range cases {
		var out, errb strings.Builder
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := run(ctx, append(c.args, "--mdns=false", "--listen", "/ip4/127.0.0.1/tcp/0"), &out, &errb)
		cancel()
		if err == nil || !strings.Contains(err.Error()+errb.String(), c.want) {
			t.Errorf("%s: err = %v, want it to mention %q", name, err, c.want)
		}
		if strings.Count(strings.TrimSpace(err.Error()), "\n") > 0 {
			t.Errorf("%s: error is not one line: %q", name, err)
		}
	}
	after, _ := os.ReadFile(wrongCk)
	if string(before) != string(after) {
		t.Fatal("a refused resume overwrote the checkpoint")
	}
	if after, _ := os.ReadFile(flipped); string(after) != string(damaged) {
		t.Fatal("a refused resume overwrote the damaged checkpoint")
	}
}

func TestRunServesMetrics(t *testing.T) {
	bin := binary(t)
	port, uiPort := freePort(t), freePort(t)
	p := start(t, bin, append(common(500), "--listen", "/ip4/127.0.0.1/tcp/0", "--min-peers", "1",
		"--metrics-addr", fmt.Sprintf("127.0.0.1:%d", port), "--ui", fmt.Sprintf("127.0.0.1:%d", uiPort))...)
	p.waitRound(t, 2, 60*time.Second)
	// The dashboard's state is live: the rounds reported so far.
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/api/state", uiPort))
	if err != nil {
		t.Fatal(err)
	}
	var st ui.State
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil || st.Round < 2 || len(st.Live.Members) != 1 || len(st.Curves) != 1 || st.Rounds != 500 {
		t.Errorf("dashboard state: round %d of %d, members %v, %d curves, %v", st.Round, st.Rounds, st.Live.Members, len(st.Curves), err)
	}
	resp, err = http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, want := range []string{"starling_train_round ", "starling_train_test_accuracy", "starling_train_round_seconds_bucket", "libp2p_"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	p.cmd.Process.Kill()
}

// TestAsyncModes runs --mode async (FedAsync, FedBuff) and --mode gossip
// (AD-PSGD, SGP) as two processes each: both peers train, exchange models
// (merged contributions or completed exchanges are counted in the final
// progress note) and end with a model that learned.
func TestAsyncModes(t *testing.T) {
	bin := binary(t)
	for _, mode := range [][]string{
		{"--mode", "async"},
		{"--mode", "async", "--async", "fedbuff", "--buffer-k", "2", "--compress", "fp16"},
		{"--mode", "gossip"},
		{"--mode", "gossip", "--gossip", "sgp"},
		{"--mode", "ps", "--compress", "int8"},
	} {
		t.Run(strings.Join(mode[1:], " "), func(t *testing.T) {
			dir := t.TempDir()
			sw := swarmFlags(t, dir, 2)
			procs := make([]*proc, 2)
			for i := range procs {
				procs[i] = start(t, bin, append(append(slices.Clone(mode), "--model", "logreg", "--limit", "3000", "--optimizer", "sgd", "--lr", "0.1",
					"--slowdown", "20", "--steps", "0", "--duration", "3s", "--eval-every", "20", "--wait", "30s", "--linger", "1s"), sw(i)...)...)
			}
			var exchanged bool
			for i, p := range procs {
				last := p.final(t, i)
				if last.Accuracy < 0.8 {
					t.Errorf("peer %d: accuracy %.4f after %d steps", i, last.Accuracy, last.Round)
				}
				var a, b int
				if _, err := fmt.Sscanf(last.Note, "merged %d", &a); err == nil && a > 0 {
					exchanged = true
				}
				if _, err := fmt.Sscanf(last.Note, "%d exchanges", &b); err == nil && b > 0 {
					exchanged = true
				}
				if _, err := fmt.Sscanf(last.Note, "pushed %d", &b); err == nil && b > 0 {
					exchanged = true
				}
				ck, err := train.LoadCheckpoint(filepath.Join(dir, fmt.Sprintf("c%d", i)), 1<<24)
				if err != nil {
					t.Fatal(err)
				}
				if ck.Mode != mode[1] || ck.Steps != last.Round {
					t.Errorf("peer %d: checkpoint of mode %q at step %d, want %q at %d", i, ck.Mode, ck.Steps, mode[1], last.Round)
				}
			}
			if !exchanged {
				t.Error("no contribution merged and no exchange completed")
			}
		})
	}
}

// TestGossipFixedSteps runs AD-PSGD between two processes for a fixed
// number of steps, the active peer (the lower ID) 4× slower than the
// passive one, which is done first: it must stay in the exchange until the
// active one is done, whose exchanges then all succeed.
func TestGossipFixedSteps(t *testing.T) {
	bin := binary(t)
	dir := t.TempDir()
	sw := swarmFlags(t, dir, 2)
	ids := make([]string, 2)
	for i := range ids {
		sk, err := node.LoadOrCreateIdentity(filepath.Join(dir, fmt.Sprintf("k%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		id, _ := peer.IDFromPrivateKey(sk)
		ids[i] = id.String()
	}
	active := 0
	if ids[1] < ids[0] {
		active = 1
	}
	procs := make([]*proc, 2)
	for i := range procs {
		slow := "1"
		if i == active {
			slow = "4"
		}
		procs[i] = start(t, bin, append([]string{"--mode", "gossip", "--model", "logreg", "--limit", "3000", "--optimizer", "sgd", "--lr", "0.1",
			"--slowdown", slow, "--steps", "300", "--eval-every", "100", "--wait", "30s", "--linger", "1s"}, sw(i)...)...)
	}
	notes := make([]string, 2)
	for i, p := range procs {
		last := p.final(t, i)
		if last.Round != 300 {
			t.Errorf("peer %d ended at step %d, want 300", i, last.Round)
		}
		notes[i] = last.Note
	}
	var ex, failed int
	if _, err := fmt.Sscanf(notes[active], "%d exchanges, %d failed", &ex, &failed); err != nil || ex == 0 || failed != 0 {
		t.Errorf("active peer: %q, want exchanges and none failed", notes[active])
	}
	if !strings.Contains(notes[1-active], "served the active peers") {
		t.Errorf("passive peer: %q, want it to have served the active one after its last step", notes[1-active])
	}
}

// TestFreePortUnique: peers of one test binary never share a port (500
// draws from 12000 ports would repeat one about ten times if unchecked).
func TestFreePortUnique(t *testing.T) {
	seen := map[int]bool{}
	for range 500 {
		p := freePort(t)
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
	}
}

// TestFreezeAndThaw stops one of three federated peers (SIGSTOP: its
// connections stay up, it neither sends nor reads, as behind a partition)
// and continues it later: the other two must go on without it while it is
// frozen, and all three must end on the same global state.
func TestFreezeAndThaw(t *testing.T) {
	bin := binary(t)
	dir := t.TempDir()
	const n, rounds = 3, 40
	sw := swarmFlags(t, dir, n)
	procs := make([]*proc, n)
	for i := range procs {
		procs[i] = start(t, bin, append(common(rounds), sw(i)...)...)
	}
	at := procs[2].waitRound(t, 3, 60*time.Second)
	procs[2].cmd.Process.Signal(syscall.SIGSTOP)
	frozen := time.Now()
	// While it is stopped the others complete rounds without it.
	pr := procs[0].waitRound(t, at.Round+5, 60*time.Second)
	t.Logf("peer 0 at round %d %v after peer 2 froze at round %d", pr.Round, time.Since(frozen), at.Round)
	time.Sleep(2 * time.Second)
	procs[2].cmd.Process.Signal(syscall.SIGCONT)
	for _, p := range procs {
		p.wait(t, 120*time.Second)
	}
	var ref []float32
	for i := range n {
		c, err := train.LoadCheckpoint(filepath.Join(dir, fmt.Sprintf("c%d", i)), 1<<24)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("peer %d: version %d", i, c.Version)
		if c.Version != rounds {
			t.Errorf("peer %d ended at version %d, want %d", i, c.Version, rounds)
		}
		if ref == nil {
			ref = c.State
		} else if !slices.Equal(ref, c.State) {
			t.Errorf("peer %d's final state differs; its log ends:\n%s", i, procs[i].stderr.tail(4000))
		}
	}
}
