package node

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/starling-ml/starling/compression"
)

// This file holds the one-to-one throughput benchmark behind
// `peer bench transfer` and BenchmarkLoopback: libp2p tensor transfers and,
// as the baseline, Go's crypto/tls over one TCP connection, with the same
// sizes and the same acknowledgement per transfer.

// BenchResult is the outcome of one benchmark run.
type BenchResult struct {
	Bytes   int64         // payload bytes moved
	Elapsed time.Duration // first byte sent to last acknowledgement received
}

// MBps returns the throughput in MB/s (10^6 bytes per second).
func (r BenchResult) MBps() float64 { return float64(r.Bytes) / r.Elapsed.Seconds() / 1e6 }

const (
	benchStartTag Tag = 0xB0_0000_0000_0000
	benchAckBit   Tag = 1 << 62
)

// ServeBench answers RunBench calls from any peer until ctx ends: for each
// run it receives the announced number of tensors into one reused buffer
// and acknowledges each.
func (n *Node) ServeBench(ctx context.Context) error {
	var buf []byte
	for {
		start, err := n.Recv(ctx, "", benchStartTag, make([]byte, 16))
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if len(start.Payload) != 16 {
			return fmt.Errorf("node: bad bench start message")
		}
		session := Tag(binary.LittleEndian.Uint64(start.Payload))
		count := int(binary.LittleEndian.Uint64(start.Payload[8:]))
		if err := n.Send(ctx, start.From, Tensor{Tag: session | benchAckBit, Codec: compression.IDFP32, DType: Uint8, Shape: []int{0}}); err != nil {
			return err
		}
		// Each ack goes out on its own goroutine so that the Recv for the
		// next tensor is already posted when the sender starts it (the
		// zero-copy path, as an all-reduce that posts ahead would use).
		acked := make(chan error, 1)
		acked <- nil
		for i := range count {
			t, err := n.Recv(ctx, start.From, session+Tag(i), buf)
			if err != nil {
				return err
			}
			buf = t.Payload[:cap(t.Payload)]
			if err := <-acked; err != nil {
				return err
			}
			ack := Tensor{Tag: session + Tag(i) | benchAckBit, Codec: compression.IDFP32, DType: Uint8, Shape: []int{0}}
			go func() { acked <- n.Send(ctx, start.From, ack) }()
		}
		if err := <-acked; err != nil {
			return err
		}
	}
}

// RunBench sends payload count times to p (which runs ServeBench), each
// transfer acknowledged before the next, and times them.
func (n *Node) RunBench(ctx context.Context, p peer.ID, payload []byte, count int) (BenchResult, error) {
	size := len(payload)
	session := Tag(randUint64()&0xFFFF_FFFF) << 20
	var hello [16]byte
	binary.LittleEndian.PutUint64(hello[:], uint64(session))
	binary.LittleEndian.PutUint64(hello[8:], uint64(count))
	if err := n.Send(ctx, p, Tensor{Tag: benchStartTag, Codec: compression.IDFP32, DType: Uint8, Shape: []int{16}, Payload: hello[:]}); err != nil {
		return BenchResult{}, err
	}
	if _, err := n.Recv(ctx, p, session|benchAckBit, nil); err != nil {
		return BenchResult{}, err
	}
	t := Tensor{Codec: compression.IDFP32, DType: Uint8, Shape: []int{size}, Payload: payload}
	start := time.Now()
	for i := range count {
		t.Tag = session + Tag(i)
		if err := n.Send(ctx, p, t); err != nil {
			return BenchResult{}, err
		}
		if _, err := n.Recv(ctx, p, t.Tag|benchAckBit, nil); err != nil {
			return BenchResult{}, err
		}
	}
	return BenchResult{Bytes: int64(size) * int64(count), Elapsed: time.Since(start)}, nil
}

func randUint64() uint64 {
	var b [8]byte
	rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:])
}

// ServeTLSBaseline accepts connections on ln until ctx ends or ln closes.
// On each it reads transfers (an 8-byte length, then the bytes) into one
// reused buffer and acknowledges each with one byte. maxBytes bounds a
// transfer.
func ServeTLSBaseline(ctx context.Context, ln net.Listener, maxBytes int64) error {
	cert, err := selfSignedCert()
	if err != nil {
		return err
	}
	tln := tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13})
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	for {
		c, err := tln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		go serveTLSConn(ctx, c, maxBytes)
	}
}

func serveTLSConn(ctx context.Context, c net.Conn, maxBytes int64) {
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	var buf []byte
	var hdr [8]byte
	for {
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		n := int64(binary.LittleEndian.Uint64(hdr[:]))
		if n < 0 || n > maxBytes {
			return
		}
		if int64(cap(buf)) < n {
			buf = make([]byte, n)
		}
		if _, err := io.ReadFull(c, buf[:n]); err != nil {
			return
		}
		if _, err := c.Write([]byte{1}); err != nil {
			return
		}
	}
}

// RunTLSBaseline connects to addr (ServeTLSBaseline) and times count
// transfers of size bytes, each acknowledged before the next.
func RunTLSBaseline(ctx context.Context, addr string, size, count int) (BenchResult, error) {
	d := tls.Dialer{Config: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return BenchResult{}, err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	payload := make([]byte, size)
	rand.Read(payload[:min(size, 1<<20)])
	var hdr [8]byte
	binary.LittleEndian.PutUint64(hdr[:], uint64(size))
	start := time.Now()
	for range count {
		if _, err := c.Write(hdr[:]); err != nil {
			return BenchResult{}, err
		}
		if _, err := c.Write(payload); err != nil {
			return BenchResult{}, err
		}
		if _, err := io.ReadFull(c, hdr[:1]); err != nil {
			return BenchResult{}, err
		}
	}
	return BenchResult{Bytes: int64(size) * int64(count), Elapsed: time.Since(start)}, nil
}

// selfSignedCert makes a throwaway ECDSA P-256 certificate for the
// baseline server (the client skips verification: this measures the
// cipher and the transport, not the PKI).
func selfSignedCert() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
