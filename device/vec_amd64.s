//go:build amd64 && !purego

#include "textflag.h"

// AVX-512 elementwise kernels. Each processes 64 or 16 floats per step and
// finishes with one masked step, so no element outside [0, n) is read or
// written. Callers (vec_amd64.go) check slice lengths first.

// TAIL sets K1 to the low CX bits (0 < CX < 16); clobbers AX.
#define TAIL \
	MOVQ $1, AX \
	SHLQ CX, AX \
	DECQ AX     \
	KMOVW AX, K1

// LOAD4(p) loads the 64 values at p into Z0–Z3; FMA4 adds Z31 times the
// 64 values at SI to them; STORE4(p) stores them at p: the 64-value step
// of the axpy kernels.
#define LOAD4(p) \
	VMOVUPS (p), Z0    \
	VMOVUPS 64(p), Z1  \
	VMOVUPS 128(p), Z2 \
	VMOVUPS 192(p), Z3

#define FMA4 \
	VFMADD231PS (SI), Z31, Z0    \
	VFMADD231PS 64(SI), Z31, Z1  \
	VFMADD231PS 128(SI), Z31, Z2 \
	VFMADD231PS 192(SI), Z31, Z3

#define STORE4(p) \
	VMOVUPS Z0, (p)    \
	VMOVUPS Z1, 64(p)  \
	VMOVUPS Z2, 128(p) \
	VMOVUPS Z3, 192(p)

// func axpyAVX512(alpha float32, x, y *float32, n int)
TEXT ·axpyAVX512(SB), NOSPLIT, $0-32
	VBROADCASTSS alpha+0(FP), Z31
	MOVQ x+8(FP), SI
	MOVQ y+16(FP), DI
	MOVQ n+24(FP), CX
	CMPQ CX, $64
	JL   axpy_16

axpy_64:
	LOAD4(DI)
	FMA4
	STORE4(DI)
	ADDQ        $256, SI
	ADDQ        $256, DI
	SUBQ        $64, CX
	CMPQ        CX, $64
	JGE         axpy_64

axpy_16:
	CMPQ        CX, $16
	JL          axpy_tail
	VMOVUPS     (DI), Z0
	VFMADD231PS (SI), Z31, Z0
	VMOVUPS     Z0, (DI)
	ADDQ        $64, SI
	ADDQ        $64, DI
	SUBQ        $16, CX
	JMP         axpy_16

axpy_tail:
	TESTQ       CX, CX
	JE          axpy_done
	TAIL
	VMOVUPS.Z   (DI), K1, Z0
	VMOVUPS.Z   (SI), K1, Z1
	VFMADD231PS Z1, Z31, Z0
	VMOVUPS     Z0, K1, (DI)

axpy_done:
	VZEROUPPER
	RET

// func scaleAVX512(alpha float32, x *float32, n int)
TEXT ·scaleAVX512(SB), NOSPLIT, $0-24
	VBROADCASTSS alpha+0(FP), Z31
	MOVQ x+8(FP), DI
	MOVQ n+16(FP), CX
	CMPQ CX, $64
	JL   scale_16

scale_64:
	VMULPS  (DI), Z31, Z0
	VMULPS  64(DI), Z31, Z1
	VMULPS  128(DI), Z31, Z2
	VMULPS  192(DI), Z31, Z3
	VMOVUPS Z0, (DI)
	VMOVUPS Z1, 64(DI)
	VMOVUPS Z2, 128(DI)
	VMOVUPS Z3, 192(DI)
	ADDQ    $256, DI
	SUBQ    $64, CX
	CMPQ    CX, $64
	JGE     scale_64

scale_16:
	CMPQ    CX, $16
	JL      scale_tail
	VMULPS  (DI), Z31, Z0
	VMOVUPS Z0, (DI)
	ADDQ    $64, DI
	SUBQ    $16, CX
	JMP     scale_16

scale_tail:
	TESTQ     CX, CX
	JE        scale_done
	TAIL
	VMOVUPS.Z (DI), K1, Z0
	VMULPS    Z0, Z31, Z0
	VMOVUPS   Z0, K1, (DI)

scale_done:
	VZEROUPPER
	RET

// HSUMPD reduces the 8 doubles of Z0 into X0; clobbers Z1.
#define HSUMPD \
	VEXTRACTF64X4 $1, Z0, Y1 \
	VADDPD        Y1, Y0, Y0 \
	VEXTRACTF128  $1, Y0, X1 \
	VADDPD        X1, X0, X0 \
	VPERMILPD     $1, X0, X1 \
	VADDSD        X1, X0, X0

// func dotAVX512(x, y *float32, n int) float64
// Products of float32 values are exact in float64; the sum runs in float64
// over eight lanes and four accumulators.
TEXT ·dotAVX512(SB), NOSPLIT, $0-32
	MOVQ   x+0(FP), SI
	MOVQ   y+8(FP), DI
	MOVQ   n+16(FP), CX
	VPXORQ Z0, Z0, Z0
	VPXORQ Z1, Z1, Z1
	VPXORQ Z2, Z2, Z2
	VPXORQ Z3, Z3, Z3
	CMPQ   CX, $32
	JL     dot_8

dot_32:
	VCVTPS2PD   (SI), Z4
	VCVTPS2PD   32(SI), Z5
	VCVTPS2PD   64(SI), Z6
	VCVTPS2PD   96(SI), Z7
	VCVTPS2PD   (DI), Z8
	VCVTPS2PD   32(DI), Z9
	VCVTPS2PD   64(DI), Z10
	VCVTPS2PD   96(DI), Z11
	VFMADD231PD Z8, Z4, Z0
	VFMADD231PD Z9, Z5, Z1
	VFMADD231PD Z10, Z6, Z2
	VFMADD231PD Z11, Z7, Z3
	ADDQ        $128, SI
	ADDQ        $128, DI
	SUBQ        $32, CX
	CMPQ        CX, $32
	JGE         dot_32

dot_8:
	CMPQ        CX, $8
	JL          dot_tail
	VCVTPS2PD   (SI), Z4
	VCVTPS2PD   (DI), Z8
	VFMADD231PD Z8, Z4, Z0
	ADDQ        $32, SI
	ADDQ        $32, DI
	SUBQ        $8, CX
	JMP         dot_8

dot_tail:
	TESTQ       CX, CX
	JE          dot_sum
	TAIL
	VCVTPS2PD.Z (SI), K1, Z4
	VCVTPS2PD.Z (DI), K1, Z8
	VFMADD231PD Z8, Z4, Z0

dot_sum:
	VADDPD Z1, Z0, Z0
	VADDPD Z3, Z2, Z2
	VADDPD Z2, Z0, Z0
	HSUMPD
	MOVSD  X0, ret+24(FP)
	VZEROUPPER
	RET

// func sumSquaresAVX512(x *float32, n int) float64
TEXT ·sumSquaresAVX512(SB), NOSPLIT, $0-24
	MOVQ   x+0(FP), SI
	MOVQ   n+8(FP), CX
	VPXORQ Z0, Z0, Z0
	VPXORQ Z1, Z1, Z1
	VPXORQ Z2, Z2, Z2
	VPXORQ Z3, Z3, Z3
	CMPQ   CX, $32
	JL     ss_8

ss_32:
	VCVTPS2PD   (SI), Z4
	VCVTPS2PD   32(SI), Z5
	VCVTPS2PD   64(SI), Z6
	VCVTPS2PD   96(SI), Z7
	VFMADD231PD Z4, Z4, Z0
	VFMADD231PD Z5, Z5, Z1
	VFMADD231PD Z6, Z6, Z2
	VFMADD231PD Z7, Z7, Z3
	ADDQ        $128, SI
	SUBQ        $32, CX
	CMPQ        CX, $32
	JGE         ss_32

ss_8:
	CMPQ        CX, $8
	JL          ss_tail
	VCVTPS2PD   (SI), Z4
	VFMADD231PD Z4, Z4, Z0
	ADDQ        $32, SI
	SUBQ        $8, CX
	JMP         ss_8

ss_tail:
	TESTQ       CX, CX
	JE          ss_sum
	TAIL
	VCVTPS2PD.Z (SI), K1, Z4
	VFMADD231PD Z4, Z4, Z0

ss_sum:
	VADDPD Z1, Z0, Z0
	VADDPD Z3, Z2, Z2
	VADDPD Z2, Z0, Z0
	HSUMPD
	MOVSD  X0, ret+16(FP)
	VZEROUPPER
	RET

// func weightedSumAVX512(dst *float32, srcs *[]float32, w *float32, nsrc, n int)
// dst[i] = Σ_j w[j]·srcs[j][i]; nsrc ≥ 1. dst is written once, each source
// read once: the accumulators hold 64 floats of dst across all sources.
TEXT ·weightedSumAVX512(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ srcs+8(FP), R8
	MOVQ w+16(FP), R11
	MOVQ nsrc+24(FP), DX
	MOVQ n+32(FP), CX
	XORQ BX, BX

ws_64:
	CMPQ         CX, $64
	JL           ws_16
	MOVQ         R8, R9
	MOVQ         R11, R10
	MOVQ         DX, R12
	MOVQ         (R9), AX
	VBROADCASTSS (R10), Z31
	VMULPS       (AX)(BX*1), Z31, Z0
	VMULPS       64(AX)(BX*1), Z31, Z1
	VMULPS       128(AX)(BX*1), Z31, Z2
	VMULPS       192(AX)(BX*1), Z31, Z3

ws_64_src:
	DECQ         R12
	JE           ws_64_store
	ADDQ         $24, R9
	ADDQ         $4, R10
	MOVQ         (R9), AX
	VBROADCASTSS (R10), Z31
	VFMADD231PS  (AX)(BX*1), Z31, Z0
	VFMADD231PS  64(AX)(BX*1), Z31, Z1
	VFMADD231PS  128(AX)(BX*1), Z31, Z2
	VFMADD231PS  192(AX)(BX*1), Z31, Z3
	JMP          ws_64_src

ws_64_store:
	VMOVUPS Z0, (DI)(BX*1)
	VMOVUPS Z1, 64(DI)(BX*1)
	VMOVUPS Z2, 128(DI)(BX*1)
	VMOVUPS Z3, 192(DI)(BX*1)
	ADDQ    $256, BX
	SUBQ    $64, CX
	JMP     ws_64

ws_16:
	TESTQ CX, CX
	JE    ws_done
	MOVQ  $-1, AX
	KMOVW AX, K1
	CMPQ  CX, $16
	JGE   ws_16_go
	TAIL

ws_16_go:
	MOVQ           R8, R9
	MOVQ           R11, R10
	MOVQ           DX, R12
	MOVQ           (R9), AX
	VBROADCASTSS   (R10), Z31
	VMOVUPS.Z      (AX)(BX*1), K1, Z0
	VMULPS         Z0, Z31, Z0

ws_16_src:
	DECQ         R12
	JE           ws_16_store
	ADDQ         $24, R9
	ADDQ         $4, R10
	MOVQ         (R9), AX
	VBROADCASTSS (R10), Z31
	VMOVUPS.Z    (AX)(BX*1), K1, Z1
	VFMADD231PS  Z1, Z31, Z0
	JMP          ws_16_src

ws_16_store:
	VMOVUPS Z0, K1, (DI)(BX*1)
	ADDQ    $64, BX
	SUBQ    $16, CX
	JG      ws_16

ws_done:
	VZEROUPPER
	RET

// func biasRowsAVX512(x, bias *float32, rows, cols int, relu bool)
// x[r, :] = max(x[r, :] + bias, floor) with floor = 0 if relu, else −Inf
// (so that without relu the max is the identity, NaN included). cols ≥ 16:
// a ragged row end is done as one unmasked vector over the row's last 16
// elements, loaded before and stored after the rest of the row, so no
// masked store ever overlaps the next row's loads.
TEXT ·biasRowsAVX512(SB), NOSPLIT, $0-33
	MOVQ         x+0(FP), DI
	MOVQ         bias+8(FP), SI
	MOVQ         rows+16(FP), R8
	MOVQ         cols+24(FP), DX
	MOVL         $0xff800000, AX
	CMPB         relu+32(FP), $0
	JE           2(PC)
	XORL         AX, AX
	VPBROADCASTD AX, Z30
	LEAQ         -64(SI)(DX*4), R10 // last 16 of bias
	MOVQ         DX, R11
	ANDQ         $15, R11           // ragged?
	MOVQ         DX, R12
	SHLQ         $2, R12            // row bytes
	TESTQ        R8, R8
	JE           br_done

br_row:
	MOVQ    DI, R9 // row start
	TESTQ   R11, R11
	JE      br_full
	VMOVUPS -64(DI)(R12*1), Z2
	VADDPS  (R10), Z2, Z2
	VMAXPS  Z2, Z30, Z2

br_full:
	MOVQ SI, BX
	MOVQ DX, CX

br_16:
	CMPQ    CX, $16
	JL      br_end
	VMOVUPS (DI), Z0
	VADDPS  (BX), Z0, Z0
	VMAXPS  Z0, Z30, Z0
	VMOVUPS Z0, (DI)
	ADDQ    $64, BX
	ADDQ    $64, DI
	SUBQ    $16, CX
	JMP     br_16

br_end:
	LEAQ    (R9)(R12*1), DI
	TESTQ   R11, R11
	JE      br_next
	VMOVUPS Z2, -64(DI)

br_next:
	DECQ R8
	JNE  br_row

br_done:
	VZEROUPPER
	RET

// func reluAVX512(y, x *float32, n int)
TEXT ·reluAVX512(SB), NOSPLIT, $0-24
	MOVQ   y+0(FP), DI
	MOVQ   x+8(FP), SI
	MOVQ   n+16(FP), CX
	VPXORD Z30, Z30, Z30

relu_16:
	CMPQ    CX, $16
	JL      relu_tail
	VMOVUPS (SI), Z0
	VMAXPS  Z0, Z30, Z0
	VMOVUPS Z0, (DI)
	ADDQ    $64, SI
	ADDQ    $64, DI
	SUBQ    $16, CX
	JMP     relu_16

relu_tail:
	TESTQ     CX, CX
	JE        relu_done
	TAIL
	VMOVUPS.Z (SI), K1, Z0
	VMAXPS    Z0, Z30, Z0
	VMOVUPS   Z0, K1, (DI)

relu_done:
	VZEROUPPER
	RET

// func reluBackwardAVX512(dx, dy, y *float32, n int)
// dx = dy where !(y <= 0), 0 elsewhere (a NaN y passes dy, as on CPU).
TEXT ·reluBackwardAVX512(SB), NOSPLIT, $0-32
	MOVQ   dx+0(FP), DI
	MOVQ   dy+8(FP), SI
	MOVQ   y+16(FP), DX
	MOVQ   n+24(FP), CX
	VPXORD Z30, Z30, Z30

rb_16:
	CMPQ      CX, $16
	JL        rb_tail
	VCMPPS    $0x19, (DX), Z30, K2   // !(0 >= y): y > 0 or NaN, as the CPU backend
	VMOVUPS.Z (SI), K2, Z0
	VMOVUPS   Z0, (DI)
	ADDQ      $64, SI
	ADDQ      $64, DI
	ADDQ      $64, DX
	SUBQ      $16, CX
	JMP       rb_16

rb_tail:
	TESTQ     CX, CX
	JE        rb_done
	TAIL
	VMOVUPS.Z (DX), K1, Z1
	VCMPPS    $0x16, Z30, Z1, K1, K2 // !(y <= 0)
	VMOVUPS.Z (SI), K2, Z0
	VMOVUPS   Z0, K1, (DI)

rb_done:
	VZEROUPPER
	RET

// func sumRowsAVX512(dst, x *float32, rows, cols int)
// dst[j] += Σ_i x[i·cols + j], 16 columns at a time down the rows with
// four accumulators.
TEXT ·sumRowsAVX512(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ rows+16(FP), R8
	MOVQ cols+24(FP), DX
	MOVQ DX, R10
	SHLQ $2, R10         // row stride in bytes
	MOVQ DX, CX          // columns left

sr_chunk:
	TESTQ CX, CX
	JE    sr_done
	MOVQ  $-1, AX
	KMOVW AX, K1
	CMPQ  CX, $16
	JGE   sr_go
	TAIL

sr_go:
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	MOVQ   SI, R11
	MOVQ   R8, R9
	LEAQ   (R10)(R10*2), R12  // 3 rows

sr_rows4:
	CMPQ     R9, $4
	JL       sr_rows1
	VADDPS.Z (R11), Z0, K1, Z0
	VADDPS.Z (R11)(R10*1), Z1, K1, Z1
	VADDPS.Z (R11)(R10*2), Z2, K1, Z2
	VADDPS.Z (R11)(R12*1), Z3, K1, Z3
	LEAQ     (R11)(R10*4), R11
	SUBQ     $4, R9
	JMP      sr_rows4

sr_rows1:
	TESTQ    R9, R9
	JE       sr_store
	VADDPS.Z (R11), Z0, K1, Z0
	ADDQ     R10, R11
	DECQ     R9
	JMP      sr_rows1

sr_store:
	VADDPS  Z1, Z0, Z0
	VADDPS  Z3, Z2, Z2
	VADDPS  Z2, Z0, Z0
	VADDPS.Z (DI), Z0, K1, Z0
	VMOVUPS Z0, K1, (DI)
	ADDQ    $64, DI
	ADDQ    $64, SI
	SUBQ    $16, CX
	JG      sr_chunk

sr_done:
	VZEROUPPER
	RET

// func sgdAVX512(w, grad, buf *float32, n int, lr, mu, wd float32, nesterov bool)
// d = g + wd·w; with mu ≠ 0: buf = mu·buf + d, d = nesterov ? d + mu·buf : buf;
// then w -= lr·d.
TEXT ·sgdAVX512(SB), NOSPLIT, $0-45
	MOVQ         w+0(FP), DI
	MOVQ         grad+8(FP), SI
	MOVQ         buf+16(FP), DX
	MOVQ         n+24(FP), CX
	VBROADCASTSS lr+32(FP), Z28
	VBROADCASTSS mu+36(FP), Z29
	VBROADCASTSS wd+40(FP), Z30
	MOVBLZX      nesterov+44(FP), R9
	MOVL         mu+36(FP), R8
	MOVQ         $-1, AX
	KMOVW        AX, K1

sgd_loop:
	TESTQ CX, CX
	JE    sgd_done
	CMPQ  CX, $16
	JGE   sgd_go
	TAIL

sgd_go:
	VMOVUPS.Z   (DI), K1, Z0    // w
	VMOVUPS.Z   (SI), K1, Z1    // d = g
	VFMADD231PS Z0, Z30, Z1     // d += wd·w
	TESTL       R8, R8
	JE          sgd_apply
	VMOVUPS.Z   (DX), K1, Z2    // buf
	VFMADD213PS Z1, Z29, Z2     // buf = mu·buf + d
	VMOVUPS     Z2, K1, (DX)
	TESTQ       R9, R9
	JE          sgd_plain
	VFMADD231PS Z2, Z29, Z1     // d += mu·buf
	JMP         sgd_apply

sgd_plain:
	VMOVAPS Z2, Z1

sgd_apply:
	VFNMADD231PS Z1, Z28, Z0    // w -= lr·d
	VMOVUPS      Z0, K1, (DI)
	ADDQ         $64, DI
	ADDQ         $64, SI
	ADDQ         $64, DX
	SUBQ         $16, CX
	JG           sgd_loop

sgd_done:
	VZEROUPPER
	RET

// func adamAVX512(w, grad, m, v *float32, n int, p *adamParams)
TEXT ·adamAVX512(SB), NOSPLIT, $0-48
	MOVQ         w+0(FP), DI
	MOVQ         grad+8(FP), SI
	MOVQ         m+16(FP), DX
	MOVQ         v+24(FP), R10
	MOVQ         n+32(FP), CX
	MOVQ         p+40(FP), R11
	VBROADCASTSS 0(R11), Z20  // beta1
	VBROADCASTSS 4(R11), Z21  // 1 - beta1
	VBROADCASTSS 8(R11), Z22  // beta2
	VBROADCASTSS 12(R11), Z23 // 1 - beta2
	VBROADCASTSS 16(R11), Z24 // 1 / sqrt(bias correction 2)
	VBROADCASTSS 20(R11), Z25 // eps
	VBROADCASTSS 24(R11), Z26 // step = lr / bias correction 1
	VBROADCASTSS 28(R11), Z27 // wd (L2, added to the gradient)
	VBROADCASTSS 32(R11), Z28 // lr·wd (decoupled, applied to w)
	MOVQ         $-1, AX
	KMOVW        AX, K1

adam_loop:
	TESTQ CX, CX
	JE    adam_done
	CMPQ  CX, $16
	JGE   adam_go
	TAIL

adam_go:
	VMOVUPS.Z    (DI), K1, Z0   // w
	VMOVUPS.Z    (SI), K1, Z1   // g
	VFMADD231PS  Z0, Z27, Z1    // g += wd·w
	VFNMADD231PS Z0, Z28, Z0    // w -= lr·wd·w
	VMULPS.Z     (DX), Z20, K1, Z2 // m·beta1
	VFMADD231PS  Z1, Z21, Z2    // m = beta1·m + (1-beta1)·g
	VMULPS       Z1, Z1, Z3     // g²
	VMULPS.Z     (R10), Z22, K1, Z4 // v·beta2
	VFMADD231PS  Z3, Z23, Z4    // v = beta2·v + (1-beta2)·g²
	VMOVUPS      Z2, K1, (DX)
	VMOVUPS      Z4, K1, (R10)
	VSQRTPS      Z4, Z5
	VFMADD213PS  Z25, Z24, Z5   // sqrt(v)/sqrt(bc2) + eps
	VDIVPS       Z5, Z2, Z6     // m / denom
	VFNMADD231PS Z6, Z26, Z0    // w -= step·m/denom
	VMOVUPS      Z0, K1, (DI)
	ADDQ         $64, DI
	ADDQ         $64, SI
	ADDQ         $64, DX
	ADDQ         $64, R10
	SUBQ         $16, CX
	JG           adam_loop

adam_done:
	VZEROUPPER
	RET

// CONST broadcasts the float32 with bit pattern bits into reg; clobbers AX.
#define CONST(bits, reg) \
	MOVL         bits, AX \
	VPBROADCASTD AX, reg

// EXPCONSTS loads the constants EXP uses into Z21..Z31 (clobbers AX):
// ln(FLT_MIN), log2(e), ln 2 in a high and a low part, the polynomial's
// coefficients of degree 7 down to 2 (the last is 0.5), and 1.
#define EXPCONSTS \
	CONST($0xc2aeac4f, Z21) \
	CONST($0x3fb8aa3b, Z22) \
	CONST($0x3f318000, Z23) \
	CONST($0xb95e8083, Z24) \
	CONST($0x39506967, Z25) \
	CONST($0x3ab743ce, Z26) \
	CONST($0x3c088908, Z27) \
	CONST($0x3d2aa9c1, Z28) \
	CONST($0x3e2aaaaa, Z29) \
	CONST($0x3f000000, Z30) \
	CONST($0x3f800000, Z31)

// EXP sets Z1 = exp(Z1) lane-wise (Cephes expf: range reduction by ln 2 in
// two parts, degree-7 polynomial, VSCALEFPS for 2^n; about 1 ulp). Inputs
// are clamped below at ln(FLT_MIN) so the result never underflows to a
// subnormal; NaN propagates. Uses the constants in Z21..Z31; clobbers Z2..Z4.
#define EXP \
	VMAXPS       Z1, Z21, Z1 \
	VMULPS       Z22, Z1, Z2 \
	VRNDSCALEPS  $0, Z2, Z2  \
	VFNMADD231PS Z2, Z23, Z1 \
	VFNMADD231PS Z2, Z24, Z1 \
	VMOVAPS      Z25, Z3     \
	VFMADD213PS  Z26, Z1, Z3 \
	VFMADD213PS  Z27, Z1, Z3 \
	VFMADD213PS  Z28, Z1, Z3 \
	VFMADD213PS  Z29, Z1, Z3 \
	VFMADD213PS  Z30, Z1, Z3 \
	VMULPS       Z1, Z1, Z4  \
	VFMADD213PS  Z1, Z4, Z3  \
	VADDPS       Z31, Z3, Z3 \
	VSCALEFPS    Z2, Z3, Z1

// HREDUCE(op, z, t) leaves op over all 16 lanes of z in every lane of z.
#define HREDUCE(op, z, t) \
	VSHUFF32X4 $0x4e, z, z, t \
	op         t, z, z        \
	VSHUFF32X4 $0xb1, z, z, t \
	op         t, z, z        \
	VPERMILPS  $0x4e, z, t    \
	op         t, z, z        \
	VPERMILPS  $0xb1, z, t    \
	op         t, z, z

// func softmaxRowAVX512(grad, z *float32, cols int, scale float32) (mx, sum float32, arg int)
// For one row of cols ≥ 1 logits: mx = max z, arg = the first index of mx
// (−1 if none, i.e. NaN), sum = Σ exp(z − mx), grad = scale·exp(z − mx)/sum.
// grad may be z: each chunk is read before it is written.
TEXT ·softmaxRowAVX512(SB), NOSPLIT, $0-48
	MOVQ z+8(FP), SI
	MOVQ cols+16(FP), DX
	CONST($0xff800000, Z16) // −Inf

	// Pass 1: the maximum, into every lane of Z0.
	VMOVAPS Z16, Z0
	MOVQ    SI, R8
	MOVQ    DX, CX

sm_max16:
	CMPQ   CX, $16
	JL     sm_maxtail
	VMAXPS (R8), Z0, Z0
	ADDQ   $64, R8
	SUBQ   $16, CX
	JMP    sm_max16

sm_maxtail:
	TESTQ   CX, CX
	JE      sm_maxred
	TAIL
	VMOVAPS Z16, Z1
	VMOVUPS (R8), K1, Z1
	VMAXPS  Z1, Z0, Z0

sm_maxred:
	HREDUCE(VMAXPS, Z0, Z1)

	// Pass 2: the first index equal to the maximum.
	MOVQ SI, R8
	MOVQ DX, CX
	XORQ R9, R9

sm_arg16:
	CMPQ   CX, $16
	JL     sm_argtail
	VCMPPS $0, (R8), Z0, K2
	KMOVW  K2, AX
	TESTL  AX, AX
	JNE    sm_found
	ADDQ   $64, R8
	ADDQ   $16, R9
	SUBQ   $16, CX
	JMP    sm_arg16

sm_argtail:
	TESTQ  CX, CX
	JE     sm_none
	TAIL
	VCMPPS $0, (R8), Z0, K1, K2
	KMOVW  K2, AX
	TESTL  AX, AX
	JNE    sm_found

sm_none:
	MOVQ $-1, R9
	JMP  sm_argdone

sm_found:
	TZCNTL AX, AX
	ADDQ   AX, R9

sm_argdone:
	MOVQ R9, arg+40(FP)

	// Pass 3: g = exp(z − mx), summed into Z20.
	EXPCONSTS
	VPXORD Z20, Z20, Z20
	MOVQ   SI, R8
	MOVQ   grad+0(FP), DI
	MOVQ   DI, R10
	MOVQ   DX, CX

sm_exp16:
	CMPQ    CX, $16
	JL      sm_exptail
	VMOVUPS (R8), Z1
	VSUBPS  Z0, Z1, Z1
	EXP
	VADDPS  Z1, Z20, Z20
	VMOVUPS Z1, (R10)
	ADDQ    $64, R8
	ADDQ    $64, R10
	SUBQ    $16, CX
	JMP     sm_exp16

sm_exptail:
	TESTQ     CX, CX
	JE        sm_sum
	TAIL
	VMOVUPS.Z (R8), K1, Z1
	VSUBPS    Z0, Z1, Z1
	EXP
	VADDPS    Z1, Z20, K1, Z20
	VMOVUPS   Z1, K1, (R10)

sm_sum:
	HREDUCE(VADDPS, Z20, Z1)
	VBROADCASTSS scale+24(FP), Z5
	VDIVPS       Z20, Z5, Z5 // scale / sum

	// Pass 4: g *= scale/sum.
	MOVQ DI, R10
	MOVQ DX, CX

sm_scale16:
	CMPQ    CX, $16
	JL      sm_scaletail
	VMULPS  (R10), Z5, Z1
	VMOVUPS Z1, (R10)
	ADDQ    $64, R10
	SUBQ    $16, CX
	JMP     sm_scale16

sm_scaletail:
	TESTQ     CX, CX
	JE        sm_done
	TAIL
	VMULPS.Z  (R10), Z5, K1, Z1
	VMOVUPS   Z1, K1, (R10)

sm_done:
	MOVSS X0, mx+32(FP)
	VMOVSS X20, sum+36(FP)
	VZEROUPPER
	RET

// func nonFiniteAVX512(x *float32, n int) bool
// reports whether some x[i] is NaN or ±Inf: its exponent bits all ones.
TEXT ·nonFiniteAVX512(SB), NOSPLIT, $0-17
	MOVL         $0x7f800000, AX
	VPBROADCASTD AX, Z31
	MOVQ         x+0(FP), SI
	MOVQ         n+8(FP), CX
	KXORW        K2, K2, K2
	CMPQ         CX, $64
	JL           fin_16

fin_64:
	VPANDD   (SI), Z31, Z0
	VPANDD   64(SI), Z31, Z1
	VPANDD   128(SI), Z31, Z2
	VPANDD   192(SI), Z31, Z3
	VPCMPEQD Z31, Z0, K3
	VPCMPEQD Z31, Z1, K4
	VPCMPEQD Z31, Z2, K5
	VPCMPEQD Z31, Z3, K6
	KORW     K3, K4, K3
	KORW     K5, K6, K5
	KORW     K3, K5, K3
	KORW     K2, K3, K2
	ADDQ     $256, SI
	SUBQ     $64, CX
	CMPQ     CX, $64
	JGE      fin_64

fin_16:
	CMPQ     CX, $16
	JL       fin_tail
	VPANDD   (SI), Z31, Z0
	VPCMPEQD Z31, Z0, K3
	KORW     K2, K3, K2
	ADDQ     $64, SI
	SUBQ     $16, CX
	JMP      fin_16

fin_tail:
	TESTQ       CX, CX
	JE          fin_done
	TAIL
	VMOVDQU32.Z (SI), K1, Z0
	VPANDD      Z0, Z31, Z0
	VPCMPEQD    Z31, Z0, K3
	KORW        K2, K3, K2

fin_done:
	KORTESTW K2, K2
	SETNE    ret+16(FP)
	VZEROUPPER
	RET

// func divFiniteAVX512(x *float32, d float64, n int) (bad bool)
// sets x[i] = float32(float64(x[i]) / d), 16 values a step: widened to
// float64 (exact), divided (correctly rounded, as Go's /), narrowed with
// MXCSR's rounding (as Go's conversion); K2 gathers the non-finite.
TEXT ·divFiniteAVX512(SB), NOSPLIT, $0-25
	VBROADCASTSD d+8(FP), Z30
	MOVL         $0x7f800000, AX
	VPBROADCASTD AX, Z31
	MOVQ         x+0(FP), SI
	MOVQ         n+16(FP), CX
	KXORW        K2, K2, K2
	TESTQ        CX, CX
	JE           div_done

div_16:
	VCVTPS2PD (SI), Z0
	VCVTPS2PD 32(SI), Z1
	VDIVPD    Z30, Z0, Z0
	VDIVPD    Z30, Z1, Z1
	VCVTPD2PS Z0, Y0
	VCVTPD2PS Z1, Y1
	VMOVUPS   Y0, (SI)
	VMOVUPS   Y1, 32(SI)
	VPANDD    Y0, Y31, Y2
	VPANDD    Y1, Y31, Y3
	VPCMPEQD  Y31, Y2, K3
	VPCMPEQD  Y31, Y3, K4
	KORW      K3, K4, K3
	KORW      K2, K3, K2
	ADDQ      $64, SI
	SUBQ      $16, CX
	JNE       div_16

div_done:
	KORTESTW K2, K2
	SETNE    bad+24(FP)
	VZEROUPPER
	RET

// func minMaxAVX512(a, b *float32, n int)
// sets a[i], b[i] to the smaller and the larger of the two.
TEXT ·minMaxAVX512(SB), NOSPLIT, $0-24
	MOVQ a+0(FP), SI
	MOVQ b+8(FP), DI
	MOVQ n+16(FP), CX

mm_64:
	CMPQ    CX, $64
	JL      mm_16
	VMOVUPS (SI), Z0
	VMOVUPS 64(SI), Z1
	VMOVUPS 128(SI), Z2
	VMOVUPS 192(SI), Z3
	VMOVUPS (DI), Z4
	VMOVUPS 64(DI), Z5
	VMOVUPS 128(DI), Z6
	VMOVUPS 192(DI), Z7
	VMINPS  Z4, Z0, Z8
	VMINPS  Z5, Z1, Z9
	VMINPS  Z6, Z2, Z10
	VMINPS  Z7, Z3, Z11
	VMAXPS  Z4, Z0, Z4
	VMAXPS  Z5, Z1, Z5
	VMAXPS  Z6, Z2, Z6
	VMAXPS  Z7, Z3, Z7
	VMOVUPS Z8, (SI)
	VMOVUPS Z9, 64(SI)
	VMOVUPS Z10, 128(SI)
	VMOVUPS Z11, 192(SI)
	VMOVUPS Z4, (DI)
	VMOVUPS Z5, 64(DI)
	VMOVUPS Z6, 128(DI)
	VMOVUPS Z7, 192(DI)
	ADDQ    $256, SI
	ADDQ    $256, DI
	SUBQ    $64, CX
	JMP     mm_64

mm_16:
	CMPQ    CX, $16
	JL      mm_tail
	VMOVUPS (SI), Z0
	VMOVUPS (DI), Z1
	VMINPS  Z1, Z0, Z2
	VMAXPS  Z1, Z0, Z1
	VMOVUPS Z2, (SI)
	VMOVUPS Z1, (DI)
	ADDQ    $64, SI
	ADDQ    $64, DI
	SUBQ    $16, CX
	JMP     mm_16

mm_tail:
	TESTQ     CX, CX
	JE        mm_done
	TAIL
	VMOVUPS.Z (SI), K1, Z0
	VMOVUPS.Z (DI), K1, Z1
	VMINPS    Z1, Z0, Z2
	VMAXPS    Z1, Z0, Z1
	VMOVUPS   Z2, K1, (SI)
	VMOVUPS   Z1, K1, (DI)

mm_done:
	VZEROUPPER
	RET

// GELUSTEP computes, for the 16 values v in Z0: Z8 = GELU(v) = v·s with
// s = σ(2u) = 1/(1 + e), e = exp(−2u), u = √(2/π)·v·(1 + 0.044715·v²), and
// Z9 = GELU'(v) = s + 2√(2/π)·v·s·(1 − s)·(1 + 3·0.044715·v²) with
// 1 − s = e·s, so neither tail cancels. −2u is clamped above at 88.3 (e
// stays finite); NaN propagates. Uses Z13..Z17 and EXP's Z21..Z31;
// clobbers Z1..Z12.
#define GELUSTEP \
	VMULPS       Z0, Z0, Z10  \
	VMOVAPS      Z10, Z5      \
	VFMADD213PS  Z31, Z15, Z5 \
	VMULPS       Z0, Z5, Z5   \
	VMULPS       Z14, Z5, Z1  \
	VMINPS       Z1, Z13, Z1  \
	EXP                       \
	VADDPS       Z31, Z1, Z7  \
	VDIVPS       Z7, Z31, Z7  \
	VMULPS       Z0, Z7, Z8   \
	VMULPS       Z1, Z7, Z9   \
	VMULPS       Z8, Z9, Z9   \
	VMOVAPS      Z10, Z12     \
	VFMADD213PS  Z31, Z16, Z12 \
	VMULPS       Z12, Z9, Z9  \
	VFMADD213PS  Z7, Z17, Z9

// func geluAVX512(y, d, x *float32, n int)
// y = GELU(x) and, unless d is nil, d = GELU'(x) (see GELUSTEP).
TEXT ·geluAVX512(SB), NOSPLIT, $0-32
	MOVQ y+0(FP), DI
	MOVQ d+8(FP), DX
	MOVQ x+16(FP), SI
	MOVQ n+24(FP), CX
	CONST($0x42b0999a, Z13) // 88.3
	CONST($0xbfcc422a, Z14) // −2√(2/π)
	CONST($0x3d372713, Z15) // 0.044715
	CONST($0x3e095d4f, Z16) // 3·0.044715
	CONST($0x3fcc422a, Z17) // 2√(2/π)
	EXPCONSTS

gelu16:
	CMPQ    CX, $16
	JL      gelu_tail
	VMOVUPS (SI), Z0
	GELUSTEP
	VMOVUPS Z8, (DI)
	TESTQ   DX, DX
	JE      gelu_next
	VMOVUPS Z9, (DX)
	ADDQ    $64, DX

gelu_next:
	ADDQ $64, SI
	ADDQ $64, DI
	SUBQ $16, CX
	JMP  gelu16

gelu_tail:
	TESTQ     CX, CX
	JE        gelu_done
	TAIL
	VMOVUPS.Z (SI), K1, Z0
	GELUSTEP
	VMOVUPS   Z8, K1, (DI)
	TESTQ     DX, DX
	JE        gelu_done
	VMOVUPS   Z9, K1, (DX)

gelu_done:
	VZEROUPPER
	RET

// func layerNormAVX512(y, mean, rstd, x, w, b *float32, rows, cols int, eps float32)
// CPU.LayerNorm for rows ≥ 1 rows of cols values, cols a positive multiple
// of 8: the mean and variance in float64 over eight lanes, then
// y = float32((x − mean)·rstd)·w + b in float32 (no fused multiply-add,
// as the Go loop).
TEXT ·layerNormAVX512(SB), NOSPLIT, $0-68
	MOVQ      y+0(FP), DI
	MOVQ      mean+8(FP), R11
	MOVQ      rstd+16(FP), R12
	MOVQ      x+24(FP), SI
	MOVQ      w+32(FP), R9
	MOVQ      b+40(FP), R10
	MOVQ      rows+48(FP), R8
	MOVQ      cols+56(FP), BX
	VCVTSI2SDQ BX, X15, X15    // cols, float64
	VCVTSS2SD eps+64(FP), X14, X14
	SHLQ      $2, BX          // bytes a row
	MOVQ      $0x3ff0000000000000, AX
	VMOVQ     AX, X12         // 1.0

ln_row:
	VXORPD Z0, Z0, Z0
	XORQ   AX, AX

ln_sum:
	VCVTPS2PD (SI)(AX*1), Z1
	VADDPD    Z1, Z0, Z0
	ADDQ      $32, AX
	CMPQ      AX, BX
	JL        ln_sum
	HSUMPD
	VDIVSD       X15, X0, X13 // mean
	VBROADCASTSD X13, Z2
	VXORPD       Z0, Z0, Z0
	XORQ         AX, AX

ln_var:
	VCVTPS2PD   (SI)(AX*1), Z1
	VSUBPD      Z2, Z1, Z1
	VFMADD231PD Z1, Z1, Z0
	ADDQ        $32, AX
	CMPQ        AX, BX
	JL          ln_var
	HSUMPD
	VDIVSD       X15, X0, X0
	VADDSD       X14, X0, X0
	VSQRTSD      X0, X0, X0
	VDIVSD       X0, X12, X3  // rstd
	VBROADCASTSD X3, Z4
	VCVTSD2SS    X13, X5, X5
	VMOVSS       X5, (R11)
	VCVTSD2SS    X3, X5, X5
	VMOVSS       X5, (R12)
	XORQ         AX, AX

ln_out:
	VCVTPS2PD (SI)(AX*1), Z1
	VSUBPD    Z2, Z1, Z1
	VMULPD    Z4, Z1, Z1
	VCVTPD2PS Z1, Y1
	VMULPS    (R9)(AX*1), Y1, Y1
	VADDPS    (R10)(AX*1), Y1, Y1
	VMOVUPS   Y1, (DI)(AX*1)
	ADDQ      $32, AX
	CMPQ      AX, BX
	JL        ln_out
	ADDQ      BX, SI
	ADDQ      BX, DI
	ADDQ      $4, R11
	ADDQ      $4, R12
	DECQ      R8
	JNZ       ln_row
	VZEROUPPER
	RET

// func layerNormBackwardAVX512(dx, dw, db, dy, x, mean, rstd, w *float32, rows, cols int)
// CPU.LayerNormBackward for rows ≥ 1 rows of cols values, cols a positive
// multiple of 8: x̂ and the row sums Σ dy·w and Σ dy·w·x̂ in float64 over
// eight lanes; dw += float32(dy·x̂) and db += dy in float32, row by row as
// the Go loop; dx = float32(rstd·(dy·w − mean(dy·w) − x̂·mean(dy·w·x̂))).
TEXT ·layerNormBackwardAVX512(SB), NOSPLIT, $0-80
	MOVQ      dx+0(FP), DI
	MOVQ      dw+8(FP), R13
	MOVQ      db+16(FP), R14
	MOVQ      dy+24(FP), CX
	MOVQ      x+32(FP), SI
	MOVQ      mean+40(FP), R11
	MOVQ      rstd+48(FP), R12
	MOVQ      w+56(FP), R9
	MOVQ      rows+64(FP), R8
	MOVQ      cols+72(FP), BX
	VCVTSI2SDQ BX, X15, X15
	SHLQ      $2, BX

lb_row:
	VCVTSS2SD    (R11), X2, X2
	VBROADCASTSD X2, Z2       // mean
	VCVTSS2SD    (R12), X4, X4
	VBROADCASTSD X4, Z4       // rstd
	VXORPD       Z6, Z6, Z6   // Σ dy·w
	VXORPD       Z7, Z7, Z7   // Σ dy·w·x̂
	XORQ         AX, AX

lb_sums:
	VCVTPS2PD   (SI)(AX*1), Z1
	VSUBPD      Z2, Z1, Z1
	VMULPD      Z4, Z1, Z1     // x̂
	VCVTPS2PD   (CX)(AX*1), Z3 // dy
	VMULPD      Z1, Z3, Z5
	VCVTPD2PS   Z5, Y5
	VADDPS      (R13)(AX*1), Y5, Y5
	VMOVUPS     Y5, (R13)(AX*1)
	VMOVUPS     (CX)(AX*1), Y8
	VADDPS      (R14)(AX*1), Y8, Y8
	VMOVUPS     Y8, (R14)(AX*1)
	VCVTPS2PD   (R9)(AX*1), Z9
	VMULPD      Z9, Z3, Z9     // dy·w
	VADDPD      Z9, Z6, Z6
	VFMADD231PD Z1, Z9, Z7
	ADDQ        $32, AX
	CMPQ        AX, BX
	JL          lb_sums
	VMOVAPD      Z6, Z0
	HSUMPD
	VDIVSD       X15, X0, X0
	VBROADCASTSD X0, Z6
	VMOVAPD      Z7, Z0
	HSUMPD
	VDIVSD       X15, X0, X0
	VBROADCASTSD X0, Z7
	XORQ         AX, AX

lb_dx:
	VCVTPS2PD    (SI)(AX*1), Z1
	VSUBPD       Z2, Z1, Z1
	VMULPD       Z4, Z1, Z1
	VCVTPS2PD    (CX)(AX*1), Z3
	VCVTPS2PD    (R9)(AX*1), Z9
	VMULPD       Z9, Z3, Z3
	VSUBPD       Z6, Z3, Z3
	VFNMADD231PD Z7, Z1, Z3
	VMULPD       Z4, Z3, Z3
	VCVTPD2PS    Z3, Y3
	VMOVUPS      Y3, (DI)(AX*1)
	ADDQ         $32, AX
	CMPQ         AX, BX
	JL           lb_dx
	ADDQ         BX, SI
	ADDQ         BX, DI
	ADDQ         BX, CX
	ADDQ         $4, R11
	ADDQ         $4, R12
	DECQ         R8
	JNZ          lb_row
	VZEROUPPER
	RET

// NONFINITE4 ORs into mask register acc the lanes of Z0–Z3 that hold NaN
// or ±Inf (Z30: the exponent mask); clobbers Z4–Z7 and K3–K6.
#define NONFINITE4(acc) \
	VPANDD   Z0, Z30, Z4 \
	VPANDD   Z1, Z30, Z5 \
	VPANDD   Z2, Z30, Z6 \
	VPANDD   Z3, Z30, Z7 \
	VPCMPEQD Z30, Z4, K3 \
	VPCMPEQD Z30, Z5, K4 \
	VPCMPEQD Z30, Z6, K5 \
	VPCMPEQD Z30, Z7, K6 \
	KORW     K3, K4, K3 \
	KORW     K5, K6, K5 \
	KORW     K3, K5, K3 \
	KORW     acc, K3, acc

// func axpyFiniteAVX512(alpha float32, x, y *float32, n int) (bad uint8)
// sets y[i] += alpha·x[i]; bit 0 of bad: some y[i] was NaN or ±Inf before,
// bit 1: some y[i] is after. One pass over y.
TEXT ·axpyFiniteAVX512(SB), NOSPLIT, $0-33
	VBROADCASTSS alpha+0(FP), Z31
	MOVL         $0x7f800000, AX
	VPBROADCASTD AX, Z30
	MOVQ         x+8(FP), SI
	MOVQ         y+16(FP), DI
	MOVQ         n+24(FP), CX
	KXORW        K2, K2, K2 // inputs
	KXORW        K7, K7, K7 // outputs
	CMPQ         CX, $64
	JL           af_16

af_64:
	LOAD4(DI)
	NONFINITE4(K2)
	FMA4
	STORE4(DI)
	NONFINITE4(K7)
	ADDQ        $256, SI
	ADDQ        $256, DI
	SUBQ        $64, CX
	CMPQ        CX, $64
	JGE         af_64

af_16:
	CMPQ        CX, $16
	JL          af_tail
	VMOVUPS     (DI), Z0
	VPANDD      Z0, Z30, Z4
	VPCMPEQD    Z30, Z4, K3
	KORW        K2, K3, K2
	VFMADD231PS (SI), Z31, Z0
	VMOVUPS     Z0, (DI)
	VPANDD      Z0, Z30, Z4
	VPCMPEQD    Z30, Z4, K3
	KORW        K7, K3, K7
	ADDQ        $64, SI
	ADDQ        $64, DI
	SUBQ        $16, CX
	JMP         af_16

af_tail:
	TESTQ       CX, CX
	JE          af_done
	TAIL
	VMOVUPS.Z   (DI), K1, Z0
	VMOVUPS.Z   (SI), K1, Z1
	VPANDD      Z0, Z30, Z4
	VPCMPEQD    Z30, Z4, K1, K3
	KORW        K2, K3, K2
	VFMADD231PS Z1, Z31, Z0
	VMOVUPS     Z0, K1, (DI)
	VPANDD      Z0, Z30, Z4
	VPCMPEQD    Z30, Z4, K1, K3
	KORW        K7, K3, K7

af_done:
	XORL     AX, AX
	KORTESTW K2, K2
	SETNE    AL
	XORL     BX, BX
	KORTESTW K7, K7
	SETNE    BL
	SHLL     $1, BX
	ORL      BX, AX
	MOVB     AL, bad+32(FP)
	VZEROUPPER
	RET

// func axpyToFiniteAVX512(alpha float32, x, y, out *float32, n int) (bad bool)
// sets out[i] = alpha·x[i] + y[i] (the FMA of axpyFiniteAVX512); bad: some
// out[i] is NaN or ±Inf.
TEXT ·axpyToFiniteAVX512(SB), NOSPLIT, $0-41
	VBROADCASTSS alpha+0(FP), Z31
	MOVL         $0x7f800000, AX
	VPBROADCASTD AX, Z30
	MOVQ         x+8(FP), SI
	MOVQ         y+16(FP), DX
	MOVQ         out+24(FP), DI
	MOVQ         n+32(FP), CX
	KXORW        K7, K7, K7
	CMPQ         CX, $64
	JL           at_16

at_64:
	LOAD4(DX)
	FMA4
	STORE4(DI)
	NONFINITE4(K7)
	ADDQ        $256, SI
	ADDQ        $256, DX
	ADDQ        $256, DI
	SUBQ        $64, CX
	CMPQ        CX, $64
	JGE         at_64

at_16:
	CMPQ        CX, $16
	JL          at_tail
	VMOVUPS     (DX), Z0
	VFMADD231PS (SI), Z31, Z0
	VMOVUPS     Z0, (DI)
	VPANDD      Z0, Z30, Z4
	VPCMPEQD    Z30, Z4, K3
	KORW        K7, K3, K7
	ADDQ        $64, SI
	ADDQ        $64, DX
	ADDQ        $64, DI
	SUBQ        $16, CX
	JMP         at_16

at_tail:
	TESTQ       CX, CX
	JE          at_done
	TAIL
	VMOVUPS.Z   (DX), K1, Z0
	VMOVUPS.Z   (SI), K1, Z1
	VFMADD231PS Z1, Z31, Z0
	VMOVUPS     Z0, K1, (DI)
	VPANDD      Z0, Z30, Z4
	VPCMPEQD    Z30, Z4, K1, K3
	KORW        K7, K3, K7

at_done:
	KORTESTW K7, K7
	SETNE    bad+40(FP)
	VZEROUPPER
	RET
