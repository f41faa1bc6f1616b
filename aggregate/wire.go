package aggregate

import (
	"fmt"
	"math"

	"github.com/starling-ml/starling/aggregate/rule"
)

// Control messages travel as []float32 chunks like the data, with integers
// and float64s stored bit for bit in consecutive 32-bit words (low word
// first). They are never summed, only copied, so the bit patterns survive;
// the decoders below check every field, since the bytes come from a peer.

const (
	headerMagic    = 0x52444853 // "SHDR"
	encHeaderMagic = 0x504d4353 // "SCMP": a compressed pass's header
	voteMagic      = 0x544f5653 // "SVOT"
	headerLen      = 8
	encHeaderLen   = 10
	voteFixed      = 8
)

func putU32(w []float32, v uint32) { w[0] = math.Float32frombits(v) }
func getU32(w []float32) uint32    { return math.Float32bits(w[0]) }
func putU64(w []float32, v uint64) {
	w[0] = math.Float32frombits(uint32(v))
	w[1] = math.Float32frombits(uint32(v >> 32))
}
func getU64(w []float32) uint64 {
	return uint64(math.Float32bits(w[0])) | uint64(math.Float32bits(w[1]))<<32
}
func putF64(w []float32, f float64) { putU64(w, math.Float64bits(f)) }
func getF64(w []float32) float64    { return math.Float64frombits(getU64(w)) }

// header opens every data lane that has one (see pass.framed; the ring
// sends it to every member): the sender's settings hash, its vector length
// and its weight (a contributor's sample count, a subtree's total, or the
// group's total going down). A compressed pass's header (encHeaderLen
// words, another magic) also gives the byte length of the encoding that
// follows.
type header struct {
	cfg    uint64
	d      uint64
	weight float64
	nbytes uint64 // compressed passes only
}

// encode writes h into w, of headerLen or encHeaderLen words.
func (h header) encode(w []float32) {
	putU32(w[0:], headerMagic)
	if len(w) == encHeaderLen {
		putU32(w[0:], encHeaderMagic)
		putU64(w[7:], h.nbytes)
	}
	putU64(w[1:], h.cfg)
	putU64(w[3:], h.d)
	putF64(w[5:], h.weight)
	putU32(w[len(w)-1:], 0)
}

// decodeHeader reads a header of either length.
func decodeHeader(w []float32) (header, error) {
	magic := uint32(headerMagic)
	switch len(w) {
	case headerLen:
	case encHeaderLen:
		magic = encHeaderMagic
	default:
		return header{}, fmt.Errorf("%w: header of %d words", ErrBadValue, len(w))
	}
	if getU32(w[0:]) != magic || getU32(w[len(w)-1:]) != 0 {
		return header{}, fmt.Errorf("%w: bad header magic or flags", ErrBadValue)
	}
	h := header{cfg: getU64(w[1:]), d: getU64(w[3:]), weight: getF64(w[5:])}
	if len(w) == encHeaderLen {
		h.nbytes = getU64(w[7:])
	}
	if !rule.ValidWeight(h.weight) {
		return header{}, fmt.Errorf("%w: header weight %v", ErrBadValue, h.weight)
	}
	return h, nil
}

// kind is why one peer accuses another in its vote.
type kind uint8

const (
	kindNone        kind = iota
	kindStall            // sent nothing within the timeout, on a wait that depends on no one else
	kindTimeout          // sent nothing within the timeout, on a wait that depends on others too
	kindUnreachable      // sending to it failed
	kindBadLength        // its vector or chunk has the wrong length
	kindBadValue         // NaN/±Inf or a malformed control message
	kindMismatch         // it formed a different group
	kindConfig           // it runs another rule, algorithm or chunk size
	kindStarved          // not an accusation: we waited on it with nothing left to send when the data phase stopped
	kindGone             // its connection closed while we waited on it
	kindMax
)

// hard kinds exclude the accused on one accusation; soft ones only when the
// accused cannot blame anyone itself (see decide); kindStarved and kindGone
// never do (a gone peer is excluded for its missing vote).
func (k kind) hard() bool {
	return k != kindNone && k != kindTimeout && k != kindUnreachable && k != kindStarved && k != kindGone
}

// silences reports whether blame of kind k lets a member stop waiting for
// the accused's vote: a hard kind that is not a disagreement, which the
// accused sees from its own side and votes on. (A closed connection needs
// no silencing: the wait for the peer's vote fails with it too.)
func (k kind) silences() bool {
	return k.hard() && k != kindMismatch && k != kindConfig && k != kindBadLength
}

func (k kind) err() error {
	switch k {
	case kindStall, kindTimeout, kindStarved:
		return ErrStall
	case kindUnreachable:
		return ErrUnreachable
	case kindGone:
		return ErrDisconnected
	case kindBadLength:
		return ErrBadLength
	case kindBadValue:
		return ErrBadValue
	case kindMismatch:
		return ErrGroupMismatch
	case kindConfig:
		return ErrConfigMismatch
	}
	return nil
}

// groupFault is a failure that every member hits alike (nobody to blame,
// nothing a re-run would change).
type groupFault uint8

const (
	faultNone groupFault = iota
	faultOverflow
	faultZeroWeight
	faultRule
	faultMax
)

func (f groupFault) err() error {
	switch f {
	case faultOverflow:
		return ErrOverflow
	case faultZeroWeight:
		return ErrZeroWeight
	case faultRule:
		return ErrTooFewInputs
	}
	return nil
}

// vote is a member's verdict on an attempt: OK when it holds the complete
// result and has passed on everything it owed; otherwise the peers it
// blames (by rank in the attempt's group) and why.
type vote struct {
	ok    bool
	cfg   uint64
	d     uint64
	fault groupFault
	blame []kind // by rank; len = group size
}

func voteLen(n int) int { return voteFixed + n }

func (v *vote) encode(w []float32) {
	putU32(w[0:], voteMagic)
	st := uint32(2)
	if v.ok {
		st = 1
	}
	putU32(w[1:], st)
	putU64(w[2:], v.cfg)
	putU64(w[4:], v.d)
	putU32(w[6:], uint32(v.fault))
	putU32(w[7:], uint32(len(v.blame)))
	for i, k := range v.blame {
		putU32(w[voteFixed+i:], uint32(k))
	}
}

func decodeVote(w []float32, n int, v *vote) error {
	if len(w) != voteLen(n) {
		return fmt.Errorf("%w: vote of %d words for %d peers", ErrBadValue, len(w), n)
	}
	if getU32(w[0:]) != voteMagic {
		return fmt.Errorf("%w: bad vote magic", ErrBadValue)
	}
	switch getU32(w[1:]) {
	case 1:
		v.ok = true
	case 2:
		v.ok = false
	default:
		return fmt.Errorf("%w: bad vote status", ErrBadValue)
	}
	v.cfg, v.d = getU64(w[2:]), getU64(w[4:])
	f := getU32(w[6:])
	if f >= uint32(faultMax) {
		return fmt.Errorf("%w: bad vote fault %d", ErrBadValue, f)
	}
	v.fault = groupFault(f)
	if getU32(w[7:]) != uint32(n) {
		return fmt.Errorf("%w: vote names %d peers, group has %d", ErrBadValue, getU32(w[7:]), n)
	}
	if cap(v.blame) < n {
		v.blame = make([]kind, n)
	}
	v.blame = v.blame[:n]
	for i := range n {
		k := getU32(w[voteFixed+i:])
		if k >= uint32(kindMax) {
			return fmt.Errorf("%w: bad blame kind %d", ErrBadValue, k)
		}
		v.blame[i] = kind(k)
	}
	if v.ok && (v.fault != faultNone || v.blames()) {
		return fmt.Errorf("%w: OK vote with blame", ErrBadValue)
	}
	return nil
}

func (v *vote) blames() bool {
	for _, k := range v.blame {
		if k != kindNone {
			return true
		}
	}
	return false
}

// encodeStats stores float64 statistics two words each.
func encodeStats(w []float32, s []float64) {
	for i, f := range s {
		putF64(w[2*i:], f)
	}
}

func decodeStats(s []float64, w []float32) error {
	if len(w) != 2*len(s) {
		return fmt.Errorf("%w: %d words for %d statistics", ErrBadValue, len(w), len(s))
	}
	for i := range s {
		f := getF64(w[2*i:])
		if math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
			// Every statistic the rules exchange is a sum of squares.
			return fmt.Errorf("%w: statistic %d is %v", ErrBadValue, i, f)
		}
		s[i] = f
	}
	return nil
}
