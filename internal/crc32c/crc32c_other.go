//go:build !amd64 || purego

package crc32c

const haveFold = false

func foldAVX512(crc uint32, p *byte, n int, k *[12]uint64) uint32 { panic("unreachable") }

func foldFiniteAVX512(crc uint32, p *byte, n int, k *[12]uint64) (uint32, bool) {
	panic("unreachable")
}

func axpyToFoldAVX512(alpha float32, x, y, out *float32, n int, crcY, crcOut uint32, k *[12]uint64) (uint32, uint32, uint8) {
	panic("unreachable")
}
