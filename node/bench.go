package node

import (
	"bufio"
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
// as baselines, Go's crypto/tls over one TCP connection and plain TCP, with
// the same sizes and the same acknowledgement per transfer.

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

// ServeBaseline accepts connections on ln until ctx ends or ln closes: Go's
// crypto/tls (TLS 1.3, AES-GCM) over TCP, or — for a client that opens
// with rawMagic — plain TCP, the link's ceiling. On each connection it reads
// transfers (an 8-byte length, then the bytes) into one reused buffer and
// acknowledges each with one byte. maxBytes bounds a transfer.
func ServeBaseline(ctx context.Context, ln net.Listener, maxBytes int64) error {
	cert, err := selfSignedCert()
	if err != nil {
		return err
	}
	tcfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13}
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		go serveBaselineConn(ctx, c, tcfg, maxBytes)
	}
}

const rawMagic = "RAW!"

func serveBaselineConn(ctx context.Context, c net.Conn, tcfg *tls.Config, maxBytes int64) {
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	br := bufio.NewReaderSize(c, 64<<10)
	first, err := br.Peek(4)
	if err != nil {
		return
	}
	var r io.Reader = br
	var w io.Writer = c
	if string(first) == rawMagic {
		br.Discard(4)
	} else {
		tc := tls.Server(&bufferedConn{c, br}, tcfg)
		r, w = tc, tc
	}
	var buf []byte
	var hdr [8]byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return
		}
		n := int64(binary.LittleEndian.Uint64(hdr[:]))
		if n < 0 || n > maxBytes {
			return
		}
		if int64(cap(buf)) < n {
			buf = make([]byte, n)
		}
		if _, err := io.ReadFull(r, buf[:n]); err != nil {
			return
		}
		if _, err := w.Write([]byte{1}); err != nil {
			return
		}
	}
}

// bufferedConn is a net.Conn whose reads go through a bufio.Reader that has
// already peeked at the first bytes.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// BaselineClient is one connection to ServeBaseline.
type BaselineClient struct {
	c net.Conn
}

// DialBaseline connects to ServeBaseline at addr, over crypto/tls when
// useTLS is set, plain TCP otherwise.
func DialBaseline(ctx context.Context, addr string, useTLS bool) (*BaselineClient, error) {
	if !useTLS {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		if _, err := c.Write([]byte(rawMagic)); err != nil {
			c.Close()
			return nil, err
		}
		return &BaselineClient{c}, nil
	}
	d := tls.Dialer{Config: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return &BaselineClient{c}, nil
}

// Run times count transfers of payload, each acknowledged before the next.
func (b *BaselineClient) Run(ctx context.Context, payload []byte, count int) (BenchResult, error) {
	stop := context.AfterFunc(ctx, func() { b.c.Close() })
	defer stop()
	var hdr [8]byte
	binary.LittleEndian.PutUint64(hdr[:], uint64(len(payload)))
	start := time.Now()
	for range count {
		if _, err := b.c.Write(hdr[:]); err != nil {
			return BenchResult{}, err
		}
		if _, err := b.c.Write(payload); err != nil {
			return BenchResult{}, err
		}
		if _, err := io.ReadFull(b.c, hdr[:1]); err != nil {
			return BenchResult{}, err
		}
	}
	return BenchResult{Bytes: int64(len(payload)) * int64(count), Elapsed: time.Since(start)}, nil
}

// Close closes the connection.
func (b *BaselineClient) Close() error { return b.c.Close() }

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
