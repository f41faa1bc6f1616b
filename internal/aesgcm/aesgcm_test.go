package aesgcm

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

func stdGCM(t testing.TB, key []byte) cipher.AEAD {
	b, err := aes.NewCipher(key)
	if err != nil {
		t.Fatal(err)
	}
	g, err := cipher.NewGCM(b)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func randBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func needVAES(t testing.TB) {
	if !haveVAES {
		t.Skip("no VAES and VPCLMULQDQ here: New is crypto/cipher's GCM")
	}
}

// TestMatchesCryptoCipher: Seal's output is crypto/cipher's for every
// length around the vector code's 256-byte steps, and Open takes it back.
func TestMatchesCryptoCipher(t *testing.T) {
	needVAES(t)
	r := rand.New(rand.NewPCG(1, 2))
	lengths := []int{0, 1, 15, 16, 17, 255, 256, 257, 511, 512, 4095, 4096 + 48, 256 << 10, 256<<10 + 4}
	for range 200 {
		lengths = append(lengths, r.IntN(3000))
	}
	for i, n := range lengths {
		key, nonce := randBytes(r, 16), randBytes(r, 12)
		ad := randBytes(r, []int{0, 4, 13, 16, 40}[i%5])
		pt := randBytes(r, n)
		g, err := New(key)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := g.(*gcm); !ok {
			t.Fatalf("New gave %T, want the vector code", g)
		}
		want := stdGCM(t, key).Seal(nil, nonce, pt, ad)
		got := g.Seal([]byte("prefix"), nonce, pt, ad)
		if !bytes.Equal(got[6:], want) || string(got[:6]) != "prefix" {
			t.Fatalf("length %d, ad %d: sealed differs from crypto/cipher's", n, len(ad))
		}
		back, err := g.Open(nil, nonce, want, ad)
		if err != nil || !bytes.Equal(back, pt) {
			t.Fatalf("length %d: Open = %v (equal %t)", n, err, bytes.Equal(back, pt))
		}
		// In place, as the record layer opens.
		ct := bytes.Clone(want)
		if back, err := g.Open(ct[:0], nonce, ct, ad); err != nil || !bytes.Equal(back, pt) {
			t.Fatalf("length %d: in-place Open = %v", n, err)
		}
	}
}

// TestOpenRejects: any changed bit of ciphertext, tag, additional data
// or nonce fails Open, and Open then writes nothing into dst.
func TestOpenRejects(t *testing.T) {
	needVAES(t)
	r := rand.New(rand.NewPCG(3, 4))
	key, nonce, ad, pt := randBytes(r, 16), randBytes(r, 12), randBytes(r, 4), randBytes(r, 1000)
	g, _ := New(key)
	ct := g.Seal(nil, nonce, pt, ad)
	for _, bit := range []int{0, 7, 8 * 500, 8*len(pt) - 1, 8 * len(pt), 8*len(ct) - 1} {
		bad := bytes.Clone(ct)
		bad[bit/8] ^= 1 << (bit % 8)
		dst := make([]byte, len(pt))
		if _, err := g.Open(dst[:0], nonce, bad, ad); err == nil {
			t.Fatalf("bit %d flipped: Open succeeded", bit)
		}
		if !bytes.Equal(dst, make([]byte, len(pt))) {
			t.Fatalf("bit %d flipped: Open wrote plaintext", bit)
		}
	}
	if _, err := g.Open(nil, nonce, ct, append(bytes.Clone(ad), 0)); err == nil {
		t.Fatal("other additional data: Open succeeded")
	}
	n2 := bytes.Clone(nonce)
	n2[11] ^= 1
	if _, err := g.Open(nil, n2, ct, ad); err == nil {
		t.Fatal("other nonce: Open succeeded")
	}
	if _, err := g.Open(nil, nonce, ct[:15], ad); err == nil {
		t.Fatal("shorter than a tag: Open succeeded")
	}
}

// TestGhashAgainstReference: the vector GHASH equals one block at a time
// in Go, for counts around its 16-block step.
func TestGhashAgainstReference(t *testing.T) {
	needVAES(t)
	r := rand.New(rand.NewPCG(5, 6))
	var h [16]byte
	copy(h[:], randBytes(r, 16))
	htab := powers(h)
	for _, n := range []int{1, 2, 15, 16, 17, 31, 32, 33, 100} {
		p := randBytes(r, 16*n)
		var a, b [16]byte
		copy(a[:], randBytes(r, 16))
		b = a
		ghashAVX512(&htab, &a, &p[0], n)
		ghashRef(&htab, &b, p)
		if a != b {
			t.Fatalf("%d blocks: vector GHASH differs from the reference", n)
		}
	}
}

// ghashRef folds whole blocks of p into acc one at a time (the
// reference the vector code is tested against).
func ghashRef(htab *[group][16]byte, acc *[16]byte, p []byte) {
	h1 := elem{binary.LittleEndian.Uint64(htab[group-1][8:]), binary.LittleEndian.Uint64(htab[group-1][:8])}
	a := elem{binary.LittleEndian.Uint64(acc[8:]), binary.LittleEndian.Uint64(acc[:8])}
	for ; len(p) >= 16; p = p[16:] {
		x := load(p)
		a = mul(elem{a.hi ^ x.hi, a.lo ^ x.lo}, h1)
	}
	*acc = a.bytes()
}

// TestCounterWraps: the key stream's counter is GCM's inc32, wrapping in
// its low 32 bits, and the key schedule is AES-128's.
func TestCounterWraps(t *testing.T) {
	needVAES(t)
	r := rand.New(rand.NewPCG(7, 8))
	key := randBytes(r, 16)
	b, _ := aes.NewCipher(key)
	rk := expandKey128(key)
	var c [16]byte
	copy(c[:], randBytes(r, 12))
	c[12], c[13], c[14], c[15] = 0xff, 0xff, 0xff, 0xf8
	got := make([]byte, 16*32)
	ctrAVX512(&rk, &c, &got[0], &make([]byte, len(got))[0], 32)
	want := make([]byte, len(got))
	for i := 0; i < len(want); i += 16 {
		b.Encrypt(want[i:], c[:])
		inc32(&c, 1)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("key stream differs from AES-128 of inc32 counters")
	}
}

// TestOverlap: Seal and Open refuse output that overlaps their input at
// another offset, as crypto/cipher's do.
func TestOverlap(t *testing.T) {
	needVAES(t)
	g, _ := New(make([]byte, 16))
	buf := make([]byte, 200)
	defer func() {
		if recover() == nil {
			t.Fatal("Seal into its own plaintext one byte on: no panic")
		}
	}()
	g.Seal(buf[1:1], make([]byte, 12), buf[:100], nil)
}

// benchAEADs runs f on crypto/cipher's GCM and on this package's, 256 KiB
// messages with a 4-byte additional data (a record's).
func benchAEADs(b *testing.B, f func(b *testing.B, g cipher.AEAD, msg []byte)) {
	for _, impl := range []string{"crypto-cipher", "vaes"} {
		b.Run(impl, func(b *testing.B) {
			key := make([]byte, 16)
			g := stdGCM(b, key)
			if impl == "vaes" {
				needVAES(b)
				g, _ = New(key)
			}
			b.SetBytes(256 << 10)
			f(b, g, make([]byte, 256<<10))
		})
	}
}

func BenchmarkSeal(b *testing.B) {
	benchAEADs(b, func(b *testing.B, g cipher.AEAD, pt []byte) {
		out := make([]byte, 0, len(pt)+16)
		nonce := make([]byte, 12)
		for b.Loop() {
			g.Seal(out, nonce, pt, nonce[:4])
		}
	})
}

func BenchmarkOpen(b *testing.B) {
	benchAEADs(b, func(b *testing.B, g cipher.AEAD, pt []byte) {
		nonce := make([]byte, 12)
		ct := g.Seal(nil, nonce, pt, nonce[:4])
		out := make([]byte, 0, len(ct))
		for b.Loop() {
			if _, err := g.Open(out, nonce, ct, nonce[:4]); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkParts times the key stream and GHASH passes on their own.
func BenchmarkParts(b *testing.B) {
	needVAES(b)
	buf := make([]byte, 256<<10)
	var rk [11][16]byte
	var c [16]byte
	b.Run("ctr", func(b *testing.B) {
		b.SetBytes(int64(len(buf)))
		for b.Loop() {
			ctrAVX512(&rk, &c, &buf[0], &buf[0], len(buf)/16)
		}
	})
	var htab [16][16]byte
	var acc [16]byte
	b.Run("ghash", func(b *testing.B) {
		b.SetBytes(int64(len(buf)))
		for b.Loop() {
			ghashAVX512(&htab, &acc, &buf[0], len(buf)/16)
		}
	})
}
