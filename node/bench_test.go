package node

import (
	"context"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// BenchmarkLoopback moves 256 MiB tensors between two real hosts on
// loopback and, in the same iteration, the same bytes over Go's crypto/tls
// on one TCP connection: the "x-tls" metric is libp2p's throughput over
// the baseline's, interleaved so that both see the same machine load.
//
//	go test ./node -run XXX -bench Loopback -benchtime 3x
func BenchmarkLoopback(b *testing.B) {
	const size = 256 << 20
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go ServeBaseline(ctx, ln, size)
	tlsc, err := DialBaseline(ctx, ln.Addr().String(), true)
	if err != nil {
		b.Fatal(err)
	}
	defer tlsc.Close()

	psk, _ := GeneratePSK()
	dir := b.TempDir()
	keys := [2]string{dir + "/a.key", dir + "/b.key"}
	var ids [2]peer.ID
	for i, k := range keys {
		if _, err := LoadOrCreateIdentity(k); err != nil {
			b.Fatal(err)
		}
		ids[i], _ = PeerIDFromKeyFile(k)
	}
	variants := []struct {
		name string
		mut  func(c *Config, other peer.ID)
	}{
		{"stripes=1", func(c *Config, _ peer.ID) { c.Stripes = 1 }},
		{"stripes=2", func(c *Config, _ peer.ID) { c.Stripes = 2 }},
		{"stripes=4", func(c *Config, _ peer.ID) { c.Stripes = 4 }},
		{"stripes=8", func(c *Config, _ peer.ID) { c.Stripes = 8 }},
		{"psk/stripes=4", func(c *Config, _ peer.ID) { c.Stripes = 4; c.PSK = psk }},
		{"allowlist/stripes=4", func(c *Config, p peer.ID) { c.Stripes = 4; c.Allowlist = []peer.ID{p} }},
	}
	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			sender := newTestNode(b, func(c *Config) { c.KeyFile = keys[0]; v.mut(c, ids[1]) })
			recv := newTestNode(b, func(c *Config) { c.KeyFile = keys[1]; v.mut(c, ids[0]) })
			connect(b, sender, recv)
			go recv.ServeBench(ctx)
			// Warm up: connection, windows, buffers.
			payload := randBytes(size, 3)
			if _, err := sender.RunBench(ctx, recv.ID(), payload, 1); err != nil {
				b.Fatal(err)
			}
			if _, err := tlsc.Run(ctx, payload, 1); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(size)
			b.ReportAllocs()
			var p2p, base, p2pCPU, baseCPU time.Duration
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				c0 := cpuTime()
				r, err := tlsc.Run(ctx, payload, 1)
				if err != nil {
					b.Fatal(err)
				}
				base += r.Elapsed
				c1 := cpuTime()
				baseCPU += c1 - c0
				b.StartTimer()
				r, err = sender.RunBench(ctx, recv.ID(), payload, 1)
				if err != nil {
					b.Fatal(err)
				}
				p2p += r.Elapsed
				p2pCPU += cpuTime() - c1
			}
			b.ReportMetric(float64(size)*float64(b.N)/base.Seconds()/1e6, "tls-MB/s")
			b.ReportMetric(base.Seconds()/p2p.Seconds(), "x-tls")
			// CPU seconds (both ends, this process) per byte relative to
			// crypto/tls: insensitive to other load on the machine.
			b.ReportMetric(p2pCPU.Seconds()/baseCPU.Seconds(), "cpu-x-tls")
		})
	}
}

// BenchmarkFrameDecode measures the receiver's per-frame cost (header
// parse, checksum) on an in-memory frame.
func BenchmarkFrameDecode(b *testing.B) {
	for _, n := range []int{4 << 10, 1 << 20, 16 << 20} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			h := rawHeader(1, uint64(n/4))
			frame := appendFrame(nil, &h, randBytes(n, 1))
			dst := make([]byte, n)
			r := &bytesReader{}
			b.SetBytes(int64(n))
			b.ReportAllocs()
			for range b.N {
				r.b = frame
				if _, _, err := decodeFrame(r, 1<<30, func(int) []byte { return dst }); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// cpuTime returns this process's user+system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

type bytesReader struct{ b []byte }

func (r *bytesReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	return n, nil
}
