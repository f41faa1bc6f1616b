//go:build amd64 && !purego

#include "textflag.h"

DATA bswapMask<>+0(SB)/8, $0x08090a0b0c0d0e0f
DATA bswapMask<>+8(SB)/8, $0x0001020304050607
GLOBL bswapMask<>(SB), RODATA|NOPTR, $16

DATA gcmPoly<>+0(SB)/8, $0x0000000000000001
DATA gcmPoly<>+8(SB)/8, $0xc200000000000000
GLOBL gcmPoly<>(SB), RODATA|NOPTR, $16

// laneOffsets adds 0, 1, 2, 3 to the counters of a register's four lanes.
DATA laneOffsets<>+0(SB)/8, $0
DATA laneOffsets<>+8(SB)/8, $0
DATA laneOffsets<>+16(SB)/8, $1
DATA laneOffsets<>+24(SB)/8, $0
DATA laneOffsets<>+32(SB)/8, $2
DATA laneOffsets<>+40(SB)/8, $0
DATA laneOffsets<>+48(SB)/8, $3
DATA laneOffsets<>+56(SB)/8, $0
GLOBL laneOffsets<>(SB), RODATA|NOPTR, $64

DATA four<>+0(SB)/8, $4
DATA four<>+8(SB)/8, $0
GLOBL four<>(SB), RODATA|NOPTR, $16

DATA sixteen<>+0(SB)/8, $16
DATA sixteen<>+8(SB)/8, $0
GLOBL sixteen<>(SB), RODATA|NOPTR, $16

#define ROUND(k) \
	VAESENC k, Z0, Z0 \
	VAESENC k, Z1, Z1 \
	VAESENC k, Z2, Z2 \
	VAESENC k, Z3, Z3

// func ctrAVX512(rk *[11][16]byte, ctr *[16]byte, dst, src *byte, n int)
//
// Counters are kept byte-reversed, so that a lane's 32-bit counter is its
// low doubleword and VPADDD is inc32; four registers of four lanes make
// the 16 blocks of a step.
TEXT ·ctrAVX512(SB), NOSPLIT, $0-40
	MOVQ rk+0(FP), AX
	MOVQ ctr+8(FP), BX
	MOVQ dst+16(FP), DI
	MOVQ src+24(FP), SI
	MOVQ n+32(FP), CX

	VBROADCASTI32X4 0(AX), Z16
	VBROADCASTI32X4 16(AX), Z17
	VBROADCASTI32X4 32(AX), Z18
	VBROADCASTI32X4 48(AX), Z19
	VBROADCASTI32X4 64(AX), Z20
	VBROADCASTI32X4 80(AX), Z21
	VBROADCASTI32X4 96(AX), Z22
	VBROADCASTI32X4 112(AX), Z23
	VBROADCASTI32X4 128(AX), Z24
	VBROADCASTI32X4 144(AX), Z25
	VBROADCASTI32X4 160(AX), Z26
	VBROADCASTI32X4 bswapMask<>(SB), Z27
	VBROADCASTI32X4 four<>(SB), Z9
	VBROADCASTI32X4 sixteen<>(SB), Z8

	VBROADCASTI32X4 0(BX), Z4
	VPSHUFB   Z27, Z4, Z4
	VPADDD    laneOffsets<>(SB), Z4, Z4
	VPADDD    Z9, Z4, Z5
	VPADDD    Z9, Z5, Z6
	VPADDD    Z9, Z6, Z7

ctrLoop:
	VPSHUFB Z27, Z4, Z0
	VPSHUFB Z27, Z5, Z1
	VPSHUFB Z27, Z6, Z2
	VPSHUFB Z27, Z7, Z3
	VPXORQ  Z16, Z0, Z0
	VPXORQ  Z16, Z1, Z1
	VPXORQ  Z16, Z2, Z2
	VPXORQ  Z16, Z3, Z3
	ROUND(Z17)
	ROUND(Z18)
	ROUND(Z19)
	ROUND(Z20)
	ROUND(Z21)
	ROUND(Z22)
	ROUND(Z23)
	ROUND(Z24)
	ROUND(Z25)
	VAESENCLAST Z26, Z0, Z0
	VAESENCLAST Z26, Z1, Z1
	VAESENCLAST Z26, Z2, Z2
	VAESENCLAST Z26, Z3, Z3
	VPXORQ    0(SI), Z0, Z0
	VPXORQ    64(SI), Z1, Z1
	VPXORQ    128(SI), Z2, Z2
	VPXORQ    192(SI), Z3, Z3
	VMOVDQU64 Z0, 0(DI)
	VMOVDQU64 Z1, 64(DI)
	VMOVDQU64 Z2, 128(DI)
	VMOVDQU64 Z3, 192(DI)
	VPADDD    Z8, Z4, Z4
	VPADDD    Z8, Z5, Z5
	VPADDD    Z8, Z6, Z6
	VPADDD    Z8, Z7, Z7
	ADDQ      $256, SI
	ADDQ      $256, DI
	SUBQ      $16, CX
	JNZ       ctrLoop
	VZEROUPPER
	RET

// REDUCE folds the 256-bit product X9:X8 (high:low, with the middle
// term X10 still apart) into X12, modulo GCM's polynomial (X14), in the
// form of crypto/internal/fips140/aes/gcm's gcmAesData.
#define REDUCE \
	VPSLLDQ    $8, X10, X11 \
	VPSRLDQ    $8, X10, X10 \
	VPXOR      X11, X8, X8 \
	VPXOR      X10, X9, X9 \
	VPCLMULQDQ $0x01, X8, X14, X11 \
	VPSHUFD    $0x4e, X8, X8 \
	VPXOR      X11, X8, X8 \
	VPCLMULQDQ $0x01, X8, X14, X11 \
	VPSHUFD    $0x4e, X8, X8 \
	VPXOR      X11, X8, X8 \
	VPXOR      X9, X8, X12

// LANESUM XORs the four lanes of Z into its low lane (X).
#define LANESUM(Z, Y, X) \
	VEXTRACTI64X4 $1, Z, Y11 \
	VPXORQ        Y11, Y, Y \
	VEXTRACTI128  $1, Y, X11 \
	VPXOR         X11, X, X

// MULADD multiplies the lanes of data register D by those of H and adds
// the low, high and middle products to Z8, Z9 and Z10.
#define MULADD(D, H) \
	VPCLMULQDQ $0x00, H, D, Z11 \
	VPCLMULQDQ $0x11, H, D, Z13 \
	VPCLMULQDQ $0x01, H, D, Z17 \
	VPCLMULQDQ $0x10, H, D, D \
	VPXORQ     Z11, Z8, Z8 \
	VPXORQ     Z13, Z9, Z9 \
	VPTERNLOGQ $0x96, Z17, D, Z10

// func ghashAVX512(htab *[16][16]byte, acc *[16]byte, p *byte, n int)
//
// Sixteen blocks a step: block i of the step (the accumulator added to
// block 0) times H^(16-i), summed, and one reduction; then single blocks
// times H.
TEXT ·ghashAVX512(SB), NOSPLIT, $0-32
	MOVQ htab+0(FP), AX
	MOVQ acc+8(FP), BX
	MOVQ p+16(FP), SI
	MOVQ n+24(FP), CX
	VMOVDQU (BX), X12
	VMOVDQU gcmPoly<>(SB), X14
	CMPQ    CX, $16
	JB      singles

	VBROADCASTI32X4 bswapMask<>(SB), Z27
	VMOVDQU64 0(AX), Z4
	VMOVDQU64 64(AX), Z5
	VMOVDQU64 128(AX), Z6
	VMOVDQU64 192(AX), Z7

loop16:
	VMOVDQU64  0(SI), Z0
	VMOVDQU64  64(SI), Z1
	VMOVDQU64  128(SI), Z2
	VMOVDQU64  192(SI), Z3
	VPSHUFB    Z27, Z0, Z0
	VPSHUFB    Z27, Z1, Z1
	VPSHUFB    Z27, Z2, Z2
	VPSHUFB    Z27, Z3, Z3
	VPXORQ     Z12, Z0, Z0
	VPCLMULQDQ $0x00, Z4, Z0, Z8
	VPCLMULQDQ $0x11, Z4, Z0, Z9
	VPCLMULQDQ $0x01, Z4, Z0, Z10
	VPCLMULQDQ $0x10, Z4, Z0, Z0
	VPXORQ     Z0, Z10, Z10
	MULADD(Z1, Z5)
	MULADD(Z2, Z6)
	MULADD(Z3, Z7)
	LANESUM(Z8, Y8, X8)
	LANESUM(Z9, Y9, X9)
	LANESUM(Z10, Y10, X10)
	REDUCE
	ADDQ       $256, SI
	SUBQ       $16, CX
	CMPQ       CX, $16
	JAE        loop16

singles:
	TESTQ   CX, CX
	JZ      done
	VMOVDQU bswapMask<>(SB), X13
	VMOVDQU 240(AX), X4

single:
	VMOVDQU    (SI), X0
	VPSHUFB    X13, X0, X0
	VPXOR      X12, X0, X0
	VPCLMULQDQ $0x00, X4, X0, X8
	VPCLMULQDQ $0x11, X4, X0, X9
	VPCLMULQDQ $0x01, X4, X0, X10
	VPCLMULQDQ $0x10, X4, X0, X11
	VPXOR      X11, X10, X10
	REDUCE
	ADDQ       $16, SI
	DECQ       CX
	JNZ        single

done:
	VMOVDQU X12, (BX)
	VZEROUPPER
	RET

// GH4 multiplies the hash input's four registers (Z28–Z31, prepared) by
// the powers at AX and sums into Z9 (low), Z10 (high), Z11 (middle),
// one product at a time (HMUL); HFIRST starts the sums.
#define HFIRST(D, off) \
	VPCLMULQDQ $0x00, off(AX), D, Z9 \
	VPCLMULQDQ $0x11, off(AX), D, Z10 \
	VPCLMULQDQ $0x01, off(AX), D, Z11 \
	VPCLMULQDQ $0x10, off(AX), D, D \
	VPXORQ     D, Z11, Z11

#define HLO(D, off) \
	VPCLMULQDQ $0x00, off(AX), D, Z13 \
	VPXORQ     Z13, Z9, Z9

#define HHI(D, off) \
	VPCLMULQDQ $0x11, off(AX), D, Z13 \
	VPXORQ     Z13, Z10, Z10

#define HMID(D, off) \
	VPCLMULQDQ $0x01, off(AX), D, Z13 \
	VPCLMULQDQ $0x10, off(AX), D, D \
	VPTERNLOGQ $0x96, Z13, D, Z11

// HREDUCE sums the lanes of Z9–Z11 and reduces them into the accumulator
// X12 (X14: the polynomial; X13: scratch).
#define HREDUCE \
	VEXTRACTI64X4 $1, Z9, Y13 \
	VPXORQ        Y13, Y9, Y9 \
	VEXTRACTI128  $1, Y9, X13 \
	VPXOR         X13, X9, X9 \
	VEXTRACTI64X4 $1, Z10, Y13 \
	VPXORQ        Y13, Y10, Y10 \
	VEXTRACTI128  $1, Y10, X13 \
	VPXOR         X13, X10, X10 \
	VEXTRACTI64X4 $1, Z11, Y13 \
	VPXORQ        Y13, Y11, Y11 \
	VEXTRACTI128  $1, Y11, X13 \
	VPXOR         X13, X11, X11 \
	VPSLLDQ       $8, X11, X13 \
	VPSRLDQ       $8, X11, X11 \
	VPXOR         X13, X9, X9 \
	VPXOR         X11, X10, X10 \
	VPCLMULQDQ    $0x01, X9, X14, X13 \
	VPSHUFD       $0x4e, X9, X9 \
	VPXOR         X13, X9, X9 \
	VPCLMULQDQ    $0x01, X9, X14, X13 \
	VPSHUFD       $0x4e, X9, X9 \
	VPXOR         X13, X9, X9 \
	VPXOR         X10, X9, X12

// func stitchAVX512(rk *[11][16]byte, htab *[16][16]byte, ctr *[16]byte, acc *[16]byte, dst, src, h *byte, n int)
//
// One pass of 16 blocks a step that does both halves of GCM: dst = src
// XOR the key stream from counter block ctr (as ctrAVX512), and the 16
// blocks at h folded into acc (as ghashAVX512). h is src when opening;
// when sealing it is dst − 256, the ciphertext of the step before, so
// both halves stay independent and their instructions interleave. n is a
// positive multiple of 16.
TEXT ·stitchAVX512(SB), NOSPLIT, $0-64
	MOVQ rk+0(FP), DX
	MOVQ htab+8(FP), AX
	MOVQ ctr+16(FP), BX
	MOVQ acc+24(FP), R8
	MOVQ dst+32(FP), DI
	MOVQ src+40(FP), SI
	MOVQ h+48(FP), R9
	MOVQ n+56(FP), CX

	VBROADCASTI32X4 0(DX), Z16
	VBROADCASTI32X4 16(DX), Z17
	VBROADCASTI32X4 32(DX), Z18
	VBROADCASTI32X4 48(DX), Z19
	VBROADCASTI32X4 64(DX), Z20
	VBROADCASTI32X4 80(DX), Z21
	VBROADCASTI32X4 96(DX), Z22
	VBROADCASTI32X4 112(DX), Z23
	VBROADCASTI32X4 128(DX), Z24
	VBROADCASTI32X4 144(DX), Z25
	VBROADCASTI32X4 160(DX), Z26
	VBROADCASTI32X4 bswapMask<>(SB), Z27
	VBROADCASTI32X4 four<>(SB), Z15
	VBROADCASTI32X4 sixteen<>(SB), Z8
	VBROADCASTI32X4 0(BX), Z4
	VPSHUFB   Z27, Z4, Z4
	VPADDD    laneOffsets<>(SB), Z4, Z4
	VPADDD    Z15, Z4, Z5
	VPADDD    Z15, Z5, Z6
	VPADDD    Z15, Z6, Z7
	VMOVDQU   (R8), X12
	VMOVDQU   gcmPoly<>(SB), X14

stitchLoop:
	VMOVDQU64 0(R9), Z28
	VMOVDQU64 64(R9), Z29
	VMOVDQU64 128(R9), Z30
	VMOVDQU64 192(R9), Z31
	VPSHUFB   Z27, Z4, Z0
	VPSHUFB   Z27, Z5, Z1
	VPSHUFB   Z27, Z6, Z2
	VPSHUFB   Z27, Z7, Z3
	VPSHUFB   Z27, Z28, Z28
	VPSHUFB   Z27, Z29, Z29
	VPSHUFB   Z27, Z30, Z30
	VPSHUFB   Z27, Z31, Z31
	VPXORQ    Z16, Z0, Z0
	VPXORQ    Z16, Z1, Z1
	VPXORQ    Z16, Z2, Z2
	VPXORQ    Z16, Z3, Z3
	VPXORQ    Z12, Z28, Z28
	ROUND(Z17)
	HFIRST(Z28, 0)
	ROUND(Z18)
	HLO(Z29, 64)
	HHI(Z29, 64)
	ROUND(Z19)
	HMID(Z29, 64)
	ROUND(Z20)
	HLO(Z30, 128)
	HHI(Z30, 128)
	ROUND(Z21)
	HMID(Z30, 128)
	ROUND(Z22)
	HLO(Z31, 192)
	HHI(Z31, 192)
	ROUND(Z23)
	HMID(Z31, 192)
	ROUND(Z24)
	ROUND(Z25)
	VAESENCLAST Z26, Z0, Z0
	VAESENCLAST Z26, Z1, Z1
	VAESENCLAST Z26, Z2, Z2
	VAESENCLAST Z26, Z3, Z3
	VPXORQ    0(SI), Z0, Z0
	VPXORQ    64(SI), Z1, Z1
	VPXORQ    128(SI), Z2, Z2
	VPXORQ    192(SI), Z3, Z3
	VMOVDQU64 Z0, 0(DI)
	VMOVDQU64 Z1, 64(DI)
	VMOVDQU64 Z2, 128(DI)
	VMOVDQU64 Z3, 192(DI)
	HREDUCE
	VPADDD    Z8, Z4, Z4
	VPADDD    Z8, Z5, Z5
	VPADDD    Z8, Z6, Z6
	VPADDD    Z8, Z7, Z7
	ADDQ      $256, SI
	ADDQ      $256, DI
	ADDQ      $256, R9
	SUBQ      $16, CX
	JNZ       stitchLoop

	VMOVDQU X12, (R8)
	VZEROUPPER
	RET
