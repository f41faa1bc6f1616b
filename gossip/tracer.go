package gossip

import (
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
)

// dropTracer counts the drops GossipSub makes before our validators run:
// unsigned messages and bad signatures (strict signing) and a full
// validation queue. Our own validators count their drops themselves.
// GossipSub calls it from its event loop: it must not block.
type dropTracer struct{ c *ControlPlane }

var _ pubsub.RawTracer = (*dropTracer)(nil)

func (t *dropTracer) RejectMessage(msg *pubsub.Message, reason string) {
	if topic := msg.GetTopic(); topic != t.c.hbName && topic != t.c.annName {
		return
	}
	switch reason {
	case pubsub.RejectMissingSignature:
		t.c.stats.drop(DropUnsigned)
	case pubsub.RejectInvalidSignature, pubsub.RejectUnexpectedSignature, pubsub.RejectUnexpectedAuthInfo:
		t.c.stats.drop(DropBadSignature)
	case pubsub.RejectValidationQueueFull, pubsub.RejectValidationThrottled:
		t.c.stats.drop(DropThrottled)
	}
}

func (*dropTracer) OnNewOutboundStream(peer.ID, protocol.ID)             {}
func (*dropTracer) OnClosedOutboundStream(peer.ID)                       {}
func (*dropTracer) Join(string)                                          {}
func (*dropTracer) Leave(string)                                         {}
func (*dropTracer) Graft(peer.ID, string)                                {}
func (*dropTracer) Prune(peer.ID, string)                                {}
func (*dropTracer) ValidateMessage(*pubsub.Message)                      {}
func (*dropTracer) DeliverMessage(*pubsub.Message)                       {}
func (*dropTracer) DuplicateMessage(*pubsub.Message)                     {}
func (*dropTracer) ThrottlePeer(peer.ID)                                 {}
func (*dropTracer) RecvRPC(*pubsub.RPC)                                  {}
func (*dropTracer) SendRPC(*pubsub.RPC, peer.ID)                         {}
func (*dropTracer) SendRPCCompleted(*pubsub.RPC, peer.ID, time.Duration) {}
func (*dropTracer) DropRPC(*pubsub.RPC, peer.ID)                         {}
func (*dropTracer) UndeliverableMessage(*pubsub.Message)                 {}
