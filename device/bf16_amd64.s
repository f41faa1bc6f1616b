//go:build amd64 && !purego

#include "textflag.h"

// AVX2 bfloat16 conversions; n is a multiple of 16. Callers (bf16_amd64.go)
// check lengths and finish the tail in Go.

DATA bfAbsMask<>+0(SB)/4, $0x7fffffff
GLOBL bfAbsMask<>(SB), RODATA|NOPTR, $4
DATA bfOne<>+0(SB)/4, $1
GLOBL bfOne<>(SB), RODATA|NOPTR, $4
DATA bfRound<>+0(SB)/4, $0x7fff
GLOBL bfRound<>(SB), RODATA|NOPTR, $4
DATA bfInf<>+0(SB)/4, $0x7f800000
GLOBL bfInf<>(SB), RODATA|NOPTR, $4
DATA bfQuiet<>+0(SB)/4, $0x40
GLOBL bfQuiet<>(SB), RODATA|NOPTR, $4

// BF16(R) leaves in R the bfloat16 of each float (low 16 bits of each dword):
// (f + 0x7fff + (f>>16 & 1)) >> 16, or f>>16 | 0x40 for NaN (BF16Bits).
// Clobbers Y1–Y4.
#define BF16(R) \
	VPSRLD   $16, R, Y1 \
	VPAND    Y11, Y1, Y2 \
	VPADDD   R, Y2, Y2 \
	VPADDD   Y12, Y2, Y2 \
	VPSRLD   $16, Y2, Y2 \
	VPAND    Y10, R, Y3 \
	VPCMPGTD Y13, Y3, Y3 \
	VPOR     Y14, Y1, Y4 \
	VPBLENDVB Y3, Y4, Y2, R

// func bf16EncodeAVX2(dst *uint16, src *float32, n int)
TEXT ·bf16EncodeAVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	VPBROADCASTD bfAbsMask<>(SB), Y10
	VPBROADCASTD bfOne<>(SB), Y11
	VPBROADCASTD bfRound<>(SB), Y12
	VPBROADCASTD bfInf<>(SB), Y13
	VPBROADCASTD bfQuiet<>(SB), Y14

bf16e_loop:
	VMOVUPS (SI), Y5
	BF16(Y5)
	VMOVUPS 32(SI), Y6
	BF16(Y6)
	// Pack 2×8 dwords (each < 2¹⁶) to 16 words; fix the lane order.
	VPACKUSDW Y6, Y5, Y7
	VPERMQ    $0xd8, Y7, Y7
	VMOVDQU   Y7, (DI)
	ADDQ $64, SI
	ADDQ $32, DI
	SUBQ $16, CX
	JNZ  bf16e_loop
	VZEROUPPER
	RET

// func bf16DecodeAVX2(dst *float32, src *uint16, n int)
TEXT ·bf16DecodeAVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX

bf16d_loop:
	VPMOVZXWD (SI), Y0
	VPMOVZXWD 16(SI), Y1
	VPSLLD $16, Y0, Y0
	VPSLLD $16, Y1, Y1
	VMOVDQU Y0, (DI)
	VMOVDQU Y1, 32(DI)
	ADDQ $32, SI
	ADDQ $64, DI
	SUBQ $16, CX
	JNZ  bf16d_loop
	VZEROUPPER
	RET
