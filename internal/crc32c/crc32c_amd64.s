//go:build amd64 && !purego

#include "textflag.h"

// CLMUL4 multiplies the accumulators Z0–Z3 by the 256-byte fold's
// constants (Z8): low halves into Z4–Z7, high halves in place; the step
// ends by XORing the two and the next 256 bytes.
#define CLMUL4 \
	VPCLMULQDQ $0x00, Z8, Z0, Z4 \
	VPCLMULQDQ $0x11, Z8, Z0, Z0 \
	VPCLMULQDQ $0x00, Z8, Z1, Z5 \
	VPCLMULQDQ $0x11, Z8, Z1, Z1 \
	VPCLMULQDQ $0x00, Z8, Z2, Z6 \
	VPCLMULQDQ $0x11, Z8, Z2, Z2 \
	VPCLMULQDQ $0x00, Z8, Z3, Z7 \
	VPCLMULQDQ $0x11, Z8, Z3, Z3

// FOLD4 folds the accumulators Z1, Z2 and Z3 onto Z0, 64 bytes apart,
// and loads the 64-byte fold's constants (from keys k) into Z9.
#define FOLD4(k) \
	VBROADCASTI32X4 16(k), Z9 \
	VPCLMULQDQ $0x00, Z9, Z0, Z4 \
	VPCLMULQDQ $0x11, Z9, Z0, Z0 \
	VPTERNLOGQ $0x96, Z1, Z4, Z0 \
	VPCLMULQDQ $0x00, Z9, Z0, Z4 \
	VPCLMULQDQ $0x11, Z9, Z0, Z0 \
	VPTERNLOGQ $0x96, Z2, Z4, Z0 \
	VPCLMULQDQ $0x00, Z9, Z0, Z4 \
	VPCLMULQDQ $0x11, Z9, Z0, Z0 \
	VPTERNLOGQ $0x96, Z3, Z4, Z0

// LANES folds Z0's four 16-byte lanes onto the last (with keys k) and
// reduces those 16 bytes from a zero register with the CRC instruction,
// into AX (BX is clobbered).
#define LANES(k) \
	VMOVDQU64  32(k), Z10 \
	VPCLMULQDQ $0x00, Z10, Z0, Z4 \
	VPCLMULQDQ $0x11, Z10, Z0, Z5 \
	VEXTRACTI32X4 $3, Z0, X6 \
	VPXORQ     Z5, Z4, Z4 \
	VEXTRACTI64X4 $1, Z4, Y5 \
	VPXORQ     Y5, Y4, Y4 \
	VEXTRACTI128 $1, Y4, X5 \
	VPXOR      X5, X4, X4 \
	VPXOR      X6, X4, X4 \
	XORL       AX, AX \
	VMOVQ      X4, BX \
	CRC32Q     BX, AX \
	VPEXTRQ    $1, X4, BX \
	CRC32Q     BX, AX


// func foldAVX512(crc uint32, p *byte, n int, k *[12]uint64) uint32
//
// Four 64-byte accumulators fold 256 bytes a step (each 128-bit lane moved
// 256 bytes forward: a·k_lo ⊕ a·k_hi, carry-less, per lane), then fold onto
// one, which takes the remaining 64-byte blocks; its four lanes fold onto
// the last, and the CRC instruction reduces those 16 bytes from a zero
// register.
TEXT ·foldAVX512(SB), NOSPLIT, $0-36
	MOVL crc+0(FP), AX
	MOVQ p+8(FP), SI
	MOVQ n+16(FP), CX
	MOVQ k+24(FP), DX

	VMOVDQU64 0(SI), Z0
	VMOVDQU64 64(SI), Z1
	VMOVDQU64 128(SI), Z2
	VMOVDQU64 192(SI), Z3
	VMOVD     AX, X4
	VPXORQ    Z4, Z0, Z0
	ADDQ      $256, SI
	SUBQ      $256, CX
	VBROADCASTI32X4 0(DX), Z8

loop256:
	CMPQ CX, $256
	JB   fold4
	CLMUL4
	VPTERNLOGQ $0x96, 0(SI), Z4, Z0
	VPTERNLOGQ $0x96, 64(SI), Z5, Z1
	VPTERNLOGQ $0x96, 128(SI), Z6, Z2
	VPTERNLOGQ $0x96, 192(SI), Z7, Z3
	ADDQ $256, SI
	SUBQ $256, CX
	JMP  loop256

fold4:
	FOLD4(DX)

loop64:
	CMPQ CX, $64
	JB   lanes
	VPCLMULQDQ $0x00, Z9, Z0, Z4
	VPCLMULQDQ $0x11, Z9, Z0, Z0
	VPTERNLOGQ $0x96, 0(SI), Z4, Z0
	ADDQ $64, SI
	SUBQ $64, CX
	JMP  loop64

lanes:
	LANES(DX)
	MOVL AX, reg+32(FP)
	VZEROUPPER
	RET

// func foldFiniteAVX512(crc uint32, p *byte, n int, k *[12]uint64) (uint32, bool)
//
// foldAVX512, and whether p[:n] read as float32 values holds a NaN or ±Inf
// (true): the largest exponent field seen, x & 0x7f800000 unsigned, is all
// ones exactly then.
TEXT ·foldFiniteAVX512(SB), NOSPLIT, $0-37
	MOVL crc+0(FP), AX
	MOVQ p+8(FP), SI
	MOVQ n+16(FP), CX
	MOVQ k+24(FP), DX
	MOVL         $0x7f800000, BX
	VPBROADCASTD BX, Z16

	VMOVDQU64 0(SI), Z0
	VMOVDQU64 64(SI), Z1
	VMOVDQU64 128(SI), Z2
	VMOVDQU64 192(SI), Z3
	VPANDD    Z16, Z0, Z17
	VPANDD    Z16, Z1, Z18
	VPANDD    Z16, Z2, Z19
	VPANDD    Z16, Z3, Z20
	VMOVD     AX, X4
	VPXORQ    Z4, Z0, Z0
	ADDQ      $256, SI
	SUBQ      $256, CX
	VBROADCASTI32X4 0(DX), Z8

floop256:
	CMPQ CX, $256
	JB   ffold4
	VMOVDQU64  0(SI), Z12
	VMOVDQU64  64(SI), Z13
	VMOVDQU64  128(SI), Z14
	VMOVDQU64  192(SI), Z15
	CLMUL4
	VPTERNLOGQ $0x96, Z12, Z4, Z0
	VPTERNLOGQ $0x96, Z13, Z5, Z1
	VPTERNLOGQ $0x96, Z14, Z6, Z2
	VPTERNLOGQ $0x96, Z15, Z7, Z3
	VPANDD     Z16, Z12, Z12
	VPANDD     Z16, Z13, Z13
	VPANDD     Z16, Z14, Z14
	VPANDD     Z16, Z15, Z15
	VPMAXUD    Z12, Z17, Z17
	VPMAXUD    Z13, Z18, Z18
	VPMAXUD    Z14, Z19, Z19
	VPMAXUD    Z15, Z20, Z20
	ADDQ $256, SI
	SUBQ $256, CX
	JMP  floop256

ffold4:
	FOLD4(DX)
	VPMAXUD    Z18, Z17, Z17
	VPMAXUD    Z20, Z19, Z19
	VPMAXUD    Z19, Z17, Z17

floop64:
	CMPQ CX, $64
	JB   flanes
	VMOVDQU64  0(SI), Z12
	VPCLMULQDQ $0x00, Z9, Z0, Z4
	VPCLMULQDQ $0x11, Z9, Z0, Z0
	VPTERNLOGQ $0x96, Z12, Z4, Z0
	VPANDD     Z16, Z12, Z12
	VPMAXUD    Z12, Z17, Z17
	ADDQ $64, SI
	SUBQ $64, CX
	JMP  floop64

flanes:
	VPCMPEQD   Z16, Z17, K1
	KORTESTW   K1, K1
	SETNE      nonFinite+36(FP)
	LANES(DX)
	MOVL AX, reg+32(FP)
	VZEROUPPER
	RET

// FOLDSTEP folds accumulator a 256 bytes forward (constants Z29, temp t)
// and XORs in the next block d.
#define FOLDSTEP(a, t, d) \
	VPCLMULQDQ $0x00, Z29, a, t \
	VPCLMULQDQ $0x11, Z29, a, a \
	VPTERNLOGQ $0x96, d, t, a

// EXPMAX4 raises m to the largest exponent field (x & Z30, unsigned) of
// d0–d3, with temp t.
#define EXPMAX4(m, d0, d1, d2, d3, t) \
	VPANDD  Z30, d0, t \
	VPMAXUD t, m, m    \
	VPANDD  Z30, d1, t \
	VPMAXUD t, m, m    \
	VPANDD  Z30, d2, t \
	VPMAXUD t, m, m    \
	VPANDD  Z30, d3, t \
	VPMAXUD t, m, m

// SUMS4 loads y[0:64] into Z8–Z11 and sets Z12–Z15 to alpha·x + y (the FMA
// of the device package's axpyToFiniteAVX512), which it stores to out.
#define SUMS4 \
	VMOVUPS     (DX), Z8            \
	VMOVUPS     64(DX), Z9          \
	VMOVUPS     128(DX), Z10        \
	VMOVUPS     192(DX), Z11        \
	VMOVAPS     Z8, Z12             \
	VMOVAPS     Z9, Z13             \
	VMOVAPS     Z10, Z14            \
	VMOVAPS     Z11, Z15            \
	VFMADD231PS (SI), Z31, Z12      \
	VFMADD231PS 64(SI), Z31, Z13    \
	VFMADD231PS 128(SI), Z31, Z14   \
	VFMADD231PS 192(SI), Z31, Z15   \
	VMOVUPS     Z12, (DI)           \
	VMOVUPS     Z13, 64(DI)         \
	VMOVUPS     Z14, 128(DI)        \
	VMOVUPS     Z15, 192(DI)

// func axpyToFoldAVX512(alpha float32, x, y, out *float32, n int, crcY, crcOut uint32, k *[12]uint64) (regY, regOut uint32, bad uint8)
//
// Sets out[i] = alpha·x[i] + y[i] for n values (a multiple of 64, at least
// 64) and folds y's bytes into CRC register crcY and out's into crcOut, as
// foldAVX512 does, in one pass. bad has bit 0 set if y holds a NaN or
// ±Inf, bit 1 if out does. Registers: y's accumulators Z0–Z3, out's
// Z20–Z23; y's values Z8–Z11, out's Z12–Z15; fold temps Z4–Z7 and
// Z16–Z19; largest exponent fields Z24 (y) and Z25 (out).
TEXT ·axpyToFoldAVX512(SB), NOSPLIT, $0-65
	VBROADCASTSS alpha+0(FP), Z31
	MOVL         $0x7f800000, AX
	VPBROADCASTD AX, Z30
	MOVQ         x+8(FP), SI
	MOVQ         y+16(FP), DX
	MOVQ         out+24(FP), DI
	MOVQ         n+32(FP), CX
	MOVQ         k+48(FP), R8
	VBROADCASTI32X4 0(R8), Z29

	SUMS4
	VPXORQ    Z24, Z24, Z24
	VPXORQ    Z25, Z25, Z25
	EXPMAX4(Z24, Z8, Z9, Z10, Z11, Z26)
	EXPMAX4(Z25, Z12, Z13, Z14, Z15, Z27)
	MOVL      crcY+40(FP), AX
	VMOVD     AX, X4
	VPXORQ    Z4, Z8, Z0
	VMOVDQA64 Z9, Z1
	VMOVDQA64 Z10, Z2
	VMOVDQA64 Z11, Z3
	MOVL      crcOut+44(FP), AX
	VMOVD     AX, X16
	VPXORQ    Z16, Z12, Z20
	VMOVDQA64 Z13, Z21
	VMOVDQA64 Z14, Z22
	VMOVDQA64 Z15, Z23
	ADDQ      $256, SI
	ADDQ      $256, DX
	ADDQ      $256, DI
	SUBQ      $64, CX

aloop:
	CMPQ CX, $64
	JB   adone
	SUMS4
	FOLDSTEP(Z0, Z4, Z8)
	FOLDSTEP(Z1, Z5, Z9)
	FOLDSTEP(Z2, Z6, Z10)
	FOLDSTEP(Z3, Z7, Z11)
	FOLDSTEP(Z20, Z16, Z12)
	FOLDSTEP(Z21, Z17, Z13)
	FOLDSTEP(Z22, Z18, Z14)
	FOLDSTEP(Z23, Z19, Z15)
	EXPMAX4(Z24, Z8, Z9, Z10, Z11, Z26)
	EXPMAX4(Z25, Z12, Z13, Z14, Z15, Z27)
	ADDQ $256, SI
	ADDQ $256, DX
	ADDQ $256, DI
	SUBQ $64, CX
	JMP  aloop

adone:
	XORL       R9, R9
	VPCMPEQD   Z30, Z24, K1
	KORTESTW   K1, K1
	SETNE      R9B
	VPCMPEQD   Z30, Z25, K1
	KORTESTW   K1, K1
	SETNE      R10B
	SHLB       $1, R10B
	ORB        R10B, R9B
	MOVB       R9B, bad+64(FP)
	FOLD4(R8)
	LANES(R8)
	MOVL       AX, regY+56(FP)
	VMOVDQA64  Z20, Z0
	VMOVDQA64  Z21, Z1
	VMOVDQA64  Z22, Z2
	VMOVDQA64  Z23, Z3
	FOLD4(R8)
	LANES(R8)
	MOVL       AX, regOut+60(FP)
	VZEROUPPER
	RET
