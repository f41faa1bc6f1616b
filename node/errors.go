package node

import "errors"

// Errors returned by this package. They are wrapped with context; match them
// with errors.Is.
//
// Frame errors (ErrFrameTooLarge … ErrShortBuffer) are what a receiver reports
// for a tensor frame it refused; each one resets the stream that carried the
// frame and is counted in starling_node_frames_rejected_total under the
// reason that Reason returns.
var (
	// ErrClosed is returned by calls on a Node after Close.
	ErrClosed = errors.New("node: closed")

	// ErrKeyPermissions means a key file (identity or swarm key) can be
	// read or written by its group or by others; chmod 600 it.
	ErrKeyPermissions = errors.New("node: key file is accessible by group or others")
	// ErrBadKey means a key file does not hold an Ed25519 libp2p private key.
	ErrBadKey = errors.New("node: bad identity key")
	// ErrBadPSK means a swarm key file is not in the swarm.key v1 format.
	ErrBadPSK = errors.New("node: bad swarm key")
	// ErrQUICWithPSK means a QUIC listen address was configured together
	// with a pre-shared swarm key: libp2p's private networks work over TCP
	// only (the PSK wraps the raw byte stream; QUIC has none).
	ErrQUICWithPSK = errors.New("node: QUIC cannot be used with a swarm key (PSK); use TCP")
	// ErrSecurityMismatch means the peer speaks none of our transport
	// security protocols: one side runs Insecure (plaintext) and the other
	// TLS/Noise. Retrying does not help.
	ErrSecurityMismatch = errors.New("node: the peer speaks none of our transport security protocols (Insecure, --insecure, must be the same on every peer)")
	// ErrSwarmKey means the connection failed in libp2p's handshake,
	// before any protocol was agreed, on bytes that made no sense (or it
	// stalled there): what peers with different swarm keys, or one with a
	// key and one without, see of each other. Retrying does not help.
	ErrSwarmKey = errors.New("node: the handshake failed before any protocol was agreed: most likely a wrong or missing swarm key (--psk must name the same swarm.key file on every peer, or be left out on all)")
	// ErrNotAllowed means a connection was refused by an allowlist: the
	// remote peer closed it right after the security handshake (its
	// --allow does not name this peer), or this peer's own --allow does
	// not name the remote one. Retrying does not help.
	ErrNotAllowed = errors.New("node: the connection was refused by an allowlist (--allow)")
	// ErrInvalidConfig wraps every Config.Validate failure.
	ErrInvalidConfig = errors.New("node: invalid config")

	// ErrLimitedConn means the only connection to the peer is limited
	// (relayed): relays may carry control traffic, never tensors.
	ErrLimitedConn = errors.New("node: tensors are not sent over limited (relayed) connections")
	// ErrDuplicateRecv means a Recv for the same (peer, tag) is already
	// waiting.
	ErrDuplicateRecv = errors.New("node: a Recv for this peer and tag is already waiting")
	// ErrReset means the peer (or we, after a local error) reset the stream
	// mid-transfer.
	ErrReset = errors.New("node: stream reset mid-transfer")
	// ErrTimeout means a read or write made no progress within its deadline.
	ErrTimeout = errors.New("node: i/o deadline exceeded")

	// ErrFrameTooLarge means a frame announced a payload (or a decoded
	// tensor) larger than the receiver's MaxTensorBytes. Nothing was
	// allocated for it.
	ErrFrameTooLarge = errors.New("node: frame larger than the limit")
	// ErrBadMagic means the bytes are not a Starling tensor frame.
	ErrBadMagic = errors.New("node: bad frame magic")
	// ErrBadVersion means the frame uses a wire version we do not speak.
	ErrBadVersion = errors.New("node: unsupported frame version")
	// ErrBadHeader means a header field is malformed: header checksum,
	// reserved bits, stripe numbering, or stripes of one tensor disagreeing.
	ErrBadHeader = errors.New("node: malformed frame header")
	// ErrUnknownCodec means the codec id is not compression.Known.
	ErrUnknownCodec = errors.New("node: unknown codec id")
	// ErrUnknownDType means the dtype byte names no DType.
	ErrUnknownDType = errors.New("node: unknown dtype")
	// ErrShapeMismatch means the shape and the payload length disagree (for
	// raw tensors) or the shape overflows.
	ErrShapeMismatch = errors.New("node: shape and payload length disagree")
	// ErrChecksum means a payload's CRC-32C did not match its trailer.
	ErrChecksum = errors.New("node: payload checksum mismatch")
	// ErrTruncated means the stream ended inside a frame.
	ErrTruncated = errors.New("node: truncated frame")
	// ErrShortBuffer means the buffer given to Recv is smaller than the
	// announced payload.
	ErrShortBuffer = errors.New("node: receive buffer too small")
	// ErrRefused means an admission hook (AddAdmit) refused a tensor; it
	// was drained unread.
	ErrRefused = errors.New("node: tensor refused by the admission hook")
)

// Reason returns the metrics label for a frame error ("too_large",
// "checksum", …), or "other".
func Reason(err error) string {
	for _, r := range reasons {
		if errors.Is(err, r.err) {
			return r.label
		}
	}
	return "other"
}

var reasons = []struct {
	err   error
	label string
}{
	{ErrFrameTooLarge, "too_large"},
	{ErrBadMagic, "bad_magic"},
	{ErrBadVersion, "bad_version"},
	{ErrBadHeader, "bad_header"},
	{ErrUnknownCodec, "unknown_codec"},
	{ErrUnknownDType, "unknown_dtype"},
	{ErrShapeMismatch, "shape_mismatch"},
	{ErrChecksum, "checksum"},
	{ErrTruncated, "truncated"},
	{ErrShortBuffer, "short_buffer"},
	{ErrRefused, "refused"},
	{ErrLimitedConn, "limited_conn"},
	{ErrTimeout, "timeout"},
	{ErrReset, "reset"},
	{ErrClosed, "closed"},
}
