//go:build amd64 && !purego

package crc32c

import "golang.org/x/sys/cpu"

var haveFold = cpu.X86.HasAVX512F && cpu.X86.HasAVX512VL && cpu.X86.HasAVX512VPCLMULQDQ && cpu.X86.HasPCLMULQDQ && cpu.X86.HasSSE42

// foldAVX512 returns the CRC register after p[:n] starting from register
// crc (not inverted on either side). n is a multiple of 64, at least 256.
//
//go:noescape
func foldAVX512(crc uint32, p *byte, n int, k *[12]uint64) (reg uint32)

// foldFiniteAVX512 is foldAVX512, and reports whether p[:n], read as
// little-endian float32 values, holds a NaN or ±Inf.
//
//go:noescape
func foldFiniteAVX512(crc uint32, p *byte, n int, k *[12]uint64) (reg uint32, nonFinite bool)

// axpyToFoldAVX512 sets out = alpha·x + y for n float32 values (n a
// multiple of 64, at least 64) with device.AxpyTo's FMA, and returns the
// CRC registers after y's bytes and after out's (from registers crcY and
// crcOut, not inverted) and bad: bit 0 if y holds a NaN or ±Inf, bit 1 if
// out does.
//
//go:noescape
func axpyToFoldAVX512(alpha float32, x, y, out *float32, n int, crcY, crcOut uint32, k *[12]uint64) (regY, regOut uint32, bad uint8)
