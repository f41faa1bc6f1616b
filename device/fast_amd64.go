//go:build amd64 && !purego

package device

import "golang.org/x/sys/cpu"

func bestISA() string {
	switch {
	case cpu.X86.HasAVX512F && cpu.X86.HasAVX512VL && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512DQ:
		return "avx512"
	case cpu.X86.HasAVX2 && cpu.X86.HasFMA:
		return "avx2"
	}
	return "go"
}

// supportedISAs lists every ISA this CPU can run, best first.
func supportedISAs() []string {
	switch bestISA() {
	case "avx512":
		return []string{"avx512", "avx2", "go"}
	case "avx2":
		return []string{"avx2", "go"}
	}
	return []string{"go"}
}

var avx512Gemm = &gemmImpl{
	name: "avx512-8x32", mr: 8, nr: 32, masked: true,
	kStep: gemmAVX512Step8x32, kRow: gemmAVX512Row8x32,
	kStepB: gemmAVX512StepB8x32, kRowB: gemmAVX512RowB8x32,
	pack16: transpose16AVX512,
	kc:     256, mc: 128, nc: 1024, parFlops: 1 << 21,
	narrow: avx512Narrow,
}

// avx512Narrow serves GEMMs with n ≤ 16 (a classifier's last layer), where
// 32-wide tiles would waste half the multiply-adds or more.
var avx512Narrow = &gemmImpl{
	name: "avx512-16x16", mr: 16, nr: 16, masked: true,
	kStep: gemmAVX512Step16x16, kRow: gemmAVX512Row16x16,
	kStepB: gemmAVX512StepB16x16, kRowB: gemmAVX512RowB16x16,
	pack16: transpose16AVX512,
	kc:     256, mc: 128, nc: 1024, parFlops: 1 << 21,
}

var avx2Gemm = &gemmImpl{
	name: "avx2-6x16", mr: 6, nr: 16, masked: false,
	kStep: gemmAVX2Step6x16, kRow: gemmAVX2Row6x16,
	kc: 256, mc: 96, nc: 1024, parFlops: 1 << 21,
}

func gemmFor(isa string) *gemmImpl {
	switch isa {
	case "avx512":
		return avx512Gemm
	case "avx2":
		return avx2Gemm
	case "go":
		return goGemm
	}
	return nil
}
