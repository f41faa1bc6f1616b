//go:build !amd64 || purego

package aesgcm

const haveVAES = false

func ctrAVX512(rk *[11][16]byte, ctr *[16]byte, dst, src *byte, n int) { panic("unreachable") }

func ghashAVX512(htab *[group][16]byte, acc *[16]byte, p *byte, n int) { panic("unreachable") }

func stitchAVX512(rk *[11][16]byte, htab *[group][16]byte, ctr, acc *[16]byte, dst, src, h *byte, n int) {
	panic("unreachable")
}
