package node

import (
	"log/slog"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// refusalLogEvery is how often at most one warning is logged per peer and
// reason for refused connections and rejected frames: enough to name an
// intruder, too few for one to flood the log.
const refusalLogEvery = 30 * time.Second

// rateLog decides which refusals are logged: at most one line per key
// (peer and reason) per interval, counting the lines it held back into the
// next one. It keeps at most max keys, so that a stranger minting peer IDs
// cannot grow it; past that, new keys share one. Pure apart from its
// state: the caller passes the time. Safe for concurrent use.
type rateLog struct {
	every time.Duration
	max   int

	mu   sync.Mutex
	keys map[string]*rateEntry
}

type rateEntry struct {
	last time.Time
	held int
}

// overflowKey is the key shared by the keys past max.
const overflowKey = "\x00others"

func newRateLog(every time.Duration, max int) *rateLog {
	return &rateLog{every: every, max: max, keys: map[string]*rateEntry{}}
}

// allow reports whether a line for key may be written at now and, if so,
// how many lines for key were held back since the last one written.
func (r *rateLog) allow(key string, now time.Time) (ok bool, held int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.keys[key]
	if e == nil {
		if len(r.keys) >= r.max {
			for k, o := range r.keys {
				if now.Sub(o.last) >= r.every && o.held == 0 {
					delete(r.keys, k)
				}
			}
		}
		if len(r.keys) >= r.max {
			key = overflowKey
			e = r.keys[key]
		}
		if e == nil {
			e = &rateEntry{}
			r.keys[key] = e
			e.last = now
			return true, 0
		}
	}
	if now.Sub(e.last) < r.every {
		e.held++
		return false, 0
	}
	held, e.held, e.last = e.held, 0, now
	return true, held
}

// refusals logs refused connections and rejected frames at warn level
// through a rateLog.
type refusals struct {
	log *slog.Logger
	rl  *rateLog
}

func newRefusals(log *slog.Logger) *refusals {
	return &refusals{log: log, rl: newRateLog(refusalLogEvery, 1024)}
}

// warn logs msg for p and reason unless one was logged within
// refusalLogEvery; attrs follow.
func (r *refusals) warn(msg string, p peer.ID, reason string, attrs ...any) {
	r.warnAs(msg, "peer", p.String(), reason, attrs...)
}

// warnAs is warn for a sender named by who=name (a peer ID, or the address
// of a connection whose peer is not known yet).
func (r *refusals) warnAs(msg, who, name, reason string, attrs ...any) {
	ok, held := r.rl.allow(name+"\x00"+reason, time.Now())
	if !ok {
		return
	}
	attrs = append([]any{who, name, "reason", reason}, attrs...)
	if held > 0 {
		attrs = append(attrs, "more_since_last", held)
	}
	r.log.Warn(msg, attrs...)
}
