package peerrun

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/starling-ml/starling/node"
	"github.com/starling-ml/starling/swarm"
	"github.com/starling-ml/starling/train"
	"github.com/starling-ml/starling/workload"
)

// tinyLM is a CharLM that trains a step in milliseconds.
const tinyLM = "charlm:layers=1,width=16,heads=2,ctx=16"

// writeCorpus writes a text file of lines over the given letters and
// returns its path.
func writeCorpus(t *testing.T, letters string) string {
	t.Helper()
	var b strings.Builder
	for i := range 600 {
		for j := range 24 {
			b.WriteByte(letters[(i*7+j*j)%len(letters)])
		}
		b.WriteByte('\n')
	}
	path := filepath.Join(t.TempDir(), "corpus.txt")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// loopbackPort returns a loopback TCP port that was free a moment ago.
func loopbackPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// lmOptions returns the options of peer i of 2 training model on corpus
// for two short federated rounds.
func lmOptions(t *testing.T, model, corpus string, i int) Options {
	o := Options{Mode: "federated", Swarm: swarm.DefaultConfig(), MinPeers: 2, Wait: 4 * time.Second,
		DataDir: corpus, Partition: "iid", Shard: i, Shards: 2, DataSeed: 1,
		Worker: train.DefaultWorkerConfig(), Fed: train.DefaultFedConfig(),
		Sync: DefaultSyncOptions(), Async: DefaultAsyncOptions()}
	o.Swarm.Node = node.TestConfig()
	o.Swarm.Gossip.Namespace = "workload-test"
	o.Worker.Model, o.Worker.Optimizer, o.Worker.LR, o.Worker.Batch = model, "adamw", 1e-3, 8
	o.Fed.Rounds, o.Fed.Fraction, o.Fed.LocalSteps, o.Fed.LocalEpochs, o.Fed.RoundTimeout = 2, 1, 2, 0, 20*time.Second
	return o
}

// runPair runs two peers over loopback, each dialling the other, with the
// given models and corpora, and returns their summaries and errors.
func runPair(t *testing.T, models, corpora [2]string) (sums [2]*Summary, errs [2]error) {
	t.Helper()
	dir := t.TempDir()
	var keys, addrs [2]string
	var ports [2]int
	for i := range 2 {
		keys[i] = filepath.Join(dir, fmt.Sprint("k", i))
		sk, err := node.LoadOrCreateIdentity(keys[i])
		if err != nil {
			t.Fatal(err)
		}
		id, _ := peer.IDFromPrivateKey(sk)
		ports[i] = loopbackPort(t)
		addrs[i] = fmt.Sprintf("/ip4/127.0.0.1/tcp/%d/p2p/%s", ports[i], id)
	}
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 2 {
		o := lmOptions(t, models[i], corpora[i], i)
		o.Swarm.Gossip.Namespace = strings.ReplaceAll(t.Name(), "/", "-")
		o.Swarm.Node.KeyFile = keys[i]
		o.Swarm.Node.ListenAddrs = []string{fmt.Sprintf("/ip4/127.0.0.1/tcp/%d", ports[i])}
		o.Connect = []string{addrs[1-i]}
		wg.Go(func() { sums[i], errs[i] = Run(ctx, o, io.Discard, io.Discard) })
	}
	wg.Wait()
	return sums, errs
}

// TestArchitectureMismatch: peers whose models differ in width or in
// vocabulary never average: each waits for a peer of its own model and
// gives up at --wait with an error that says it heard another model,
// while peers of one model train together.
func TestArchitectureMismatch(t *testing.T) {
	if testing.Short() {
		t.Skip("starts libp2p peers")
	}
	// Vocabularies of one size: the models differ only in which
	// character each row of the embedding stands for.
	code, prose := writeCorpus(t, "func(){}[]abcdefgh \t"), writeCorpus(t, "abcdefghijklmnopq ")
	var sizes [2]int
	for i, c := range []string{code, prose} {
		wl, err := workload.Load(workload.Config{Model: tinyLM, Data: c, Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		sizes[i] = wl.Vocab.Size()
	}
	if sizes[0] != sizes[1] {
		t.Fatalf("vocabularies of %d and %d tokens, want one size", sizes[0], sizes[1])
	}
	cases := []struct {
		name    string
		models  [2]string
		corpora [2]string
		same    bool
	}{
		{"same", [2]string{tinyLM, tinyLM}, [2]string{code, code}, true},
		{"width", [2]string{tinyLM, "charlm:layers=1,width=8,heads=2,ctx=16"}, [2]string{code, code}, false},
		{"vocabulary", [2]string{tinyLM, tinyLM}, [2]string{code, prose}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			sums, errs := runPair(t, c.models, c.corpora)
			if c.same {
				for i, err := range errs {
					if err != nil {
						t.Fatalf("peer %d: %v", i, err)
					}
				}
				if sums[0].ModelID != sums[1].ModelID || sums[0].Rounds != 2 || sums[1].Rounds != 2 || sums[0].Curve[1].Peers != 2 || !(sums[0].ValBitsPerChar > 0) {
					t.Fatalf("summaries: %+v, %+v", sums[0], sums[1])
				}
				return
			}
			for i, err := range errs {
				if err == nil || !strings.Contains(err.Error(), "peers training another model") || strings.Contains(err.Error(), "\n") {
					t.Errorf("peer %d: %v, want a one-line error saying it ignored another model", i, err)
				}
			}
			if d := time.Since(start); d > 15*time.Second {
				t.Errorf("took %v, want the 4 s wait and little more", d)
			}
		})
	}
}
