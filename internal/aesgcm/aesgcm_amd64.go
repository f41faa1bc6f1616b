//go:build amd64 && !purego

package aesgcm

import "golang.org/x/sys/cpu"

var haveVAES = cpu.X86.HasAVX512F && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512VL &&
	cpu.X86.HasAVX512VAES && cpu.X86.HasAVX512VPCLMULQDQ

// ctrAVX512 XORs src[:16n] with the AES-128 encryptions of counter blocks
// ctr, ctr+1, … (inc32) into dst. n is a positive multiple of 16.
//
//go:noescape
func ctrAVX512(rk *[11][16]byte, ctr *[16]byte, dst, src *byte, n int)

// ghashAVX512 folds the n blocks at p into acc (the vector code's form).
//
//go:noescape
func ghashAVX512(htab *[group][16]byte, acc *[16]byte, p *byte, n int)

// stitchAVX512 is ctrAVX512 over src and dst and ghashAVX512 over the n
// blocks at h, in one pass (h is src when opening, dst − 256 when
// sealing). n is a positive multiple of 16.
//
//go:noescape
func stitchAVX512(rk *[11][16]byte, htab *[group][16]byte, ctr, acc *[16]byte, dst, src, h *byte, n int)
