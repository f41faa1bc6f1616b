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

// KEYS broadcasts the 11 round keys at DX to Z16–Z26, and the byte
// reversal's mask to Z27.
#define KEYS \
	VBROADCASTI32X4 0(DX), Z16 \
	VBROADCASTI32X4 16(DX), Z17 \
	VBROADCASTI32X4 32(DX), Z18 \
	VBROADCASTI32X4 48(DX), Z19 \
	VBROADCASTI32X4 64(DX), Z20 \
	VBROADCASTI32X4 80(DX), Z21 \
	VBROADCASTI32X4 96(DX), Z22 \
	VBROADCASTI32X4 112(DX), Z23 \
	VBROADCASTI32X4 128(DX), Z24 \
	VBROADCASTI32X4 144(DX), Z25 \
	VBROADCASTI32X4 160(DX), Z26 \
	VBROADCASTI32X4 bswapMask<>(SB), Z27

// COUNTERS sets Z4–Z7 to the 16 counter blocks from the one at BX, kept
// byte-reversed so that a lane's 32-bit counter is its low doubleword and
// VPADDD is inc32, and Z8 to the step's increment.
#define COUNTERS \
	VBROADCASTI32X4 four<>(SB), Z15 \
	VBROADCASTI32X4 sixteen<>(SB), Z8 \
	VBROADCASTI32X4 0(BX), Z4 \
	VPSHUFB         Z27, Z4, Z4 \
	VPADDD          laneOffsets<>(SB), Z4, Z4 \
	VPADDD          Z15, Z4, Z5 \
	VPADDD          Z15, Z5, Z6 \
	VPADDD          Z15, Z6, Z7

// NEXT moves the counters on by a step.
#define NEXT \
	VPADDD Z8, Z4, Z4 \
	VPADDD Z8, Z5, Z5 \
	VPADDD Z8, Z6, Z6 \
	VPADDD Z8, Z7, Z7

// AESSTART makes the step's counter blocks and whitens them.
#define AESSTART \
	VPSHUFB Z27, Z4, Z0 \
	VPSHUFB Z27, Z5, Z1 \
	VPSHUFB Z27, Z6, Z2 \
	VPSHUFB Z27, Z7, Z3 \
	VPXORQ  Z16, Z0, Z0 \
	VPXORQ  Z16, Z1, Z1 \
	VPXORQ  Z16, Z2, Z2 \
	VPXORQ  Z16, Z3, Z3

// AESEND finishes the step's key stream and XORs it with the 256 bytes at
// SI into DI.
#define AESEND \
	VAESENCLAST Z26, Z0, Z0 \
	VAESENCLAST Z26, Z1, Z1 \
	VAESENCLAST Z26, Z2, Z2 \
	VAESENCLAST Z26, Z3, Z3 \
	VPXORQ      0(SI), Z0, Z0 \
	VPXORQ      64(SI), Z1, Z1 \
	VPXORQ      128(SI), Z2, Z2 \
	VPXORQ      192(SI), Z3, Z3 \
	VMOVDQU64   Z0, 0(DI) \
	VMOVDQU64   Z1, 64(DI) \
	VMOVDQU64   Z2, 128(DI) \
	VMOVDQU64   Z3, 192(DI)

#define ROUND(k) \
	VAESENC k, Z0, Z0 \
	VAESENC k, Z1, Z1 \
	VAESENC k, Z2, Z2 \
	VAESENC k, Z3, Z3

// func ctrAVX512(rk *[11][16]byte, ctr *[16]byte, dst, src *byte, n int)
TEXT ·ctrAVX512(SB), NOSPLIT, $0-40
	MOVQ rk+0(FP), DX
	MOVQ ctr+8(FP), BX
	MOVQ dst+16(FP), DI
	MOVQ src+24(FP), SI
	MOVQ n+32(FP), CX
	KEYS
	COUNTERS

ctrLoop:
	AESSTART
	ROUND(Z17)
	ROUND(Z18)
	ROUND(Z19)
	ROUND(Z20)
	ROUND(Z21)
	ROUND(Z22)
	ROUND(Z23)
	ROUND(Z24)
	ROUND(Z25)
	AESEND
	NEXT
	ADDQ $256, SI
	ADDQ $256, DI
	SUBQ $16, CX
	JNZ  ctrLoop
	VZEROUPPER
	RET

// HFIRST, HLO, HHI and HMID multiply a register of prepared hash input
// (four blocks) by the four powers at off(AX) and add the low, high and
// middle products to Z9, Z10 and Z11 (Z13: scratch); HFIRST starts the
// sums. Four such registers times H^16..H^1 are a step.
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

// HPREP loads the 256 bytes at R9 into Z28–Z31, reverses each block's
// bytes and adds the accumulator to the first.
#define HPREP \
	VMOVDQU64 0(R9), Z28 \
	VMOVDQU64 64(R9), Z29 \
	VMOVDQU64 128(R9), Z30 \
	VMOVDQU64 192(R9), Z31 \
	VPSHUFB   Z27, Z28, Z28 \
	VPSHUFB   Z27, Z29, Z29 \
	VPSHUFB   Z27, Z30, Z30 \
	VPSHUFB   Z27, Z31, Z31 \
	VPXORQ    Z12, Z28, Z28

// func ghashAVX512(htab *[16][16]byte, acc *[16]byte, p *byte, n int)
//
// Sixteen blocks a step: block i of the step (the accumulator added to
// block 0) times H^(16-i), summed, and one reduction; then single blocks
// times H.
TEXT ·ghashAVX512(SB), NOSPLIT, $0-32
	MOVQ htab+0(FP), AX
	MOVQ acc+8(FP), BX
	MOVQ p+16(FP), R9
	MOVQ n+24(FP), CX
	VMOVDQU (BX), X12
	VMOVDQU gcmPoly<>(SB), X14
	VBROADCASTI32X4 bswapMask<>(SB), Z27

ghashLoop:
	CMPQ CX, $16
	JB   singles
	HPREP
	HFIRST(Z28, 0)
	HLO(Z29, 64)
	HHI(Z29, 64)
	HMID(Z29, 64)
	HLO(Z30, 128)
	HHI(Z30, 128)
	HMID(Z30, 128)
	HLO(Z31, 192)
	HHI(Z31, 192)
	HMID(Z31, 192)
	HREDUCE
	ADDQ $256, R9
	SUBQ $16, CX
	JMP  ghashLoop

singles:
	TESTQ CX, CX
	JZ    done

single:
	VMOVDQU    (R9), X0
	VPSHUFB    X27, X0, X0
	VPXOR      X12, X0, X0
	VMOVDQU    240(AX), X4
	VPCLMULQDQ $0x00, X4, X0, X9
	VPCLMULQDQ $0x11, X4, X0, X10
	VPCLMULQDQ $0x01, X4, X0, X11
	VPCLMULQDQ $0x10, X4, X0, X13
	VPXOR      X13, X11, X11
	HREDUCE
	ADDQ       $16, R9
	DECQ       CX
	JNZ        single

done:
	VMOVDQU X12, (BX)
	VZEROUPPER
	RET

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

	KEYS
	COUNTERS
	VMOVDQU   (R8), X12
	VMOVDQU   gcmPoly<>(SB), X14

stitchLoop:
	HPREP
	AESSTART
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
	AESEND
	HREDUCE
	NEXT
	ADDQ      $256, SI
	ADDQ      $256, DI
	ADDQ      $256, R9
	SUBQ      $16, CX
	JNZ       stitchLoop

	VMOVDQU X12, (R8)
	VZEROUPPER
	RET
