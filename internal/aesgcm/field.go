package aesgcm

import (
	"encoding/binary"
	"math/bits"
	"unsafe"
)

// elem is a GHASH field element in the vector code's form: the block's
// bytes reversed, read as a 128-bit little-endian number (hi, lo).
type elem struct{ hi, lo uint64 }

func load(b []byte) elem {
	return elem{binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:16])}
}

// bytes returns e as the 16 bytes of a vector register (lo first).
func (e elem) bytes() (b [16]byte) {
	binary.LittleEndian.PutUint64(b[:8], e.lo)
	binary.LittleEndian.PutUint64(b[8:], e.hi)
	return b
}

// clmul is the 128-bit carry-less product of a and b.
func clmul(a, b uint64) (hi, lo uint64) {
	for i := range 64 {
		if b>>i&1 == 1 {
			lo ^= a << i
			if i > 0 {
				hi ^= a >> (64 - i)
			}
		}
	}
	return
}

const polyHi = 0xc200000000000000

// double is h·x in the vector code's form: the 128-bit shift left by one,
// reduced by GCM's polynomial when a bit falls out.
func double(h elem) elem {
	carry := h.hi >> 63
	h.hi = h.hi<<1 | h.lo>>63
	h.lo <<= 1
	if carry == 1 {
		h.hi ^= polyHi
		h.lo ^= 1
	}
	return h
}

// mul is the field product as the vector code computes it, with b a
// power of the doubled hash key.
func mul(a, b elem) elem {
	lh, ll := clmul(a.lo, b.lo)
	hh, hl := clmul(a.hi, b.hi)
	m1h, m1l := clmul(a.lo, b.hi)
	m2h, m2l := clmul(a.hi, b.lo)
	mh, ml := m1h^m2h, m1l^m2l
	l := elem{lh ^ ml, ll}
	h := elem{hh, hl ^ mh}
	for range 2 {
		th, tl := clmul(polyHi, l.lo)
		l = elem{l.lo ^ th, l.hi ^ tl}
	}
	return elem{l.hi ^ h.hi, l.lo ^ h.lo}
}

// powers returns the doubled hash key's powers for H = E(K, 0): H^16
// first, H^1 last.
func powers(h [16]byte) (t [group][16]byte) {
	h2 := double(load(h[:]))
	p := h2
	for i := group - 1; i >= 0; i-- {
		t[i] = p.bytes()
		p = mul(p, h2)
	}
	return t
}

// expandKey128 is AES-128's key schedule (FIPS 197 §5.2).
func expandKey128(key []byte) (rk [11][16]byte) {
	sbox := sbox()
	copy(rk[0][:], key)
	rcon := byte(1)
	for r := 1; r <= 10; r++ {
		p := rk[r-1]
		t := [4]byte{sbox[p[13]] ^ rcon, sbox[p[14]], sbox[p[15]], sbox[p[12]]}
		for i := range 16 {
			if i < 4 {
				rk[r][i] = p[i] ^ t[i]
			} else {
				rk[r][i] = p[i] ^ rk[r][i-4]
			}
		}
		rcon = xtime(rcon)
	}
	return rk
}

func xtime(b byte) byte {
	if b&0x80 != 0 {
		return b<<1 ^ 0x1b
	}
	return b << 1
}

// sbox computes AES's S-box: the multiplicative inverse in GF(2^8)
// followed by the affine map.
func sbox() (s [256]byte) {
	p, q := byte(1), byte(1)
	for {
		p ^= xtime(p) // p·3 walks every non-zero element
		q ^= q << 1   // q·(1/3)
		q ^= q << 2
		q ^= q << 4
		if q&0x80 != 0 {
			q ^= 0x09
		}
		s[p] = q ^ bits.RotateLeft8(q, 1) ^ bits.RotateLeft8(q, 2) ^ bits.RotateLeft8(q, 3) ^ bits.RotateLeft8(q, 4) ^ 0x63
		if p == 1 {
			break
		}
	}
	s[0] = 0x63
	return s
}

// anyOverlap reports whether x and y share memory.
func anyOverlap(x, y []byte) bool {
	return len(x) > 0 && len(y) > 0 &&
		uintptr(unsafe.Pointer(&x[0])) <= uintptr(unsafe.Pointer(&y[len(y)-1])) &&
		uintptr(unsafe.Pointer(&y[0])) <= uintptr(unsafe.Pointer(&x[len(x)-1]))
}

// inexactOverlap reports whether x and y share memory at different
// offsets (in-place use, x and y starting together, is allowed).
func inexactOverlap(x, y []byte) bool {
	if len(x) == 0 || len(y) == 0 || &x[0] == &y[0] {
		return false
	}
	return anyOverlap(x, y)
}
