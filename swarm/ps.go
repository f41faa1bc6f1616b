package swarm

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/multiformats/go-multistream"

	"github.com/starling-ml/starling/internal/ctxtime"
	"github.com/starling-ml/starling/node"
	"github.com/starling-ml/starling/peerid"
	"github.com/starling-ml/starling/train"
)

// PSProtocol is the parameter-server mode's request/response protocol.
// One stream carries one request and its reply, each a frame: magic
// (u32), header length (u32), the header (JSON of train.PSRequest or
// train.PSReply, without the payload), payload length (u32), payload.
const PSProtocol = protocol.ID("/starling/ps/1.0.0")

// ErrBadPS reports a malformed parameter-server frame.
var ErrBadPS = errors.New("swarm: bad parameter-server frame")

const (
	psMagic     = 0x50535631 // "PSV1"
	psMaxHeader = 1 << 20    // a header: a replica's sequence numbers at most
)

// PSTransport is train.PSNet over libp2p streams on a node: Call opens a
// stream to the server, sends the request and reads the reply within
// ctx's deadline; requests to this peer go to the handler Serve
// installed, with ReplyTimeout to answer. Safe for concurrent use.
type PSTransport struct {
	n            *node.Node
	maxPayload   int
	replyTimeout time.Duration

	mu sync.RWMutex
	h  train.PSHandler
}

var _ train.PSNet = (*PSTransport)(nil)

// NewPSTransport starts the protocol on n: payloads of at most maxPayload
// bytes (a shard's parameters or encoded gradient) are accepted, and a
// request gets replyTimeout to be answered. Close it before n.
func NewPSTransport(n *node.Node, maxPayload int, replyTimeout time.Duration) *PSTransport {
	t := &PSTransport{n: n, maxPayload: maxPayload, replyTimeout: replyTimeout}
	n.Host().SetStreamHandler(PSProtocol, t.handle)
	return t
}

// Close stops serving the protocol.
func (t *PSTransport) Close() { t.n.Host().RemoveStreamHandler(PSProtocol) }

// Self implements train.PSNet.
func (t *PSTransport) Self() peerid.ID { return peerid.ID(t.n.ID().String()) }

// Serve implements train.PSNet.
func (t *PSTransport) Serve(h train.PSHandler) {
	t.mu.Lock()
	t.h = h
	t.mu.Unlock()
}

func (t *PSTransport) handle(st network.Stream) {
	defer st.Close()
	st.SetDeadline(time.Now().Add(t.replyTimeout))
	var req train.PSRequest
	r := bufio.NewReader(st)
	payload, err := readPSFrame(r, &req, t.maxPayload)
	if err != nil {
		st.Reset()
		return
	}
	req.Payload = payload
	t.mu.RLock()
	h := t.h
	t.mu.RUnlock()
	rep := &train.PSReply{Status: train.PSNotReady}
	if h != nil {
		ctx, cancel := context.WithTimeout(context.Background(), t.replyTimeout)
		rep = h(ctx, peerid.ID(st.Conn().RemotePeer().String()), &req)
		cancel()
	}
	w := bufio.NewWriter(st)
	if err := writePSFrame(w, rep, rep.Payload); err != nil || w.Flush() != nil {
		st.Reset()
	}
}

// Call implements train.PSNet.
func (t *PSTransport) Call(ctx context.Context, to peerid.ID, r *train.PSRequest) (*train.PSReply, error) {
	id, err := peer.Decode(string(to))
	if err != nil {
		return nil, fmt.Errorf("swarm: bad peer id %q: %w", to, err)
	}
	st, err := node.OpenStream(ctx, t.n.Host(), id, PSProtocol)
	if notServing(err) {
		return notServingReply(to), nil
	}
	if err != nil {
		return nil, err
	}
	defer resetOnDone(ctx, st)()
	if dl, ok := ctx.Deadline(); ok {
		st.SetDeadline(dl)
	}
	w := bufio.NewWriter(st)
	err = writePSFrame(w, r, r.Payload)
	if err == nil {
		err = w.Flush()
	}
	if err != nil {
		st.Reset()
		if notServing(err) {
			return notServingReply(to), nil
		}
		return nil, ctxOr(ctx, fmt.Errorf("swarm: ps request to %s: %w", to, err))
	}
	st.CloseWrite()
	var rep train.PSReply
	payload, err := readPSFrame(bufio.NewReader(st), &rep, t.maxPayload)
	if err != nil {
		st.Reset()
		if notServing(err) {
			return notServingReply(to), nil
		}
		return nil, ctxOr(ctx, fmt.Errorf("swarm: ps reply from %s: %w", to, err))
	}
	rep.Payload = payload
	st.Close()
	return &rep, nil
}

// notServing reports whether err is the peer's refusal of PSProtocol:
// its host is up but its run has not registered the protocol yet, or has
// ended. Stream negotiation is lazy, so the refusal can surface at the
// open, the first write or the first read.
func notServing(err error) bool {
	return err != nil && errors.As(err, new(multistream.ErrNotSupported[protocol.ID]))
}

// notServingReply is what Call returns for a peer that does not serve
// PSProtocol: the same PSNotReady as a peer whose run has not started
// serving, which a worker retries while the server may still be starting.
func notServingReply(to peerid.ID) *train.PSReply {
	return &train.PSReply{Status: train.PSNotReady, Detail: fmt.Sprintf("%s does not serve %s", to, PSProtocol)}
}

// ctxOr returns ctx's error once it has ended (the reason a stream
// failed), err otherwise.
func ctxOr(ctx context.Context, err error) error {
	if e := ctxtime.Ended(ctx); e != nil {
		return e
	}
	return err
}

func writePSFrame(w io.Writer, head any, payload []byte) error {
	hb, err := json.Marshal(head)
	if err != nil {
		return err
	}
	var b [8]byte
	binary.BigEndian.PutUint32(b[:], psMagic)
	binary.BigEndian.PutUint32(b[4:], uint32(len(hb)))
	if _, err := w.Write(b[:]); err != nil {
		return err
	}
	if _, err := w.Write(hb); err != nil {
		return err
	}
	binary.BigEndian.PutUint32(b[:4], uint32(len(payload)))
	if _, err := w.Write(b[:4]); err != nil {
		return err
	}
	_, err = w.Write(payload)
	return err
}

// readPSFrame reads a frame's header into head and returns its payload,
// refusing a header over psMaxHeader or a payload over maxPayload.
func readPSFrame(r io.Reader, head any, maxPayload int) ([]byte, error) {
	var b [8]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(b[4:])
	if binary.BigEndian.Uint32(b[:]) != psMagic || n > psMaxHeader {
		return nil, fmt.Errorf("%w: magic %08x, header of %d bytes", ErrBadPS, binary.BigEndian.Uint32(b[:]), n)
	}
	hb := make([]byte, n)
	if _, err := io.ReadFull(r, hb); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(hb, head); err != nil {
		return nil, fmt.Errorf("%w: header: %v", ErrBadPS, err)
	}
	if _, err := io.ReadFull(r, b[:4]); err != nil {
		return nil, err
	}
	m := binary.BigEndian.Uint32(b[:4])
	if uint64(m) > uint64(maxPayload) {
		return nil, fmt.Errorf("%w: payload of %d bytes, at most %d", ErrBadPS, m, maxPayload)
	}
	payload := make([]byte, m)
	if _, err := io.ReadFull(r, payload); err != nil {
		return nil, err
	}
	return payload, nil
}
