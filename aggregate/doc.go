// Package aggregate is Starling's all-reduce: who takes part in a round,
// how their vectors are combined (sum, weighted mean, and rules robust to
// peers that lie), how the combining runs over the network (tree, ring or
// butterfly, chunked and pipelined), and what happens when a peer dies,
// stalls or sends garbage mid-round. It never hangs: every wait on a peer
// has a deadline, and a round ends in a complete result or a typed error.
//
// # Rules
//
// Config.Rule is a reducer of package aggregate/rule (mean, sum, median,
// trimmed mean, Krum, centered clipping); the butterfly runs every rule
// sharded, the tree and the ring the linear ones (sum, mean).
//
// # Groups (pure)
//
// Form(round, members) orders a membership set by a hash of (round, peer),
// so every peer derives the same ranks and the tree root and shard owners
// rotate between rounds; Group.Digest hashes (round, attempt, members) and
// travels in every chunk's Tag, so peers that formed different groups find
// out at their first chunk (MismatchError) instead of mixing data.
//
// # Transport
//
// Transport is the seam to the network: Send a tagged []float32 chunk to a
// peer, Recv the chunk with a given tag from a given peer into a caller
// buffer, both with a ctx. Mailbox is a ready-made receiving half (and a
// Scoper, which refuses chunks from peers outside the round's group). The
// aggtest package is an in-memory network with latency, bandwidth and
// failure injection; aggregate/p2p runs the same Transport over node/'s
// libp2p tensor streams.
//
// # The driver
//
// A Runner is one peer's driver; it owns a round's goroutines and none
// between rounds.
//
//	r, _ := aggregate.NewRunner(self, transport, aggregate.DefaultConfig())
//	for round := uint64(1); ; round++ {
//		g, _ := aggregate.Form(round, members)        // same on every peer
//		res, err := r.AllReduce(ctx, g, avg, grad, float64(samples))
//		// err == nil: avg is the rule over res.Group's contributions, the
//		// same bits on every member that succeeded.
//	}
//
// A round runs in attempts. Each attempt has a data phase (tree, ring or
// butterfly) and a vote: every member sends every other member its verdict
// (OK: "I hold the whole result"; or FAIL and whom it blames: a peer that
// sent nothing within the stall timeout, a wrong length, NaN/Inf, another
// group digest or other settings). A FAIL vote also stops the data phase of
// whoever receives it, so a failure spreads in one hop. If all votes are OK
// the members commit; otherwise every member derives the same next group
// from the same votes (silent members, members blamed with a hard fault, or
// blamed for a timeout while blaming no one themselves) and runs the round
// again without them. A member outside the majority view, or blamed itself,
// returns ErrExcluded with a *PeerError naming it. Rounds end with
// ErrTooFewPeers when Config.Quorum would be broken (so at most one side of
// a partition goes on), ErrRoundFailed after Config.MaxAttempts, or the
// group-wide ErrOverflow / ErrZeroWeight that a re-run would not change.
//
// Timing. A wait on a peer ends when nothing at all has been heard from
// that peer for a multiple of StallTimeout (a watchdog per lane, so a slow
// but progressing transfer is never cut). The multiple grows with what the
// wait depends on: a butterfly owner waits one StallTimeout for a
// contribution (which depends on nobody), a peer waits two for an owner's
// reduced shard; in the tree a node waits 1+h for a child of height h and
// H+depth for its parent's broadcast; in the ring a member waits one for
// its left neighbour's own segment and two for the rest, which depends on
// the whole ring (a member sends on only what it received, so its right
// neighbour last heard of it after it last heard of its left one). So the
// member closest to a failure times out first and its FAIL vote reaches
// the others before their own, less informed, timeouts fire. Timers that
// fire late are allowed for: a wait that is overdue when the data phase
// stops counts as timed out, and a ring member then waiting for input says
// so in its vote (starved), which keeps a timeout on it from excluding it.
// A wait of more than one StallTimeout cannot tell a silent member from a
// starved one, but a probe can: with a transport that implements Prober
// (p2p sends a libp2p ping, which a live peer's host answers whatever it
// waits for), a member silent for half a StallTimeout is probed, and one
// that then neither answers nor sends anything for a whole StallTimeout is
// blamed as stalled, a hard blame that spares the others the wait for its
// vote. A frozen process (SIGSTOP) or one cut off by a partition is so out
// of the round after 1.5 StallTimeouts instead of four (a dependent wait
// of two, then two for its vote). A probe that overlapped a send of ours
// to that member proves nothing (it may have queued behind our data on a
// slow link) and the wait goes on as without probes.
// A transport that sees a peer's connections close (p2p does, after a
// short grace; a killed process) fails the waits on it with
// ErrDisconnected: its vote is not awaited, and the round goes on without
// it within moments instead of stall timeouts. Votes are awaited for (maxMult+1)
// StallTimeouts while the attempt may have succeeded, and for two once any
// vote says FAIL (everyone has then been told and stops at once). Members
// must enter a round within one StallTimeout of each other; a re-run allows
// three.
//
// What this does not guarantee: agreement under arbitrary network
// partitions. A member whose FAIL vote reaches some members only after
// their vote window closed (a vote delayed longer than (maxMult+1)
// StallTimeouts) can leave those members committed on the full group while
// the rest re-run without the lost member. Each Result names its Group, so
// callers can compare digests; members that re-run in a different group
// than others fail with ErrGroupMismatch rather than mix data. A peer that
// is merely slow (a stop-the-world pause longer than StallTimeout, a
// starved CPU) is treated like a dead one and left out of the round.
//
// # Compression
//
// Config.Compress names a codec of package compression ("fp16", "int8",
// "topk:0.01,ef", "powersgd:4,ef", …); sum and mean only. Contributions then
// travel encoded over the same tree or butterfly, with the same watchdogs,
// blame and votes: a codec hook encodes each peer's w·x plus its
// error-feedback residual, each reducing hop decodes, sums and re-encodes
// (blaming the sender of bytes that do not decode), and every peer decodes
// the owner's (root's) bytes, so all end with the same bits. The residual
// and PowerSGD's warm start change only when a round commits;
// Runner.Compression saves and loads them for checkpoints. The wire
// format, the rule per codec at a reducing hop and the bytes each codec
// saves are in docs/design.md ("All-reduce").
//
// # Algorithms
//
// Butterfly (reduce-scatter then all-gather, direct): rank i owns shard i;
// every peer sends each shard to its owner, the owner reduces the n
// contributions chunk by chunk as they arrive (robust rules included) and
// sends each reduced chunk to every peer. Each peer sends and receives
// 2(n−1)/n of the vector, for any n ≥ 1. Tree (binary heap over ranks):
// partial weighted sums flow up chunk by chunk and the root's result flows
// down, 2·⌈log₂ n⌉ hops; sum and mean only. Ring (reduce-scatter then
// all-gather around the ranks): each peer sends partial sums of one segment
// after another to its right neighbour, chunk by chunk, adding its own
// contribution to what its left neighbour sent; after n−1 steps each holds
// one finished segment, and n−1 more steps pass the finished segments
// around. The same 2(n−1)/n of the vector per peer as the butterfly, but
// on one stream in and one out instead of 2(n−1) concurrent ones, which
// costs less CPU per byte and keeps a rate-limited link evenly busy (with
// 8 peers on 1 Gbit/s links it moved 26 % more than the butterfly;
// docs/results); sum and mean only, uncompressed. Auto uses the tree for
// linear rules on vectors up to Config.TreeMaxBytes (times (n−1)/3 for
// groups of n > 4, as the ring's 2(n−1) hops add up), the ring for longer
// ones (the butterfly when compressed), and the butterfly for robust rules.
package aggregate
