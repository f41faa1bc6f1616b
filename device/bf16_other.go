//go:build !amd64 || purego

package device

func encodeBF16Vec(dst []uint16, src []float32) int { return 0 }
func decodeBF16Vec(dst []float32, src []uint16) int { return 0 }
