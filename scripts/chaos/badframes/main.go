// Command badframes is the chaos harness's malformed-frame client
// (scripts/chaos.sh): a bare libp2p host, outside any swarm, that connects
// to a peer and writes malformed frames on its tensor and state protocols
// (random bytes, a wrong magic, a huge declared length, a truncated
// header, a huge state request), each on a new stream, for a while. It
// reports how many streams it opened and how many bytes the peer sent back.
//
//	go run ./scripts/chaos/badframes -to /ip4/127.0.0.1/tcp/4001/p2p/12D3… -for 10s
package main

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/starling-ml/starling/node"
	"github.com/starling-ml/starling/swarm"
)

func main() {
	to := flag.String("to", "", "the peer's multiaddr with /p2p/ID")
	dur := flag.Duration("for", 10*time.Second, "how long to send")
	flag.Parse()
	if err := run(*to, *dur); err != nil {
		fmt.Fprintln(os.Stderr, "badframes:", err)
		os.Exit(1)
	}
}

func run(to string, dur time.Duration) error {
	addr, err := ma.NewMultiaddr(to)
	if err != nil {
		return fmt.Errorf("-to: %w", err)
	}
	ai, err := peer.AddrInfoFromP2pAddr(addr)
	if err != nil {
		return fmt.Errorf("-to: %w", err)
	}
	h, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"))
	if err != nil {
		return err
	}
	defer h.Close()
	ctx, cancel := context.WithTimeout(context.Background(), dur+10*time.Second)
	defer cancel()
	if err := h.Connect(ctx, *ai); err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	frames := []func() []byte{
		func() []byte { b := make([]byte, 1+rng.IntN(4096)); fill(rng, b); return b },
		func() []byte { return []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n") },
		func() []byte { // a plausible magic with a huge declared length
			b := make([]byte, 64)
			fill(rng, b)
			copy(b, "STNS")
			binary.LittleEndian.PutUint64(b[8:], 1<<60)
			return b
		},
		func() []byte { return []byte{'S'} }, // truncated
	}
	protos := []protocol.ID{node.ProtocolID, swarm.StateProtocol}
	var streams, back int64
	var errs int
	end := time.Now().Add(dur)
	for i := 0; time.Now().Before(end); i++ {
		sctx, scancel := context.WithTimeout(ctx, 2*time.Second)
		s, err := h.NewStream(sctx, ai.ID, protos[i%len(protos)])
		scancel()
		if err != nil {
			errs++
			if h.Network().Connectedness(ai.ID) != 1 { // network.Connected
				if err := h.Connect(ctx, *ai); err != nil {
					return fmt.Errorf("after %d streams the peer is unreachable: %w", streams, err)
				}
			}
			continue
		}
		streams++
		s.SetDeadline(time.Now().Add(2 * time.Second))
		s.Write(frames[i%len(frames)]())
		s.CloseWrite()
		n, _ := io.Copy(io.Discard, io.LimitReader(s, 1<<20))
		back += n
		s.Reset()
	}
	fmt.Printf("streams=%d stream_errors=%d bytes_back=%d\n", streams, errs, back)
	return nil
}

func fill(rng *rand.Rand, b []byte) {
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
}
