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
// and loads the 64-byte fold's constants into Z9.
#define FOLD4 \
	VBROADCASTI32X4 16(DX), Z9 \
	VPCLMULQDQ $0x00, Z9, Z0, Z4 \
	VPCLMULQDQ $0x11, Z9, Z0, Z0 \
	VPTERNLOGQ $0x96, Z1, Z4, Z0 \
	VPCLMULQDQ $0x00, Z9, Z0, Z4 \
	VPCLMULQDQ $0x11, Z9, Z0, Z0 \
	VPTERNLOGQ $0x96, Z2, Z4, Z0 \
	VPCLMULQDQ $0x00, Z9, Z0, Z4 \
	VPCLMULQDQ $0x11, Z9, Z0, Z0 \
	VPTERNLOGQ $0x96, Z3, Z4, Z0

// LANES folds Z0's four 16-byte lanes onto the last, reduces those 16
// bytes from a zero register with the CRC instruction, and returns that
// register as reg.
#define LANES \
	VMOVDQU64  32(DX), Z10 \
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
	CRC32Q     BX, AX \
	MOVL       AX, reg+32(FP) \
	VZEROUPPER \
	RET


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
	FOLD4

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
	LANES

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
	FOLD4
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
	LANES
