//go:build amd64 && !purego

#include "textflag.h"

DATA absMask<>+0(SB)/4, $0x7fffffff
GLOBL absMask<>(SB), RODATA|NOPTR, $4
DATA signMask<>+0(SB)/4, $0x80000000
GLOBL signMask<>(SB), RODATA|NOPTR, $4
DATA f16Big<>+0(SB)/4, $0x477fefff // |x| > this ⇔ |x| ≥ 65520
GLOBL f16Big<>(SB), RODATA|NOPTR, $4
DATA infMinus1<>+0(SB)/4, $0x7f7fffff // |x| > this ⇔ Inf or NaN
GLOBL infMinus1<>(SB), RODATA|NOPTR, $4
DATA f16MaxBits<>+0(SB)/4, $0x477fe000 // 65504.0
GLOBL f16MaxBits<>(SB), RODATA|NOPTR, $4
// VPERMD order that undoes the lane interleaving of VPACKSSDW+VPACKSSWB.
DATA packPerm<>+0(SB)/4, $0
DATA packPerm<>+4(SB)/4, $4
DATA packPerm<>+8(SB)/4, $1
DATA packPerm<>+12(SB)/4, $5
DATA packPerm<>+16(SB)/4, $2
DATA packPerm<>+20(SB)/4, $6
DATA packPerm<>+24(SB)/4, $3
DATA packPerm<>+28(SB)/4, $7
GLOBL packPerm<>(SB), RODATA|NOPTR, $32

// F16SAT replaces, in Y0, every finite value of magnitude ≥ 65520 by ±65504
// (saturation); Inf and NaN pass. Clobbers Y1–Y4.
#define F16SAT(R) \
	VPAND    Y10, R, Y1 \
	VPCMPGTD Y11, Y1, Y2 \
	VPCMPGTD Y12, Y1, Y3 \
	VPANDN   Y2, Y3, Y2 \
	VPAND    Y14, R, Y4 \
	VPOR     Y13, Y4, Y4 \
	VPBLENDVB Y2, Y4, R, R

// func f16EncodeAVX2(dst *byte, src *float32, n int)
TEXT ·f16EncodeAVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	VPBROADCASTD absMask<>(SB), Y10
	VPBROADCASTD f16Big<>(SB), Y11
	VPBROADCASTD infMinus1<>(SB), Y12
	VPBROADCASTD f16MaxBits<>(SB), Y13
	VPBROADCASTD signMask<>(SB), Y14

f16e_loop:
	VMOVUPS (SI), Y0
	F16SAT(Y0)
	VCVTPS2PH $0, Y0, X5
	VMOVUPS 32(SI), Y0
	F16SAT(Y0)
	VCVTPS2PH $0, Y0, X6
	VMOVDQU X5, (DI)
	VMOVDQU X6, 16(DI)
	ADDQ $64, SI
	ADDQ $32, DI
	SUBQ $16, CX
	JNZ  f16e_loop
	VZEROUPPER
	RET

// func f16DecodeAVX2(dst *float32, src *byte, n int)
TEXT ·f16DecodeAVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX

f16d_loop:
	VCVTPH2PS (SI), Y0
	VCVTPH2PS 16(SI), Y1
	VMOVUPS Y0, (DI)
	VMOVUPS Y1, 32(DI)
	ADDQ $32, SI
	ADDQ $64, DI
	SUBQ $16, CX
	JNZ  f16d_loop
	VZEROUPPER
	RET

// func absmaxAVX2(src *float32, n int) uint32
// The largest magnitude bit pattern (sign cleared) of n values.
TEXT ·absmaxAVX2(SB), NOSPLIT, $0-20
	MOVQ src+0(FP), SI
	MOVQ n+8(FP), CX
	VPBROADCASTD absMask<>(SB), Y10
	VPXOR Y0, Y0, Y0
	VPXOR Y1, Y1, Y1

absmax_loop:
	VPAND   (SI), Y10, Y2
	VPAND   32(SI), Y10, Y3
	VPMAXUD Y2, Y0, Y0
	VPMAXUD Y3, Y1, Y1
	ADDQ $64, SI
	SUBQ $16, CX
	JNZ  absmax_loop
	VPMAXUD Y1, Y0, Y0
	VEXTRACTI128 $1, Y0, X1
	VPMAXUD X1, X0, X0
	VPSHUFD $0x4e, X0, X1
	VPMAXUD X1, X0, X0
	VPSHUFD $0xb1, X0, X1
	VPMAXUD X1, X0, X0
	VMOVD X0, AX
	MOVL AX, ret+16(FP)
	VZEROUPPER
	RET

// func quantiseAVX2(dst *byte, src *float32, n int, inv float32)
// dst[i] = int8(round_half_even(src[i]·inv)), n a multiple of 32, |src·inv| ≤ 127.5.
TEXT ·quantiseAVX2(SB), NOSPLIT, $0-28
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	VBROADCASTSS inv+24(FP), Y15
	VMOVDQU packPerm<>(SB), Y14

q_loop:
	VMULPS    (SI), Y15, Y0
	VMULPS    32(SI), Y15, Y1
	VMULPS    64(SI), Y15, Y2
	VMULPS    96(SI), Y15, Y3
	VCVTPS2DQ Y0, Y0
	VCVTPS2DQ Y1, Y1
	VCVTPS2DQ Y2, Y2
	VCVTPS2DQ Y3, Y3
	VPACKSSDW Y1, Y0, Y0
	VPACKSSDW Y3, Y2, Y2
	VPACKSSWB Y2, Y0, Y0
	VPERMD    Y0, Y14, Y0
	VMOVDQU   Y0, (DI)
	ADDQ $128, SI
	ADDQ $32, DI
	SUBQ $32, CX
	JNZ  q_loop
	VZEROUPPER
	RET

// func dequantiseAVX2(dst *float32, src *byte, n int, scale float32)
// dst[i] = float32(int8(src[i]))·scale, n a multiple of 16.
TEXT ·dequantiseAVX2(SB), NOSPLIT, $0-28
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	VBROADCASTSS scale+24(FP), Y15

dq_loop:
	VPMOVSXBD (SI), Y0
	VPMOVSXBD 8(SI), Y1
	VCVTDQ2PS Y0, Y0
	VCVTDQ2PS Y1, Y1
	VMULPS    Y15, Y0, Y0
	VMULPS    Y15, Y1, Y1
	VMOVUPS   Y0, (DI)
	VMOVUPS   Y1, 32(DI)
	ADDQ $16, SI
	ADDQ $64, DI
	SUBQ $16, CX
	JNZ  dq_loop
	VZEROUPPER
	RET

// FP4CODE sets R to the E2M1 code of the 8 values at off(SI): the sign in
// bit 3 and, for k = ⌊|v|·inv⌋ (Y15: inv), the number of thresholds
// 0, 2, 4, 6, 9, 13, 19 (Y8–Y14) below k (fp4Code). Clobbers Y4, Y5.
#define FP4CODE(off, R) \
	VMOVUPS    off(SI), Y4 \
	VPSRLD     $31, Y4, R \
	VPSLLD     $3, R, R \
	VANDPS     Y7, Y4, Y4 \
	VMULPS     Y15, Y4, Y4 \
	VCVTTPS2DQ Y4, Y4 \
	VPCMPGTD   Y8, Y4, Y5 \
	VPSUBD     Y5, R, R \
	VPCMPGTD   Y9, Y4, Y5 \
	VPSUBD     Y5, R, R \
	VPCMPGTD   Y10, Y4, Y5 \
	VPSUBD     Y5, R, R \
	VPCMPGTD   Y11, Y4, Y5 \
	VPSUBD     Y5, R, R \
	VPCMPGTD   Y12, Y4, Y5 \
	VPSUBD     Y5, R, R \
	VPCMPGTD   Y13, Y4, Y5 \
	VPSUBD     Y5, R, R \
	VPCMPGTD   Y14, Y4, Y5 \
	VPSUBD     Y5, R, R

#define BCAST(v, R) \
	MOVL         $v, AX \
	VMOVD        AX, X4 \
	VPBROADCASTD X4, R

// func fp4PackAVX2(dst *byte, src *float32, n int, inv float32)
// dst[j] = code(src[2j]) | code(src[2j+1])<<4 (fp4Encode), n a multiple
// of 32, |src·inv| < 32.
TEXT ·fp4PackAVX2(SB), NOSPLIT, $0-28
	MOVQ         dst+0(FP), DI
	MOVQ         src+8(FP), SI
	MOVQ         n+16(FP), CX
	VBROADCASTSS inv+24(FP), Y15
	BCAST(0x7fffffff, Y7)
	BCAST(0, Y8)
	BCAST(2, Y9)
	BCAST(4, Y10)
	BCAST(6, Y11)
	BCAST(9, Y12)
	BCAST(13, Y13)
	BCAST(19, Y14)
	VMOVDQU      packPerm<>(SB), Y6

fp4_loop:
	FP4CODE(0, Y0)
	FP4CODE(32, Y1)
	FP4CODE(64, Y2)
	FP4CODE(96, Y3)
	VPACKSSDW Y1, Y0, Y0
	VPACKSSDW Y3, Y2, Y2
	VPACKSSWB Y2, Y0, Y0
	VPERMD    Y0, Y6, Y0 // the 32 codes, in order, a byte each
	VPSRLW    $4, Y0, Y1
	VPOR      Y1, Y0, Y0 // low byte of word j: code 2j | code 2j+1 << 4
	VPCMPEQW  Y1, Y1, Y1
	VPSRLW    $8, Y1, Y1
	VPAND     Y1, Y0, Y0
	VPACKUSWB Y0, Y0, Y0
	VPERMQ    $0x08, Y0, Y0
	VMOVDQU   X0, (DI)
	ADDQ      $128, SI
	ADDQ      $16, DI
	SUBQ      $32, CX
	JNZ       fp4_loop
	VZEROUPPER
	RET
