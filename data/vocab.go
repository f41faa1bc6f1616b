package data

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"unicode/utf8"
)

// ErrBadVocab reports a vocabulary encoding that UnmarshalBinary rejects.
var ErrBadVocab = errors.New("data: malformed vocabulary")

// Level is the unit a Vocab tokenises text into.
type Level uint8

const (
	// ByteLevel makes one token of every byte.
	ByteLevel Level = 1
	// RuneLevel makes one token of every UTF-8 rune; a byte that is not
	// valid UTF-8 is the rune U+FFFD, as in a Go range loop over a string.
	RuneLevel Level = 2
)

func (l Level) String() string {
	switch l {
	case ByteLevel:
		return "byte"
	case RuneLevel:
		return "rune"
	}
	return fmt.Sprintf("Level(%d)", uint8(l))
}

// UnknownID is the token of every byte or rune a Vocab did not see in
// training.
const UnknownID = 0

// vocabMagic opens a vocabulary's binary encoding; the byte after it is
// the encoding's version.
const (
	vocabMagic   = "SVOC"
	vocabVersion = 1
	vocabHeader  = len(vocabMagic) + 1 + 1 + 4
)

// Vocab maps bytes or runes to token ids: UnknownID, then every unit seen
// in the training text in ascending order from id 1. It is immutable and
// safe for concurrent use.
type Vocab struct {
	level Level
	units []int32         // distinct bytes or runes, ascending; units[k] has id k+1
	low   [256]int32      // the ids of units below 256
	index map[int32]int32 // the ids of the other units
}

// NewVocab builds the vocabulary of the training corpus at the given
// level. An empty corpus is an error wrapping ErrEmptyCorpus.
func NewVocab(train *Corpus, level Level) (*Vocab, error) {
	if level != ByteLevel && level != RuneLevel {
		return nil, fmt.Errorf("%w: vocabulary level %v is neither byte nor rune", ErrConfig, level)
	}
	if train.Bytes() == 0 {
		return nil, fmt.Errorf("%s: %w: no text to build a vocabulary from", train.Root, ErrEmptyCorpus)
	}
	var seenByte [256]bool
	seenRune := map[int32]bool{}
	for _, d := range train.Docs {
		if level == ByteLevel {
			for _, b := range d.Text {
				seenByte[b] = true
			}
			continue
		}
		for _, r := range string(d.Text) {
			if r < utf8.RuneSelf {
				seenByte[r] = true
			} else {
				seenRune[r] = true
			}
		}
	}
	var units []int32
	for b, ok := range seenByte {
		if ok {
			units = append(units, int32(b))
		}
	}
	for r := range seenRune {
		units = append(units, r)
	}
	slices.Sort(units[len(units)-len(seenRune):])
	return newVocab(level, units), nil
}

// newVocab indexes units, which must be ascending and valid for level.
func newVocab(level Level, units []int32) *Vocab {
	v := &Vocab{level: level, units: units, index: map[int32]int32{}}
	for k, u := range units {
		if u < 256 {
			v.low[u] = int32(k + 1)
		} else {
			v.index[u] = int32(k + 1)
		}
	}
	return v
}

// Level returns the unit the vocabulary tokenises into.
func (v *Vocab) Level() Level { return v.level }

// Size returns the number of token ids, UnknownID included.
func (v *Vocab) Size() int { return len(v.units) + 1 }

// id returns unit u's token.
func (v *Vocab) id(u int32) int32 {
	if u >= 0 && u < 256 {
		return v.low[u]
	}
	return v.index[u]
}

// Encode appends the tokens of text to dst and returns the extended slice.
func (v *Vocab) Encode(dst []int32, text []byte) []int32 {
	if v.level == ByteLevel {
		for _, b := range text {
			dst = append(dst, v.id(int32(b)))
		}
		return dst
	}
	for _, r := range string(text) {
		dst = append(dst, v.id(r))
	}
	return dst
}

// Decode appends the text of ids to dst and returns the extended slice.
// UnknownID and ids outside [0, Size) decode to U+FFFD.
func (v *Vocab) Decode(dst []byte, ids []int32) []byte {
	for _, id := range ids {
		switch {
		case id <= 0 || int(id) > len(v.units):
			dst = utf8.AppendRune(dst, utf8.RuneError)
		case v.level == ByteLevel:
			dst = append(dst, byte(v.units[id-1]))
		default:
			dst = utf8.AppendRune(dst, v.units[id-1])
		}
	}
	return dst
}

// AppendBinary appends the vocabulary's canonical encoding to b: "SVOC",
// version 1, the level, the number of units (uint32) and the units in
// ascending order (uint32 each), all big-endian. Equal vocabularies encode
// to equal bytes. It never fails.
func (v *Vocab) AppendBinary(b []byte) ([]byte, error) {
	b = append(b, vocabMagic...)
	b = append(b, vocabVersion, byte(v.level))
	b = binary.BigEndian.AppendUint32(b, uint32(len(v.units)))
	for _, u := range v.units {
		b = binary.BigEndian.AppendUint32(b, uint32(u))
	}
	return b, nil
}

// MarshalBinary returns the encoding AppendBinary describes.
func (v *Vocab) MarshalBinary() ([]byte, error) {
	return v.AppendBinary(make([]byte, 0, vocabHeader+4*len(v.units)))
}

// UnmarshalBinary sets v to the vocabulary b encodes. It accepts only
// canonical encodings, so a vocabulary that decodes encodes back to b.
// Errors wrap ErrBadVocab.
func (v *Vocab) UnmarshalBinary(b []byte) error {
	if len(b) < vocabHeader || string(b[:4]) != vocabMagic {
		return fmt.Errorf("%w: no %q header", ErrBadVocab, vocabMagic)
	}
	if b[4] != vocabVersion {
		return fmt.Errorf("%w: version %d, want %d", ErrBadVocab, b[4], vocabVersion)
	}
	level := Level(b[5])
	if level != ByteLevel && level != RuneLevel {
		return fmt.Errorf("%w: level %d", ErrBadVocab, b[5])
	}
	n := binary.BigEndian.Uint32(b[6:])
	body := b[vocabHeader:]
	if uint64(len(body)) != 4*uint64(n) {
		return fmt.Errorf("%w: %d units need %d bytes, have %d", ErrBadVocab, n, 4*uint64(n), len(body))
	}
	units := make([]int32, n)
	for k := range units {
		u := binary.BigEndian.Uint32(body[4*k:])
		switch {
		case level == ByteLevel && u > 255, level == RuneLevel && !utf8.ValidRune(rune(u)):
			return fmt.Errorf("%w: unit %d (%#x) is no %v", ErrBadVocab, k, u, level)
		case k > 0 && int32(u) <= units[k-1]:
			return fmt.Errorf("%w: unit %d (%#x) does not follow %#x in ascending order", ErrBadVocab, k, u, units[k-1])
		}
		units[k] = int32(u)
	}
	*v = *newVocab(level, units)
	return nil
}

// Digest returns the SHA-256 of the vocabulary's encoding: peers compare
// it to check they tokenise alike, and checkpoints record it.
func (v *Vocab) Digest() [32]byte {
	b, _ := v.MarshalBinary()
	return sha256.Sum256(b)
}

// String describes the vocabulary in one line, with the head of its
// digest.
func (v *Vocab) String() string {
	d := v.Digest()
	return fmt.Sprintf("%v vocabulary of %d tokens, sha256 %x", v.level, v.Size(), d[:6])
}
