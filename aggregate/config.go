package aggregate

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/starling-ml/starling/aggregate/rule"
	"github.com/starling-ml/starling/compression"
)

// Algorithm is an all-reduce algorithm.
type Algorithm uint8

const (
	// Auto picks Tree for linear rules on vectors of at most
	// Config.TreeMaxBytes (scaled up for groups of more than 4 peers),
	// Ring for longer ones (Butterfly when compressed), and Butterfly for
	// the robust rules.
	Auto Algorithm = iota
	// Tree reduces up a binary tree and broadcasts down it: 2·⌈log₂ n⌉
	// hops, each peer sending at most three copies of the vector. Linear
	// rules only.
	Tree
	// Butterfly is a direct reduce-scatter then all-gather: peer i owns
	// shard i, every peer sends each shard to its owner, and each owner
	// sends its reduced shard to every peer. Two hops; each peer sends and
	// receives 2(n−1)/n of the vector. Every rule runs on it; owners apply
	// robust rules to the n contributions of their shard.
	Butterfly
	// Ring is a pipelined reduce-scatter then all-gather around the ring
	// of ranks: 2(n−1) hops, each peer sending 2(n−1)/n of the vector,
	// all of it to one neighbour, and receiving as much from the other.
	// Linear rules only.
	Ring
)

func (a Algorithm) String() string {
	switch a {
	case Auto:
		return "auto"
	case Tree:
		return "tree"
	case Butterfly:
		return "butterfly"
	case Ring:
		return "ring"
	}
	return fmt.Sprintf("algorithm(%d)", uint8(a))
}

// ParseAlgorithm parses "auto", "tree", "butterfly" or "ring" (a --algo
// flag).
func ParseAlgorithm(s string) (Algorithm, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "auto", "":
		return Auto, nil
	case "tree":
		return Tree, nil
	case "butterfly":
		return Butterfly, nil
	case "ring":
		return Ring, nil
	}
	return Auto, fmt.Errorf("%w: unknown algorithm %q (want auto, tree, butterfly or ring)", ErrInvalidConfig, s)
}

// Config holds the knobs of a Runner. Every member of a round must use the
// same Model, Rule, Algorithm, TreeMaxBytes and ChunkElems (peers that do
// not are excluded with ErrConfigMismatch).
type Config struct {
	// Model is the id of the model whose vectors the rounds reduce (an
	// architecture digest, workload.Workload.ID): peers of another model
	// are excluded from a round with ErrConfigMismatch instead of having
	// their vectors averaged in. Default "" (every peer trains one model).
	Model string

	// Rule is the aggregation rule. Default Mean{} (FedAvg's weighted
	// mean, weights = sample counts).
	Rule rule.Rule

	// Algorithm picks the all-reduce. Default Auto.
	Algorithm Algorithm

	// TreeMaxBytes is the largest vector (4 bytes per value) for which Auto
	// picks the tree in a group of up to 4 peers; larger groups scale it
	// by (n−1)/3, as the ring's hops grow (see treeMax). Default 64 KiB:
	// up to about one short chunk the cost is per-hop latency, above it
	// the 2(n−1)/n traffic of the ring and the butterfly wins.
	TreeMaxBytes int

	// ChunkElems is the largest number of float32 values per chunk, the
	// unit of pipelining. Default 262144 (1 MiB): over libp2p streams each
	// chunk costs a frame, a Recv and a few TLS records beyond its bytes,
	// and 64 KiB chunks took twice the CPU of 1 MiB ones for a 64 MB
	// all-reduce of 4 peers on loopback (peer bench allreduce --chunk-kb).
	// Smaller vectors use shorter chunks (down to 64 KiB) so that each
	// shard still flows in 8 of them.
	ChunkElems int

	// StallTimeout is how long the driver waits for a peer to make progress
	// before blaming it; waits that depend on other peers' progress get a
	// small multiple of it. Members must enter a round within StallTimeout
	// of each other. Default 10 s: long enough for a GC pause or a slow
	// link's chunk, short enough to notice a dead peer in a training step.
	StallTimeout time.Duration

	// MaxAttempts bounds how many times a round is run (the first run
	// plus re-runs after failures). Default 4.
	MaxAttempts int

	// Quorum is the fraction of a round's original group that must remain
	// (strictly more) for the survivors to complete it. Default 0.5, a
	// majority, so at most one side of a network partition completes a
	// round; 0 lets any survivors continue.
	Quorum float64

	// Compress is the codec contributions travel in ("fp16", "int8:256",
	// "topk:0.01,ef", "powersgd:4,ef"), or the zero Spec for plain float32
	// chunks. With a codec the round runs the compressed data phase (see
	// compressed.go and Runner.Compression); sum and mean only. Default:
	// the zero Spec.
	Compress compression.Spec
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{
		Rule:         rule.Mean{},
		Algorithm:    Auto,
		TreeMaxBytes: 64 << 10,
		ChunkElems:   256 << 10,
		StallTimeout: 10 * time.Second,
		MaxAttempts:  4,
		Quorum:       0.5,
	}
}

// Validate reports the first problem with c, wrapping ErrInvalidConfig. It
// does not change c.
func (c Config) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, a...))
	}
	switch {
	case c.Rule == nil:
		return bad("Rule is nil")
	case c.Algorithm > Ring:
		return bad("unknown Algorithm %d", c.Algorithm)
	case (c.Algorithm == Tree || c.Algorithm == Ring) && !c.Rule.Linear():
		return fmt.Errorf("%w: %w: the %s runs sum and mean, not %s", ErrInvalidConfig, ErrUnsupported, c.Algorithm, c.Rule)
	case c.Algorithm == Ring && !c.Compress.IsZero():
		return fmt.Errorf("%w: %w: the ring runs uncompressed (compressed rounds run on the tree or the butterfly)", ErrInvalidConfig, ErrUnsupported)
	case c.TreeMaxBytes < 0:
		return bad("TreeMaxBytes %d < 0", c.TreeMaxBytes)
	case c.ChunkElems < 1 || c.ChunkElems > 1<<26:
		return bad("ChunkElems %d not in [1, 2^26]", c.ChunkElems)
	case c.StallTimeout <= 0:
		return bad("StallTimeout %v ≤ 0", c.StallTimeout)
	case c.MaxAttempts < 1 || c.MaxAttempts > math.MaxUint8:
		return bad("MaxAttempts %d not in [1, 255]", c.MaxAttempts)
	case !(c.Quorum >= 0 && c.Quorum < 1):
		return bad("Quorum %v not in [0, 1)", c.Quorum)
	}
	if !c.Compress.IsZero() {
		if !c.Rule.Linear() {
			return fmt.Errorf("%w: %w: compressed all-reduce runs sum and mean, not %s", ErrInvalidConfig, ErrUnsupported, c.Rule)
		}
	}
	if v, ok := c.Rule.(interface{ Validate() error }); ok {
		if err := v.Validate(); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
	}
	return nil
}

// minChunkElems and pipelineDepth shape the chunks of a round that is too
// small for ChunkElems to pipeline: each span (a butterfly shard, the
// tree's whole vector) flows in at least pipelineDepth chunks, but chunks
// stay at least minChunkElems (64 KiB) long.
const (
	minChunkElems = 16 << 10
	pipelineDepth = 8
)

// chunkElems returns the chunk length a round of d values over n members
// runs with: ChunkElems, or less for a vector too small to pipeline in
// chunks of that length. It depends only on settings every member shares.
func (c Config) chunkElems(d, n int, algo Algorithm) int {
	span := d
	if algo == Butterfly || algo == Ring {
		span = (d + n - 1) / max(n, 1)
	}
	return min(c.ChunkElems, max(minChunkElems, (span+pipelineDepth-1)/pipelineDepth))
}

// treeMax is the largest vector, in bytes, for which Auto picks the tree
// in a group of n: TreeMaxBytes up to 4 peers, and (n−1)/3 times that
// beyond. The ring's 2(n−1) hops grow linearly with n where the tree's
// 2⌈log₂ n⌉ barely do, while the ring's advantage in bytes (2(n−1)/n of
// the vector sent per peer against up to 3 for a tree's inner node) stays
// about the same, so the size where the ring's bandwidth pays for its
// latency grows about linearly. Measured on the netbed at 1 Gbit/s (ring
// against tree, docs/results): the two are even at about 200 KB with 4
// peers and 500 KB with 8, 2.5 times as far; (n−1)/3 gives 2.3.
func (c Config) treeMax(n int) int {
	if n <= 4 {
		return c.TreeMaxBytes
	}
	return int(min(float64(c.TreeMaxBytes)*float64(n-1)/3, math.MaxInt32))
}

// resolve returns the algorithm a round of d values among n peers runs.
func (c Config) resolve(d, n int) Algorithm {
	if c.Algorithm != Auto {
		return c.Algorithm
	}
	switch {
	case !c.Rule.Linear():
		return Butterfly
	case 4*d <= c.treeMax(n):
		return Tree
	case !c.Compress.IsZero():
		return Butterfly
	}
	return Ring
}
