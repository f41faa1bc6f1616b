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
	name: "avx512-8x32", mr: 8, nr: 32, masked: true, kStep: gemmAVX512Step8x32, kRow: gemmAVX512Row8x32,
	kc: 256, mc: 128, nc: 1024, parFlops: 1 << 21,
}

var avx2Gemm = &gemmImpl{
	name: "avx2-6x16", mr: 6, nr: 16, masked: false, kStep: gemmAVX2Step6x16, kRow: gemmAVX2Row6x16,
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

// packTransposed writes d[p·w + r] = src[r·ld + p] for r < rows, p < kc,
// 16×16 blocks at a time with AVX-512 where the CPU has it.
func packTransposed(d, src []float32, ld, rows, kc, w int) {
	if !hasAVX512 || kc < 16 || rows < 16 {
		packTransposedGo(d, src, ld, rows, kc, w)
		return
	}
	blocks := kc / 16
	r := 0
	for ; r+16 <= rows; r += 16 {
		// The whole region the assembly touches, bounds-checked once.
		_ = src[(r+15)*ld+blocks*16-1]
		_ = d[(blocks*16-1)*w+r+15]
		transpose16AVX512(&d[r], &src[r*ld], ld, w, blocks)
		if blocks*16 < kc {
			packTransposedGo(d[blocks*16*w+r:], src[r*ld+blocks*16:], ld, 16, kc-blocks*16, w)
		}
	}
	if r < rows {
		packTransposedGo(d[r:], src[r*ld:], ld, rows-r, kc, w)
	}
}

var hasAVX512 = bestISA() == "avx512"
