package peerrun

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	lswarm "github.com/libp2p/go-libp2p/p2p/net/swarm"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/starling-ml/starling/swarm"
)

// Redialling of --connect addresses (libp2p's dial backoff aside): the
// first retry after redialFirst, doubling up to redialMax; a connected
// peer is checked every checkEvery and redialled when its connection is
// gone. attemptTimeout bounds one dial, so that a peer stuck in the
// handshake (stopped, or with another swarm key) does not hold the
// dialler.
const (
	redialFirst    = 250 * time.Millisecond
	redialMax      = 10 * time.Second
	checkEvery     = time.Second
	attemptTimeout = 10 * time.Second
)

// redialDelay is how long to wait before the next dial of an address that
// failed failures times in a row (failures ≥ 1): redialFirst doubled per
// further failure, at most redialMax.
func redialDelay(failures int) time.Duration {
	d := redialFirst
	for i := 1; i < failures && d < redialMax; i++ {
		d *= 2
	}
	return min(d, redialMax)
}

// parseConnect parses a --connect address: a multiaddr with /p2p/ID.
func parseConnect(addr string) (peer.AddrInfo, error) {
	m, err := ma.NewMultiaddr(addr)
	if err != nil {
		return peer.AddrInfo{}, fmt.Errorf("%w: --connect %s: %v", ErrUsage, addr, err)
	}
	ai, err := peer.AddrInfoFromP2pAddr(m)
	if err != nil {
		return peer.AddrInfo{}, fmt.Errorf("%w: --connect %s: want a multiaddr ending in /p2p/ID: %v", ErrUsage, addr, err)
	}
	return *ai, nil
}

// dialler keeps the --connect addresses dialled in the background until
// Stop: each one is dialled at once, redialled with backoff (redialDelay)
// while it fails and again whenever its connection is lost. A failure is
// logged at warn level when its cause changes. Safe for concurrent use.
type dialler struct {
	wg     sync.WaitGroup
	first  sync.WaitGroup // done once every address was dialled once
	cancel context.CancelFunc

	mu   sync.Mutex
	last map[string]error // the latest failure per address; nil once connected
}

// dialAll starts dialling addrs (parsed with parseConnect) from p.
func dialAll(ctx context.Context, p *swarm.Peer, addrs []string, log *slog.Logger) (*dialler, error) {
	ais := make([]peer.AddrInfo, len(addrs))
	for i, a := range addrs {
		var err error
		if ais[i], err = parseConnect(a); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	d := &dialler{cancel: cancel, last: map[string]error{}}
	d.first.Add(len(ais))
	for i, ai := range ais {
		d.wg.Go(func() { d.keep(ctx, p, addrs[i], ai, log) })
	}
	return d, nil
}

// keep dials one address until ctx ends.
func (d *dialler) keep(ctx context.Context, p *swarm.Peer, addr string, ai peer.AddrInfo, log *slog.Logger) {
	nw := p.Node.Host().Network()
	failures := 0
	var logged string
	firstDone := sync.OnceFunc(d.first.Done)
	defer firstDone()
	for ctx.Err() == nil {
		wait := checkEvery
		if nw.Connectedness(ai.ID) != network.Connected {
			// The dial skips libp2p's own dial backoff (5 s after a failure,
			// then 5 s + tries² s): redialDelay is this address's backoff,
			// and libp2p's would hold a peer that is back, after a partition
			// of a minute, for another half minute.
			actx, cancel := context.WithTimeout(network.WithForceDirectDial(ctx, "--connect redial"), attemptTimeout)
			err := p.Node.Connect(actx, ai)
			cancel()
			if ctx.Err() != nil {
				return
			}
			d.mu.Lock()
			// Once a dial failed, libp2p refuses the next ones for a while
			// with "dial backoff" alone: keep the cause instead.
			if !errors.Is(err, lswarm.ErrDialBackoff) || d.last[addr] == nil {
				d.last[addr] = err
			}
			err = d.last[addr]
			d.mu.Unlock()
			if err == nil {
				failures, logged = 0, ""
			} else {
				failures++
				wait = redialDelay(failures)
				if msg := firstLine(err); msg != logged {
					logged = msg
					log.Warn("cannot reach a --connect address; redialling in the background", "addr", addr, "err", msg)
				}
			}
		}
		firstDone()
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
}

// WaitFirst waits until every address was dialled once (each dial takes
// at most attemptTimeout), so that a run starts connected to the
// --connect peers that are up, as it did when it dialled them in turn.
func (d *dialler) WaitFirst() { d.first.Wait() }

// Failures returns, for the addresses whose latest dial failed, a line
// each: "ADDR: error".
func (d *dialler) Failures() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for a, err := range d.last {
		if err != nil {
			out = append(out, fmt.Sprintf("%s: %s", a, firstLine(err)))
		}
	}
	return out
}

// Stop ends the dialling and waits for it.
func (d *dialler) Stop() {
	d.cancel()
	d.wg.Wait()
}

// firstLine is err in one line: libp2p's dial errors list every address
// tried on lines of their own, which are joined with "; ".
func firstLine(err error) string {
	lines := strings.Split(err.Error(), "\n")
	for i, l := range lines {
		lines[i] = strings.TrimPrefix(strings.TrimSpace(l), "* ")
	}
	return strings.Join(lines, "; ")
}
