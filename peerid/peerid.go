// Package peerid names peers. Every Starling package that speaks of a peer
// (the all-reduce, the strategies, the control plane's messages, the
// simulator) uses ID, so a list of peers passes from one to the other
// unchanged; only the libp2p edge (node, aggregate/p2p, gossip's
// networked half, swarm) converts to and from libp2p's peer.ID.
package peerid

import "slices"

// ID is a peer's identity: the text (base58) form of its libp2p peer ID,
// as `peer id` prints it. In-memory networks and tests use any non-empty
// string.
type ID string

// String returns the ID's text.
func (id ID) String() string { return string(id) }

// Sorted returns ids sorted, without duplicates, in a new slice.
func Sorted(ids []ID) []ID {
	out := slices.Clone(ids)
	slices.Sort(out)
	return slices.Compact(out)
}
