package data

import (
	"bytes"
	"encoding/hex"
	"errors"
	"slices"
	"testing"
	"unicode/utf8"
)

func corpusOf(texts ...string) *Corpus {
	c := &Corpus{Root: "test"}
	for i, s := range texts {
		c.Docs = append(c.Docs, Document{Name: string(rune('a' + i)), Text: []byte(s)})
	}
	return c
}

func TestVocab(t *testing.T) {
	train := corpusOf("hello, wörld", "ab\xffc") // one invalid byte
	for _, c := range []struct {
		level Level
		size  int
	}{
		{ByteLevel, 1 + 15}, // " ,abcdehlorw", 0xc3 0xb6 (ö) and 0xff
		{RuneLevel, 1 + 14}, // " ,abcdehlorw", ö and U+FFFD
	} {
		v, err := NewVocab(train, c.level)
		if err != nil {
			t.Fatal(err)
		}
		if v.Size() != c.size || v.Level() != c.level {
			t.Fatalf("%v: size %d, want %d", c.level, v.Size(), c.size)
		}
		for _, d := range train.Docs {
			ids := v.Encode(nil, d.Text)
			for _, id := range ids {
				if id == UnknownID || int(id) >= v.Size() {
					t.Fatalf("%v: training text gives id %d", c.level, id)
				}
			}
			want := d.Text
			if c.level == RuneLevel {
				want = []byte(string([]rune(string(d.Text)))) // invalid bytes become U+FFFD
			}
			if got := v.Decode(nil, ids); !bytes.Equal(got, want) {
				t.Fatalf("%v: %q decodes to %q", c.level, d.Text, got)
			}
		}
		// Unseen units are UnknownID and decode to U+FFFD, as do ids out
		// of range.
		ids := v.Encode([]int32{7}, []byte("hé"))
		if ids[0] != 7 || ids[1] == UnknownID || ids[len(ids)-1] != UnknownID {
			t.Fatalf("%v: unseen é: %v", c.level, ids)
		}
		if got := string(v.Decode(nil, []int32{-1, 0, int32(v.Size())})); got != "\uFFFD\uFFFD\uFFFD" {
			t.Fatalf("%v: out of range decodes to %q", c.level, got)
		}
	}
	if _, err := NewVocab(corpusOf(), RuneLevel); !errors.Is(err, ErrEmptyCorpus) {
		t.Fatalf("empty corpus: %v", err)
	}
	if _, err := NewVocab(train, 0); !errors.Is(err, ErrConfig) {
		t.Fatal("level 0: no error")
	}
}

func TestVocabEncoding(t *testing.T) {
	v, err := NewVocab(corpusOf("ba→"), RuneLevel)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := v.MarshalBinary()
	// Pinned: peers and checkpoints compare these bytes' digest, so the
	// encoding must never change without a new version.
	const want = "53564f43" + "01" + "02" + "00000003" + "00000061" + "00000062" + "00002192"
	if hex.EncodeToString(b) != want {
		t.Fatalf("encoding %x, want %s", b, want)
	}
	d := v.Digest()
	const wantDigest = "7da79ba5b645d0d07d2193d91312f6e0436a69f9c7f2edfb0f8f1cff45a55ecf"
	if hex.EncodeToString(d[:]) != wantDigest {
		t.Fatalf("digest %x, want %s", d, wantDigest)
	}

	for _, level := range []Level{ByteLevel, RuneLevel} {
		v, _ := NewVocab(corpusOf("The quick brown 🦊 jumps", "über λ"), level)
		b, _ := v.MarshalBinary()
		var w Vocab
		if err := w.UnmarshalBinary(b); err != nil {
			t.Fatalf("%v: %v", level, err)
		}
		if w.Digest() != v.Digest() || w.String() != v.String() {
			t.Fatalf("%v: round trip changes the vocabulary", level)
		}
		text := []byte("quick λ 🦊 über")
		if !slices.Equal(w.Encode(nil, text), v.Encode(nil, text)) {
			t.Fatalf("%v: decoded vocabulary tokenises differently", level)
		}
		// Built again from the same text, in another document order: the
		// same digest.
		v2, _ := NewVocab(corpusOf("über λ", "The quick brown 🦊 jumps"), level)
		if v2.Digest() != v.Digest() {
			t.Fatalf("%v: digest depends on document order", level)
		}
	}
}

func TestVocabUnmarshalBad(t *testing.T) {
	head := func(level byte, n uint32) []byte {
		return append([]byte("SVOC\x01"), level, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	}
	unit := func(u uint32) []byte { return []byte{byte(u >> 24), byte(u >> 16), byte(u >> 8), byte(u)} }
	cat := func(bs ...[]byte) []byte { return bytes.Join(bs, nil) }
	for name, in := range map[string][]byte{
		"empty":         nil,
		"magic":         cat([]byte("SVOX\x01\x02"), unit(0)),
		"version":       cat([]byte("SVOC\x02\x02"), unit(0)),
		"level":         head(3, 0),
		"short":         cat(head(2, 2), unit(97)),
		"long":          cat(head(2, 1), unit(97), unit(98)),
		"huge count":    head(2, 1<<31),
		"byte over 255": cat(head(1, 1), unit(256)),
		"surrogate":     cat(head(2, 1), unit(0xd800)),
		"beyond runes":  cat(head(2, 1), unit(utf8.MaxRune+1)),
		"negative":      cat(head(2, 1), unit(0xffffffff)),
		"unsorted":      cat(head(2, 2), unit(98), unit(97)),
		"duplicate":     cat(head(2, 2), unit(97), unit(97)),
	} {
		var v Vocab
		if err := v.UnmarshalBinary(in); !errors.Is(err, ErrBadVocab) {
			t.Errorf("%s: err = %v, want ErrBadVocab", name, err)
		}
	}
}

func FuzzVocabUnmarshal(f *testing.F) {
	for _, level := range []Level{ByteLevel, RuneLevel} {
		v, _ := NewVocab(corpusOf("fuzz ✓ me"), level)
		b, _ := v.MarshalBinary()
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		var v Vocab
		if v.UnmarshalBinary(in) != nil {
			return
		}
		// Only canonical encodings decode, so digests compare vocabularies.
		out, _ := v.MarshalBinary()
		if !bytes.Equal(in, out) {
			t.Fatalf("%x re-encodes as %x", in, out)
		}
		ids := v.Encode(nil, in)
		if len(v.Decode(nil, ids)) == 0 && len(ids) > 0 {
			t.Fatal("tokens decode to nothing")
		}
	})
}
