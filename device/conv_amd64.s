//go:build amd64 && !purego

#include "textflag.h"

// AVX-512 kernels for im2col, col2im and max pooling over NHWC batches.
// The Fast methods in conv.go compute, for each output pixel, the flat
// element index of its window origin (which may lie outside the image when
// the window overlaps the padding) and a mask of the window positions that
// fall inside the image; the kernels touch only those positions.

DATA iota<>+0(SB)/4, $0
DATA iota<>+4(SB)/4, $1
DATA iota<>+8(SB)/4, $2
DATA iota<>+12(SB)/4, $3
DATA iota<>+16(SB)/4, $4
DATA iota<>+20(SB)/4, $5
DATA iota<>+24(SB)/4, $6
DATA iota<>+28(SB)/4, $7
DATA iota<>+32(SB)/4, $8
DATA iota<>+36(SB)/4, $9
DATA iota<>+40(SB)/4, $10
DATA iota<>+44(SB)/4, $11
DATA iota<>+48(SB)/4, $12
DATA iota<>+52(SB)/4, $13
DATA iota<>+56(SB)/4, $14
DATA iota<>+60(SB)/4, $15
GLOBL iota<>(SB), RODATA|NOPTR, $64

// LOWMASK(n, k) sets k to the low min(n, 16) bits; n in CX (≥ 0),
// clobbers AX and CX.
#define LOWMASK(k) \
	CMPQ  CX, $16   \
	JL    2(PC)     \
	MOVQ  $16, CX   \
	MOVQ  $1, AX    \
	SHLQ  CX, AX    \
	DECQ  AX        \
	KMOVW AX, k

// func im2colPixelAVX512(row, img *float32, origin int, offs *int32, mask uint32, kk, c int)
// row[ch·kk + t] = img[origin + offs[t] + ch] where mask bit t is set, else
// 0, for t < kk ≤ 32 and ch < c. offs holds 32 entries.
TEXT ·im2colPixelAVX512(SB), NOSPLIT, $0-56
	MOVQ      row+0(FP), DI
	MOVQ      img+8(FP), SI
	MOVQ      origin+16(FP), R8
	LEAQ      (SI)(R8*4), SI     // window origin (may be outside img)
	MOVQ      offs+24(FP), R9
	VMOVDQU32 (R9), Z30
	VMOVDQU32 64(R9), Z29
	MOVL      mask+32(FP), R10
	KMOVW     R10, K5
	SHRL      $16, R10
	KMOVW     R10, K6
	MOVQ      kk+40(FP), R11
	MOVQ      R11, CX
	LOWMASK(K3)                  // store mask, first 16
	MOVQ      R11, CX
	SUBQ      $16, CX
	JGE       2(PC)
	XORQ      CX, CX
	LOWMASK(K4)                  // store mask, next 16
	MOVQ      c+48(FP), R12
	SHLQ      $2, R11            // row stride per channel, bytes
	CMPQ      kk+40(FP), $16
	JG        i2c_two

i2c_one:
	TESTQ      R12, R12
	JE         i2c_done
	VPXORD     Z0, Z0, Z0
	KMOVW      K5, K1
	VPGATHERDD (SI)(Z30*4), K1, Z0
	VMOVDQU32  Z0, K3, (DI)
	ADDQ       $4, SI
	ADDQ       R11, DI
	DECQ       R12
	JMP        i2c_one

i2c_two:
	TESTQ      R12, R12
	JE         i2c_done
	VPXORD     Z0, Z0, Z0
	VPXORD     Z1, Z1, Z1
	KMOVW      K5, K1
	KMOVW      K6, K2
	VPGATHERDD (SI)(Z30*4), K1, Z0
	VPGATHERDD (SI)(Z29*4), K2, Z1
	VMOVDQU32  Z0, K3, (DI)
	VMOVDQU32  Z1, K4, 64(DI)
	ADDQ       $4, SI
	ADDQ       R11, DI
	DECQ       R12
	JMP        i2c_two

i2c_done:
	VZEROUPPER
	RET

// func col2imPixelAVX512(dx, row *float32, origin int, offs *int32, mask uint32, kk, c int)
// dx[origin + offs[t] + ch] += row[ch·kk + t] for every t < kk with mask bit
// t set and every ch < c: for each t, the c channel values are gathered
// from row (stride kk) and added to c contiguous elements of dx.
TEXT ·col2imPixelAVX512(SB), NOSPLIT, $0-56
	MOVQ         dx+0(FP), DI
	MOVQ         origin+16(FP), R8
	LEAQ         (DI)(R8*4), DI  // window origin in dx
	MOVQ         offs+24(FP), R9
	MOVL         mask+32(FP), R10
	MOVQ         kk+40(FP), R11
	MOVQ         c+48(FP), R12
	// Z28 = lane·kk: gather indices of 16 channels within a row.
	VPBROADCASTD R11, Z28
	VPMULLD      iota<>(SB), Z28, Z28
	// K4 = mask of the last (partial) block of 16 channels (unused if none).
	MOVQ         R12, CX
	ANDQ         $15, CX
	LOWMASK(K4)
	MOVQ         $-1, AX
	KMOVW        AX, K5          // all 16
	MOVQ         R11, R13
	SHLQ         $6, R13         // 16 channels of row, bytes
	XORQ         BX, BX          // t

c2i_t:
	CMPQ    BX, R11
	JGE     c2i_done
	BTL     BX, R10
	JCC     c2i_next
	MOVLQSX (R9)(BX*4), AX
	LEAQ    (DI)(AX*4), DX       // dx + offs[t] (window origin applied)
	MOVQ    row+8(FP), SI
	LEAQ    (SI)(BX*4), SI       // row + t
	MOVQ    R12, CX              // channels left

c2i_c:
	CMPQ       CX, $16
	JL         c2i_ctail
	KMOVW      K5, K1
	VPXORD     Z0, Z0, Z0
	VPGATHERDD (SI)(Z28*4), K1, Z0
	VADDPS     (DX), Z0, Z0
	VMOVUPS    Z0, (DX)
	ADDQ       $64, DX
	ADDQ       R13, SI
	SUBQ       $16, CX
	JMP        c2i_c

c2i_ctail:
	TESTQ      CX, CX
	JE         c2i_next
	KMOVW      K4, K1
	VPXORD     Z0, Z0, Z0
	VPGATHERDD (SI)(Z28*4), K1, Z0
	VADDPS.Z   (DX), Z0, K4, Z0
	VMOVUPS    Z0, K4, (DX)

c2i_next:
	INCQ BX
	JMP  c2i_t

c2i_done:
	VZEROUPPER
	RET

// func maxPoolRowAVX512(y *float32, arg *int32, x *float32, base, step, npix int, offs *int32, kk, c int)
// For npix output pixels whose windows start at flat indices base,
// base+step, …: y[p·c + ch] = the first maximum of x[o + offs[t] + ch] over
// t < kk (window order), arg = its flat index o + offs[t] + ch. Strictly
// greater values replace the running maximum, so a NaN first element stays.
TEXT ·maxPoolRowAVX512(SB), NOSPLIT, $0-72
	MOVQ      y+0(FP), DI
	MOVQ      arg+8(FP), SI
	MOVQ      x+16(FP), DX
	MOVQ      base+24(FP), R8
	MOVQ      npix+40(FP), R9
	MOVQ      offs+48(FP), R10
	MOVQ      kk+56(FP), R11
	MOVQ      c+64(FP), R12
	VMOVDQU32 iota<>(SB), Z31
	MOVQ      R12, CX
	ANDQ      $15, CX
	LOWMASK(K4)
	MOVQ      $-1, AX
	KMOVW     AX, K5

mp_pix:
	TESTQ R9, R9
	JE    mp_done
	XORQ R13, R13                // ch

mp_c:
	MOVQ R12, CX
	SUBQ R13, CX                 // channels left
	JLE  mp_pixnext
	KMOVW K5, K3
	CMPQ CX, $16
	JGE  2(PC)
	KMOVW K4, K3
	// t = 0 starts the running maximum.
	MOVLQSX      (R10), AX
	ADDQ         R8, AX
	ADDQ         R13, AX         // o + offs[0] + ch
	VMOVUPS.Z    (DX)(AX*4), K3, Z0
	VPBROADCASTD AX, Z1
	VPADDD       Z31, Z1, Z1
	MOVQ         $1, BX

mp_t:
	CMPQ         BX, R11
	JGE          mp_store
	MOVLQSX      (R10)(BX*4), AX
	ADDQ         R8, AX
	ADDQ         R13, AX
	VMOVUPS.Z    (DX)(AX*4), K3, Z2
	VCMPPS       $0x1e, Z0, Z2, K3, K1 // x > max (ordered)
	VMOVAPS      Z2, K1, Z0
	VPBROADCASTD AX, Z3
	VPADDD       Z31, Z3, K1, Z1
	INCQ         BX
	JMP          mp_t

mp_store:
	VMOVUPS   Z0, K3, (DI)
	VMOVDQU32 Z1, K3, (SI)
	ADDQ      $64, DI
	ADDQ      $64, SI
	ADDQ      $16, R13
	JMP       mp_c

mp_pixnext:
	// y and arg advanced by whole blocks; step back the overshoot.
	MOVQ R12, AX
	ADDQ $15, AX
	ANDQ $-16, AX
	SUBQ R12, AX
	SHLQ $2, AX
	SUBQ AX, DI
	SUBQ AX, SI
	ADDQ step+32(FP), R8
	DECQ R9
	JMP  mp_pix

mp_done:
	VZEROUPPER
	RET
