//go:build !amd64 || purego

package crc32c

const haveFold = false

func foldAVX512(crc uint32, p *byte, n int, k *[12]uint64) uint32 { panic("unreachable") }

func foldFiniteAVX512(crc uint32, p *byte, n int, k *[12]uint64) (uint32, bool) {
	panic("unreachable")
}
