// Package aesgcm is AES-128-GCM (NIST SP 800-38D, 12-byte nonces, 16-byte
// tags) that seals and opens 16 blocks per step with VAES and VPCLMULQDQ
// on 512-bit registers where the CPU has them, and is crypto/cipher's GCM
// elsewhere. Its output is crypto/cipher's, bit for bit.
package aesgcm

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/subtle"
	"encoding/binary"
	"errors"
)

const (
	nonceSize = 12
	tagSize   = 16
	// group is the blocks the vector code takes per step.
	group = 16
)

var errOpen = errors.New("aesgcm: message authentication failed")

// New returns AES-128-GCM under key (16 bytes).
func New(key []byte) (cipher.AEAD, error) {
	b, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	if len(key) != 16 || !haveVAES {
		return cipher.NewGCM(b)
	}
	return newGCM(b, key), nil
}

// gcm is AES-128-GCM on the vector code.
type gcm struct {
	b    cipher.Block
	rk   [11][16]byte // AES-128 round keys
	htab [group][16]byte
}

func newGCM(b cipher.Block, key []byte) *gcm {
	g := &gcm{b: b, rk: expandKey128(key)}
	var h [16]byte
	b.Encrypt(h[:], h[:])
	g.htab = powers(h)
	return g
}

func (g *gcm) NonceSize() int { return nonceSize }
func (g *gcm) Overhead() int  { return tagSize }

// Seal implements cipher.AEAD.
func (g *gcm) Seal(dst, nonce, plaintext, additionalData []byte) []byte {
	if len(nonce) != nonceSize {
		panic("aesgcm: incorrect nonce length")
	}
	if uint64(len(plaintext)) > (1<<32-2)*16 {
		panic("aesgcm: message too large for GCM")
	}
	ret, out := sliceForAppend(dst, len(plaintext)+tagSize)
	if inexactOverlap(out, plaintext) || anyOverlap(out, additionalData) {
		panic("aesgcm: invalid buffer overlap")
	}
	j0, c, acc := g.start(nonce, additionalData)
	ct := out[:len(plaintext)]
	// Whole steps: the first step's key stream alone, then each step's
	// key stream with the step before's ciphertext hashed, then the last
	// step's hash alone.
	if n := len(plaintext) / (16 * group) * group; n > 0 {
		ctrAVX512(&g.rk, &c, &ct[0], &plaintext[0], group)
		inc32(&c, group)
		if n > group {
			stitchAVX512(&g.rk, &g.htab, &c, &acc, &ct[16*group], &plaintext[16*group], &ct[0], n-group)
			inc32(&c, uint32(n-group))
		}
		ghashAVX512(&g.htab, &acc, &ct[16*(n-group)], group)
		ct, plaintext = ct[16*n:], plaintext[16*n:]
	}
	g.ctrTail(ct, plaintext, &c)
	g.ghash(&acc, ct)
	g.finish(out[len(out)-tagSize:], j0, &acc, len(additionalData), len(out)-tagSize)
	return ret
}

// Open implements cipher.AEAD.
func (g *gcm) Open(dst, nonce, ciphertext, additionalData []byte) ([]byte, error) {
	if len(nonce) != nonceSize {
		panic("aesgcm: incorrect nonce length")
	}
	if len(ciphertext) < tagSize || uint64(len(ciphertext)) > (1<<32-2)*16+tagSize {
		return nil, errOpen
	}
	ct, tag := ciphertext[:len(ciphertext)-tagSize], ciphertext[len(ciphertext)-tagSize:]
	ret, out := sliceForAppend(dst, len(ct))
	if inexactOverlap(out, ciphertext) || anyOverlap(out, additionalData) {
		panic("aesgcm: invalid buffer overlap")
	}
	j0, c, acc := g.start(nonce, additionalData)
	o, in := out, ct
	if n := len(in) / (16 * group) * group; n > 0 {
		stitchAVX512(&g.rk, &g.htab, &c, &acc, &o[0], &in[0], &in[0], n)
		inc32(&c, uint32(n))
		o, in = o[16*n:], in[16*n:]
	}
	g.ghash(&acc, in)
	g.ctrTail(o, in, &c)
	var want [tagSize]byte
	g.finish(want[:], j0, &acc, len(additionalData), len(ct))
	if subtle.ConstantTimeCompare(want[:], tag) != 1 {
		clear(out)
		return nil, errOpen
	}
	return ret, nil
}

// start returns a message's pre-counter block J0, its first counter block
// J0+1, and the hash of its additional data.
func (g *gcm) start(nonce, ad []byte) (j0, c, acc [16]byte) {
	copy(j0[:], nonce)
	j0[15] = 1
	c = j0
	inc32(&c, 1)
	g.ghash(&acc, ad)
	return j0, c, acc
}

// ctrTail XORs src, shorter than a step, with the key stream from
// counter block c into dst.
func (g *gcm) ctrTail(dst, src []byte, c *[16]byte) {
	if len(src) == 0 {
		return
	}
	var ks [16 * group]byte
	ctrAVX512(&g.rk, c, &ks[0], &ks[0], group)
	subtle.XORBytes(dst, src, ks[:len(src)])
}

// finish folds the lengths block into acc and writes the tag into t.
func (g *gcm) finish(t []byte, j0 [16]byte, acc *[16]byte, adLen, ctLen int) {
	var lens [16]byte
	binary.BigEndian.PutUint64(lens[:8], uint64(adLen)*8)
	binary.BigEndian.PutUint64(lens[8:], uint64(ctLen)*8)
	ghashAVX512(&g.htab, acc, &lens[0], 1)
	var s [16]byte
	g.b.Encrypt(s[:], j0[:])
	// acc holds the hash byte-reversed (the vector code's form).
	for i := range 16 {
		t[i] = acc[15-i] ^ s[i]
	}
}

// ghash folds p, zero-padded to whole blocks, into acc.
func (g *gcm) ghash(acc *[16]byte, p []byte) {
	if n := len(p) / 16; n > 0 {
		ghashAVX512(&g.htab, acc, &p[0], n)
		p = p[16*n:]
	}
	if len(p) > 0 {
		var last [16]byte
		copy(last[:], p)
		ghashAVX512(&g.htab, acc, &last[0], 1)
	}
}

// inc32 adds n to the counter block's last 32 bits, big-endian, modulo
// 2^32 (GCM's inc32).
func inc32(c *[16]byte, n uint32) {
	binary.BigEndian.PutUint32(c[12:], binary.BigEndian.Uint32(c[12:])+n)
}

func sliceForAppend(in []byte, n int) (head, tail []byte) {
	if total := len(in) + n; cap(in) >= total {
		head = in[:total]
	} else {
		head = make([]byte, total)
		copy(head, in)
	}
	tail = head[len(in):]
	return
}
