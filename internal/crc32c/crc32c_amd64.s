//go:build amd64 && !purego

#include "textflag.h"

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
	VPCLMULQDQ $0x00, Z8, Z0, Z4
	VPCLMULQDQ $0x11, Z8, Z0, Z0
	VPCLMULQDQ $0x00, Z8, Z1, Z5
	VPCLMULQDQ $0x11, Z8, Z1, Z1
	VPCLMULQDQ $0x00, Z8, Z2, Z6
	VPCLMULQDQ $0x11, Z8, Z2, Z2
	VPCLMULQDQ $0x00, Z8, Z3, Z7
	VPCLMULQDQ $0x11, Z8, Z3, Z3
	VPTERNLOGQ $0x96, 0(SI), Z4, Z0
	VPTERNLOGQ $0x96, 64(SI), Z5, Z1
	VPTERNLOGQ $0x96, 128(SI), Z6, Z2
	VPTERNLOGQ $0x96, 192(SI), Z7, Z3
	ADDQ $256, SI
	SUBQ $256, CX
	JMP  loop256

fold4:
	VBROADCASTI32X4 16(DX), Z9
	VPCLMULQDQ $0x00, Z9, Z0, Z4
	VPCLMULQDQ $0x11, Z9, Z0, Z0
	VPTERNLOGQ $0x96, Z1, Z4, Z0
	VPCLMULQDQ $0x00, Z9, Z0, Z4
	VPCLMULQDQ $0x11, Z9, Z0, Z0
	VPTERNLOGQ $0x96, Z2, Z4, Z0
	VPCLMULQDQ $0x00, Z9, Z0, Z4
	VPCLMULQDQ $0x11, Z9, Z0, Z0
	VPTERNLOGQ $0x96, Z3, Z4, Z0

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
	VMOVDQU64  32(DX), Z10
	VPCLMULQDQ $0x00, Z10, Z0, Z4
	VPCLMULQDQ $0x11, Z10, Z0, Z5
	VEXTRACTI32X4 $3, Z0, X6
	VPXORQ     Z5, Z4, Z4
	VEXTRACTI64X4 $1, Z4, Y5
	VPXORQ     Y5, Y4, Y4
	VEXTRACTI128 $1, Y4, X5
	VPXOR      X5, X4, X4
	VPXOR      X6, X4, X4
	XORL       AX, AX
	VMOVQ      X4, BX
	CRC32Q     BX, AX
	VPEXTRQ    $1, X4, BX
	CRC32Q     BX, AX
	MOVL       AX, ret+32(FP)
	VZEROUPPER
	RET
