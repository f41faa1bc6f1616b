package swarm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/starling-ml/starling/compression"
	"github.com/starling-ml/starling/node"
	"github.com/starling-ml/starling/peerid"
	"github.com/starling-ml/starling/train"
)

// ErrPipeFrame reports a pipeline message from a neighbour whose bytes do
// not decode.
var ErrPipeFrame = errors.New("swarm: bad pipeline message")

// pipeTagPrefix marks the pipeline's node tags ("pP"), apart from
// gossip's ("gX") and the all-reduce's (round mod 2^16 in the top bits;
// a pipeline peer runs no all-reduce on the same node).
const pipeTagPrefix node.Tag = 0x7050 << 48

// pipeHeader is the bytes before a message's values: N, Total, len(Y)
// and MB as little-endian uint32.
const pipeHeader = 16

// pipeTag is prefix (16 bits) | kind (4) | mb (12) | step (32); the
// header's MB and the tensor's step catch the wrap-arounds.
func pipeTag(kind train.PipeKind, step uint64, mb int) node.Tag {
	return pipeTagPrefix | node.Tag(kind&0xf)<<44 | node.Tag(mb&0xfff)<<32 | node.Tag(step&0xffffffff)
}

// PipeLink is a train.PipeLink over a node's tensor streams: activations
// go to Next, gradients to Prev (either empty at the pipeline's ends).
// One message is one tensor of raw little-endian words: a 16-byte header
// (samples, the step's samples, targets, micro-batch), the values, the
// targets. Safe
// for concurrent use.
type PipeLink struct {
	n          *node.Node
	prev, next peer.ID
}

var _ train.PipeLink = (*PipeLink)(nil)

// NewPipeLink returns the link of a stage whose neighbours are prev and
// next ("" at the ends). It fails on an ID that does not parse.
func NewPipeLink(n *node.Node, prev, next peerid.ID) (*PipeLink, error) {
	l := &PipeLink{n: n}
	for _, p := range []struct {
		id  peerid.ID
		dst *peer.ID
	}{{prev, &l.prev}, {next, &l.next}} {
		if p.id == "" {
			continue
		}
		id, err := peer.Decode(string(p.id))
		if err != nil {
			return nil, fmt.Errorf("swarm: pipeline neighbour %q: %w", p.id, err)
		}
		*p.dst = id
	}
	return l, nil
}

// Send implements train.PipeLink.
func (l *PipeLink) Send(ctx context.Context, m *train.PipeMsg) error {
	to := l.next
	if m.Kind.Backward() {
		to = l.prev
	}
	if to == "" {
		return fmt.Errorf("swarm: pipeline: no stage to send a %v to", m.Kind)
	}
	words := pipeHeader/4 + len(m.Data) + len(m.Y)
	b := make([]byte, 4*words)
	binary.LittleEndian.PutUint32(b[0:], uint32(m.N))
	binary.LittleEndian.PutUint32(b[4:], uint32(m.Total))
	binary.LittleEndian.PutUint32(b[8:], uint32(len(m.Y)))
	binary.LittleEndian.PutUint32(b[12:], uint32(m.MB))
	o := pipeHeader
	for _, v := range m.Data {
		binary.LittleEndian.PutUint32(b[o:], math.Float32bits(v))
		o += 4
	}
	for _, v := range m.Y {
		binary.LittleEndian.PutUint32(b[o:], uint32(v))
		o += 4
	}
	return l.n.Send(ctx, to, node.Tensor{
		Tag: pipeTag(m.Kind, m.Step, m.MB), Codec: compression.IDFP32, DType: node.Float32,
		Shape: []int{words}, Step: m.Step, Payload: b,
	})
}

// Recv implements train.PipeLink.
func (l *PipeLink) Recv(ctx context.Context, kind train.PipeKind, step uint64, mb int) (*train.PipeMsg, error) {
	from := l.prev
	if kind.Backward() {
		from = l.next
	}
	if from == "" {
		return nil, fmt.Errorf("swarm: pipeline: no stage to receive a %v from", kind)
	}
	t, err := l.n.Recv(ctx, from, pipeTag(kind, step, mb), nil)
	if err != nil {
		return nil, err
	}
	b := t.Payload
	if len(b) < pipeHeader || len(b)%4 != 0 || t.Step != step {
		return nil, fmt.Errorf("%w: %d bytes for step %d (want a whole header, words, step %d)", ErrPipeFrame, len(b), t.Step, step)
	}
	m := &train.PipeMsg{Kind: kind, Step: step, MB: mb,
		N: int(binary.LittleEndian.Uint32(b[0:])), Total: int(binary.LittleEndian.Uint32(b[4:]))}
	ny := int(binary.LittleEndian.Uint32(b[8:]))
	if got := int(binary.LittleEndian.Uint32(b[12:])); got != mb {
		return nil, fmt.Errorf("%w: micro-batch %d where %d was asked for", ErrPipeFrame, got, mb)
	}
	words := (len(b) - pipeHeader) / 4
	if ny > words {
		return nil, fmt.Errorf("%w: %d targets in %d words", ErrPipeFrame, ny, words)
	}
	m.Data = make([]float32, words-ny)
	o := pipeHeader
	for i := range m.Data {
		m.Data[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[o:]))
		o += 4
	}
	if ny > 0 {
		m.Y = make([]int32, ny)
		for i := range m.Y {
			m.Y[i] = int32(binary.LittleEndian.Uint32(b[o:]))
			o += 4
		}
	}
	return m, nil
}

// pipeHelloTag carries a peer's stage and step (PipeAssign).
const pipeHelloTag = pipeTagPrefix | 0xf<<44

// PipePlace is a peer's place in a pipeline, as PipeAssign found it.
type PipePlace struct {
	// Stage is the peer's stage and Pipeline which of the pipelines it
	// is in.
	Stage, Pipeline int
	Prev, Next      peerid.ID // "" at the ends
	// Replicas are the peers of this stage in every pipeline, sorted (this
	// one among them): those whose gradients this one's is averaged with.
	Replicas []peerid.ID
	// Steps holds every peer's step as it declared it (its checkpoint's
	// when resuming); the pipelines must start with all at one step.
	Steps []uint64
}

// MinStep returns the least of the peers' steps.
func (p PipePlace) MinStep() uint64 { return slices.Min(p.Steps) }

// PipeAssign places this peer, at step, in one of pipelines pipelines of
// k stages over members (this peer among them, pipelines·k in all): with
// stage < 0, the peer of rank r among the sorted IDs is stage r mod k;
// else it is stage. Each member sends every other a hello with its stage
// and step over a tensor stream, so every peer learns everyone's stage
// and step; the peers of one stage are numbered into pipelines by their
// IDs, and a stage held by more or fewer than pipelines peers is an error
// on every peer. ctx bounds the exchange.
func PipeAssign(ctx context.Context, n *node.Node, self peerid.ID, members []peerid.ID, k, pipelines, stage int, step uint64) (PipePlace, error) {
	ms := slices.Compact(peerid.Sorted(slices.Clone(members)))
	if k < 1 || pipelines < 1 {
		return PipePlace{}, fmt.Errorf("swarm: %d pipelines of %d stages", pipelines, k)
	}
	if len(ms) != k*pipelines || !slices.Contains(ms, self) {
		return PipePlace{}, fmt.Errorf("swarm: %d pipelines of %d stages need %d peers, this one among them; the swarm has %d", pipelines, k, k*pipelines, len(ms))
	}
	if stage < 0 {
		stage = slices.Index(ms, self) % k
	}
	if stage >= k {
		return PipePlace{}, fmt.Errorf("swarm: stage %d of a %d-stage pipeline", stage, k)
	}
	others := make([]peer.ID, 0, len(ms)-1)
	for _, m := range ms {
		if m == self {
			continue
		}
		id, err := peer.Decode(string(m))
		if err != nil {
			return PipePlace{}, fmt.Errorf("swarm: member %q: %w", m, err)
		}
		others = append(others, id)
	}
	hello := binary.LittleEndian.AppendUint32(nil, uint32(stage))
	hello = binary.LittleEndian.AppendUint32(hello, uint32(step))
	hello = binary.LittleEndian.AppendUint32(hello, uint32(step>>32))
	errc := make(chan error, len(others))
	for _, p := range others {
		go func() {
			errc <- n.Send(ctx, p, node.Tensor{Tag: pipeHelloTag, Codec: compression.IDFP32, DType: node.Int32, Shape: []int{3}, Payload: hello})
		}()
	}
	byStage := make([][]peerid.ID, k)
	byStage[stage] = []peerid.ID{self}
	place := PipePlace{Stage: stage, Steps: []uint64{step}}
	var err error
	for _, p := range others {
		t, rerr := n.Recv(ctx, p, pipeHelloTag, nil)
		if rerr != nil {
			err = errors.Join(err, fmt.Errorf("swarm: pipeline: no hello from %s: %w", p, rerr))
			continue
		}
		if len(t.Payload) != 12 {
			err = errors.Join(err, fmt.Errorf("%w: hello of %d bytes from %s", ErrPipeFrame, len(t.Payload), p))
			continue
		}
		s := int(binary.LittleEndian.Uint32(t.Payload))
		if s >= k || len(byStage[s]) == pipelines {
			err = errors.Join(err, fmt.Errorf("swarm: pipeline: %s declares stage %d, which is out of range or taken by %v", p, s, byStage[min(s, k-1)]))
			continue
		}
		byStage[s] = append(byStage[s], peerid.ID(p.String()))
		place.Steps = append(place.Steps, uint64(binary.LittleEndian.Uint32(t.Payload[4:]))|uint64(binary.LittleEndian.Uint32(t.Payload[8:]))<<32)
	}
	for range others {
		err = errors.Join(err, <-errc)
	}
	if err != nil {
		return PipePlace{}, err
	}
	for s := range byStage {
		if len(byStage[s]) != pipelines {
			return PipePlace{}, fmt.Errorf("swarm: pipeline: stage %d is held by %d peers, want %d", s, len(byStage[s]), pipelines)
		}
		byStage[s] = peerid.Sorted(byStage[s])
	}
	place.Replicas = byStage[stage]
	place.Pipeline = slices.Index(place.Replicas, self)
	if stage > 0 {
		place.Prev = byStage[stage-1][place.Pipeline]
	}
	if stage < k-1 {
		place.Next = byStage[stage+1][place.Pipeline]
	}
	return place, nil
}
