package serve

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Version is the protocol version the greeting announces.
const Version = 1

// MaxFrame bounds one control message (tensor bytes go through shared
// memory, so control frames are small).
const MaxFrame = 1 << 20

// Errors of the framing.
var (
	ErrFrameTooLarge = errors.New("serve: control frame too large")
	ErrBadFrame      = errors.New("serve: malformed control frame")
)

// Request is one client message; Op selects which fields count.
type Request struct {
	Op string `json:"op"`
	// join
	Args  []string `json:"args,omitempty"`
	Model string   `json:"model,omitempty"`
	// shm
	Path  string `json:"path,omitempty"`
	Bytes int64  `json:"bytes,omitempty"`
	// allreduce, publish, fetch: byte offsets into the shared memory and
	// a count of float32 values.
	Src    int64   `json:"src,omitempty"`
	Dst    int64   `json:"dst,omitempty"`
	Count  int64   `json:"count,omitempty"`
	Shapes [][]int `json:"shapes,omitempty"`
	Weight float64 `json:"weight,omitempty"`
	Rule   string  `json:"rule,omitempty"`
	Codec  string  `json:"codec,omitempty"`
	// publish, fetch, announce (Version, and Base ≤ Version the
	// version a delta was computed from; Kind model or delta; Loss)
	Version uint64  `json:"version,omitempty"`
	Base    uint64  `json:"base,omitempty"`
	Kind    string  `json:"kind,omitempty"`
	Loss    float64 `json:"loss,omitempty"`
	// Every blocking op: how long it may take (0: the op's default).
	TimeoutS float64 `json:"timeout_s,omitempty"`
}

// Response is the answer to one request (and the greeting). On failure OK
// is false, Error is one line naming the problem and Code classifies it.
type Response struct {
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
	Code  string `json:"code,omitempty"`
	// greeting
	Server  string `json:"server,omitempty"`
	Version int    `json:"version,omitempty"`
	PID     int    `json:"pid,omitempty"`
	// join, wait
	ID      string   `json:"id,omitempty"`
	Addrs   []string `json:"addrs,omitempty"`
	Members []string `json:"members,omitempty"`
	// allreduce
	Round     uint64   `json:"round,omitempty"`
	Group     []string `json:"group,omitempty"`
	Excluded  []string `json:"excluded,omitempty"`
	Algorithm string   `json:"algorithm,omitempty"`
	Attempts  int      `json:"attempts,omitempty"`
	Total     float64  `json:"weight,omitempty"`
	// fetch: the state's version; next: the announced vector's version,
	// with ID its peer, Round its base, Total its samples and Kind.
	StateVersion uint64 `json:"state_version,omitempty"`
	Kind         string `json:"kind,omitempty"`
	// metrics
	Metrics map[string]any `json:"metrics,omitempty"`
}

// Error codes of Response.Code.
const (
	CodeBusy     = "busy"     // another client holds the session
	CodeUsage    = "usage"    // bad request: unknown op, bad flag, bad offsets
	CodeState    = "state"    // the op does not fit the session's state (all-reduce before join, …)
	CodeMismatch = "mismatch" // this peer's tensors differ in shape or length from the others'
	CodeExcluded = "excluded" // the others left this peer out of the round
	CodeTimeout  = "timeout"  // the op's deadline passed
	CodeFailed   = "failed"   // the round failed (too few peers, …)
	CodeGone     = "gone"     // next: the announced vector could not be pulled (its peer left?)
)

// WriteFrame writes v as one frame.
func WriteFrame(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(b) > MaxFrame {
		return fmt.Errorf("%w: %d bytes", ErrFrameTooLarge, len(b))
	}
	buf := make([]byte, 4+len(b))
	binary.BigEndian.PutUint32(buf, uint32(len(b)))
	copy(buf[4:], b)
	_, err = w.Write(buf)
	return err
}

// ReadFrame reads one frame into v.
func ReadFrame(r io.Reader, v any) error {
	var h [4]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return err
	}
	n := binary.BigEndian.Uint32(h[:])
	if n > MaxFrame {
		return fmt.Errorf("%w: %d bytes", ErrFrameTooLarge, n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return fmt.Errorf("%w: %w", ErrBadFrame, err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%w: %w", ErrBadFrame, err)
	}
	return nil
}
