package p2p_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/starling-ml/starling/aggregate"
	"github.com/starling-ml/starling/aggregate/aggtest"
	"github.com/starling-ml/starling/aggregate/p2p"
	"github.com/starling-ml/starling/aggregate/rule"
	"github.com/starling-ml/starling/node"
	"github.com/starling-ml/starling/peerid"
)

// TestKillRealProcess runs a round between peers in this process and one
// in a child process, over libp2p on loopback TCP, and SIGKILLs the child
// at a chosen point of the protocol: the survivors must finish without it,
// within p2p.DisconnectGrace (its connections close). A child frozen with SIGSTOP instead
// keeps its connections: the watchdogs find it.
func TestKillRealProcess(t *testing.T) {
	if os.Getenv("AGG_CHILD") != "" {
		runChild(t)
		return
	}
	t.Parallel()
	cases := []childCase{
		// 5 peers, 50,000 values in chunks of 4,096: shards and ring
		// segments of 3 chunks; tree 0→{1,2}, 1→{3,4}.
		{"butterfly/before-sending", aggregate.Butterfly, 3, aggregate.StepScatter, 1, false},
		{"butterfly/mid-send", aggregate.Butterfly, 1, aggregate.StepScatter, 7, false},
		{"butterfly/while-reducing", aggregate.Butterfly, 0, aggregate.StepGather, 1, false},
		{"tree/leaf-before-sending", aggregate.Tree, 4, aggregate.StepUp, 1, false},
		{"tree/inner-while-reducing", aggregate.Tree, 1, aggregate.StepUp, 2, false},
		{"tree/root-mid-broadcast", aggregate.Tree, 0, aggregate.StepDown, 4, false},
		{"ring/before-sending", aggregate.Ring, 4, aggregate.StepRing, 1, false},
		{"ring/mid-reduce", aggregate.Ring, 2, aggregate.StepRing, 6, false},
		{"ring/mid-gather", aggregate.Ring, 3, aggregate.StepRing, 18, false},
		{"ring/frozen-mid-reduce", aggregate.Ring, 1, aggregate.StepRing, 6, true},
		{"butterfly/frozen-mid-send", aggregate.Butterfly, 2, aggregate.StepScatter, 7, true},
		{"tree/frozen-inner-while-reducing", aggregate.Tree, 1, aggregate.StepUp, 2, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { killChild(t, tc) })
	}
}

type childCase struct {
	name   string
	algo   aggregate.Algorithm
	rank   int // the child's rank in the group
	step   aggregate.Step
	nth    int
	freeze bool // SIGSTOP instead of SIGKILL
}

const (
	childPeers = 4 // in this process; plus the child
	childDim   = 50_000
	childStall = 2 * time.Second // real time, on a machine that may be busy
)

func childConfig(algo aggregate.Algorithm) aggregate.Config {
	cfg := aggregate.DefaultConfig()
	cfg.Algorithm, cfg.StallTimeout, cfg.ChunkElems = algo, childStall, 4096
	return cfg
}

func killChild(t *testing.T, tc childCase) {
	algo, rank, step, nth := tc.algo, tc.rank, tc.step, tc.nth
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestKillRealProcess$")
	cmd.Env = append(os.Environ(), "AGG_CHILD=1",
		fmt.Sprintf("AGG_CHILD_ALGO=%d", algo), fmt.Sprintf("AGG_CHILD_STEP=%d", step), fmt.Sprintf("AGG_CHILD_NTH=%d", nth))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	lines := bufio.NewScanner(stdout)
	child := readChild(t, lines, "ADDR")
	info, err := peer.AddrInfoFromString(child[0])
	if err != nil {
		t.Fatal(err)
	}

	nodes := make([]*node.Node, childPeers)
	for i := range nodes {
		nodes[i], err = node.New(ctx, node.TestConfig())
		if err != nil {
			t.Fatal(err)
		}
		defer nodes[i].Close()
	}
	for i, n := range nodes {
		if err := n.Connect(ctx, *info); err != nil {
			t.Fatal(err)
		}
		for _, m := range nodes[:i] {
			if err := n.Connect(ctx, m.AddrInfo()); err != nil {
				t.Fatal(err)
			}
		}
	}
	ids := []peerid.ID{p2p.ID(info.ID)}
	for _, n := range nodes {
		ids = append(ids, p2p.ID(n.ID()))
	}
	// Pick a round in which the child has the wanted rank.
	var g aggregate.Group
	for round := uint64(1); ; round++ {
		g, _ = aggregate.Form(round, ids)
		if g.Rank(ids[0]) == rank {
			break
		}
	}
	fmt.Fprintf(stdin, "RUN %d %s\n", g.Round(), strings.Join(peerStrings(ids), " "))

	runners := make([]*aggregate.Runner, childPeers)
	for i, n := range nodes {
		tr := p2p.New(n)
		defer tr.Close()
		runners[i], err = aggregate.NewRunner(ids[i+1], tr, childConfig(algo), debugOpts()...)
		if err != nil {
			t.Fatal(err)
		}
	}
	srcs, w := randVecs(3, childPeers, childDim)

	// Kill (or freeze) the child as soon as it reports the protocol point.
	killed := make(chan struct{})
	go func() {
		readChild(t, lines, "AT")
		if tc.freeze {
			cmd.Process.Signal(syscall.SIGSTOP) // killed by the deferred Kill
		} else {
			cmd.Process.Kill()
		}
		close(killed)
		io.Copy(io.Discard, stdout)
	}()
	outs := make([]aggtest.Outcome, childPeers)
	var wg sync.WaitGroup
	start := time.Now()
	for i, r := range runners {
		outs[i].Out = make([]float32, childDim)
		wg.Go(func() {
			outs[i].Result, outs[i].Err = r.AllReduce(ctx, g, outs[i].Out, srcs[i], w[i])
			outs[i].Elapsed = time.Since(start)
		})
	}
	wg.Wait()
	if tc.freeze {
		cmd.Process.Kill() // before the nodes close their connections to it
	}
	select {
	case <-killed:
	default:
		t.Fatal("the child never reached the kill point")
	}
	all := []int{0, 1, 2, 3}
	for _, i := range all {
		res := outs[i].Result
		if outs[i].Err != nil {
			t.Fatalf("survivor %d: %v", i, outs[i].Err)
		}
		if res.Group.Rank(ids[0]) >= 0 || len(res.Excluded) != 1 || res.Excluded[0].Peer != ids[0] || !errors.Is(res.Excluded[0], aggregate.ErrStall) {
			t.Fatalf("survivor %d: %+v", i, res)
		}
	}
	checkSame(t, outs, all, expected(t, rule.Mean{}, outs[0].Result.Group, ids[1:], srcs, w))
	slowest := slices.MaxFunc(outs, func(a, b aggtest.Outcome) int { return int(a.Elapsed - b.Elapsed) }).Elapsed
	t.Logf("survivors done in %v (stall timeout %v)", slowest, childStall)
	switch {
	case !tc.freeze && slowest >= childStall:
		// The child's connections closed with it: the survivors know
		// after DisconnectGrace (a wait that timed out takes two stall
		// timeouts, then a vote window).
		t.Errorf("survivors took %v: the killed peer's closed connections went unnoticed", slowest)
	case tc.freeze && slowest > 3*childStall:
		// A frozen process answers no probe: out after half a stall
		// timeout of silence and a stall timeout's unanswered probe (a
		// wait on a single member: one stall timeout), then a re-run.
		// Without probes the ring took 4 stall timeouts: a dependent wait
		// of two, then two more for the frozen member's vote.
		t.Errorf("survivors took %v, more than 3 stall timeouts", slowest)
	}
}

func peerStrings(ids []peerid.ID) []string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = string(id)
	}
	return s
}

// readChild returns the fields after the first line that starts with word.
func readChild(t *testing.T, lines *bufio.Scanner, word string) []string {
	for lines.Scan() {
		f := strings.Fields(lines.Text())
		if len(f) > 0 && f[0] == word {
			return f[1:]
		}
	}
	t.Errorf("child exited before %s: %v", word, lines.Err())
	return nil
}

// runChild is the child process: one peer on loopback that runs the round
// and freezes at the protocol point it was given, saying so on stdout.
func runChild(t *testing.T) {
	atoi := func(k string) int { v, _ := strconv.Atoi(os.Getenv(k)); return v }
	ctx := context.Background()
	n, err := node.New(ctx, node.TestConfig())
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("ADDR %s/p2p/%s\n", n.Addrs()[0], n.ID())
	in := bufio.NewScanner(os.Stdin)
	if !in.Scan() {
		t.Fatal("no RUN line")
	}
	f := strings.Fields(in.Text())
	round, _ := strconv.ParseUint(f[1], 10, 64)
	var ids []peerid.ID
	for _, s := range f[2:] {
		ids = append(ids, peerid.ID(s))
	}
	g, _ := aggregate.Form(round, ids)
	step, nth := aggregate.Step(atoi("AGG_CHILD_STEP")), atoi("AGG_CHILD_NTH")
	var once sync.Once
	hook := aggtest.At(p2p.ID(n.ID()), step, nth, aggtest.Stall)
	announce := func(from, to peerid.ID, tag aggregate.Tag, data []float32) aggtest.Action {
		a := hook(from, to, tag, data)
		if a == aggtest.Stall {
			once.Do(func() { fmt.Println("AT"); os.Stdout.Sync() })
		}
		return a
	}
	tr := aggtest.NewFaulty(p2p.New(n), p2p.ID(n.ID()), announce, nil)
	r, err := aggregate.NewRunner(p2p.ID(n.ID()), tr, childConfig(aggregate.Algorithm(atoi("AGG_CHILD_ALGO"))), debugOpts()...)
	if err != nil {
		t.Fatal(err)
	}
	srcs, _ := randVecs(99, 1, childDim)
	r.AllReduce(ctx, g, make([]float32, childDim), srcs[0], 1)
	select {} // wait for SIGKILL
}
