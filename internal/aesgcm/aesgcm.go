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
	var j0 [16]byte
	copy(j0[:], nonce)
	j0[15] = 1
	g.ctr(out[:len(plaintext)], plaintext, j0)
	g.tag(out[len(plaintext):], j0, additionalData, out[:len(plaintext)])
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
	var j0 [16]byte
	copy(j0[:], nonce)
	j0[15] = 1
	var want [tagSize]byte
	g.tag(want[:], j0, additionalData, ct)
	if subtle.ConstantTimeCompare(want[:], tag) != 1 {
		clear(out)
		return nil, errOpen
	}
	g.ctr(out, ct, j0)
	return ret, nil
}

// ctr XORs src with the key stream that starts at counter block j0+1
// into dst.
func (g *gcm) ctr(dst, src []byte, j0 [16]byte) {
	c := j0
	inc32(&c, 1)
	n := len(src) / (16 * group) * group
	if n > 0 {
		ctrAVX512(&g.rk, &c, &dst[0], &src[0], n)
		inc32(&c, uint32(n))
		dst, src = dst[16*n:], src[16*n:]
	}
	if len(src) == 0 {
		return
	}
	var ks [16 * group]byte
	ctrAVX512(&g.rk, &c, &ks[0], &ks[0], group)
	subtle.XORBytes(dst, src, ks[:len(src)])
}

// tag writes GCM's tag over ad and ct into t.
func (g *gcm) tag(t []byte, j0 [16]byte, ad, ct []byte) {
	var acc [16]byte
	g.ghash(&acc, ad)
	g.ghash(&acc, ct)
	var lens [16]byte
	binary.BigEndian.PutUint64(lens[:8], uint64(len(ad))*8)
	binary.BigEndian.PutUint64(lens[8:], uint64(len(ct))*8)
	ghashAVX512(&g.htab, &acc, &lens[0], 1)
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
