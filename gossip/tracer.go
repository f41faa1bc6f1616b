package gossip

import (
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
)

// dropTracer counts the drops GossipSub makes outside our validators:
// unsigned messages and bad signatures (strict signing), a full validation
// queue, a full subscription buffer, and messages of ours it could not
// queue for a peer. Our own validators count their drops themselves.
// GossipSub calls it from its event loop: it must not block.
type dropTracer struct{ c *ControlPlane }

var _ pubsub.RawTracer = (*dropTracer)(nil)

func (t *dropTracer) RejectMessage(msg *pubsub.Message, reason string) {
	if !t.ours(msg.GetTopic()) {
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

// UndeliverableMessage is a delivered message that our subscription's
// buffer had no room for.
func (t *dropTracer) UndeliverableMessage(msg *pubsub.Message) {
	if t.ours(msg.GetTopic()) {
		t.c.stats.drop(DropUndelivered)
	}
}

// DropRPC is an RPC that a peer's outbound queue had no room for; each of
// its messages on our topics counts.
func (t *dropTracer) DropRPC(rpc *pubsub.RPC, _ peer.ID) {
	for _, m := range rpc.GetPublish() {
		if t.ours(m.GetTopic()) {
			t.c.stats.drop(DropSendQueue)
		}
	}
}

func (t *dropTracer) ours(topic string) bool { return topic == t.c.hbName || topic == t.c.annName }
