//go:build ignore

// gen_kernels writes gemm_amd64.s: the register-blocked GEMM micro-kernels
// and the 16×16 transposing pack. It is plain text generation (no
// dependency); run it with
//
//	go generate ./device
//
// Every micro-kernel has the Go signature
//
//	func k(kc int, a, b, c *float32, lda, ldb, ldc int, alpha, beta float32, rows int, mask uint64)
//
// and computes, for the first rows rows (1..MR) of an MR×NR tile,
//
//	C = alpha·(A·Bpanel) + beta·C     (C is not read when beta == +0)
//
// where B is a packed panel (kc steps of NR values) or, in the direct
// kernels, read in place with row stride ldb through the column mask (so a
// ragged edge is never read past), and A is read in one of two layouts:
//
//	step: A(r, p) = a[p·lda + r]   (a packed panel with lda = MR, or Aᵀ in place)
//	row:  A(r, p) = a[r·lda + p]   (A in place, row-major)
//
// The AVX-512 kernels store only the columns whose bit is set in mask
// (bit j = column j); the AVX2 kernels store all NR columns.
package main

import (
	"bytes"
	"fmt"
	"os"
)

type kernel struct {
	name    string
	avx512  bool
	rowA    bool // A(r, p) = a[r·lda + p]; otherwise a[p·lda + r]
	directB bool // B(p, j) = b[p·ldb + j] with masked loads; otherwise packed (ldb = NR)
	mr, nv  int  // rows, vectors per row
	unroll  int
}

func (k kernel) vw() int { // floats per vector
	if k.avx512 {
		return 16
	}
	return 8
}

func (k kernel) reg(i int) string {
	if k.avx512 {
		return fmt.Sprintf("Z%d", i)
	}
	return fmt.Sprintf("Y%d", i)
}

var out bytes.Buffer

func p(format string, args ...any) { fmt.Fprintf(&out, format+"\n", args...) }

// rowBases are the registers that point at rows 0, 5, 10, 15 of A in row mode;
// rows base+0..4 are reached with the index registers R8 = lda·4 and
// R9 = 3·lda·4.
var rowBases = []string{"AX", "R10", "R11", "R12"}

func rowAddr(r, disp int) string {
	base := rowBases[r/5]
	switch r % 5 {
	case 0:
		return fmt.Sprintf("%d(%s)", disp, base)
	case 1:
		return fmt.Sprintf("%d(%s)(R8*1)", disp, base)
	case 2:
		return fmt.Sprintf("%d(%s)(R8*2)", disp, base)
	case 3:
		return fmt.Sprintf("%d(%s)(R9*1)", disp, base)
	default:
		return fmt.Sprintf("%d(%s)(R8*4)", disp, base)
	}
}

func gen(k kernel) {
	nr := k.nv * k.vw()
	nacc := k.mr * k.nv
	bReg := func(v int) string { return k.reg(nacc + v) }
	bc := func(i int) string { return k.reg(nacc + k.nv + i%2) }
	if nacc+k.nv+2 > map[bool]int{true: 32, false: 16}[k.avx512] {
		panic("too many registers: " + k.name)
	}
	acc := func(r, v int) string { return k.reg(r*k.nv + v) }
	layout := "A(r, p) = a[p·lda + r]"
	if k.rowA {
		layout = "A(r, p) = a[r·lda + p]"
	}
	bl := "B packed"
	if k.directB {
		bl = "B(p, j) = b[p·ldb + j]"
	}
	p("// func %s(kc int, a, b, c *float32, lda, ldb, ldc int, alpha, beta float32, rows int, mask uint64)", k.name)
	p("// %d×%d tile, %s, %s, %s.", k.mr, nr, map[bool]string{true: "AVX-512", false: "AVX2+FMA"}[k.avx512], layout, bl)
	p("TEXT ·%s(SB), NOSPLIT, $0-80", k.name)
	p("\tMOVQ kc+0(FP), CX")
	p("\tMOVQ a+8(FP), AX")
	p("\tMOVQ b+16(FP), BX")
	p("\tMOVQ c+24(FP), DI")
	p("\tMOVQ lda+32(FP), R8")
	p("\tSHLQ $2, R8")
	p("\tMOVQ ldb+40(FP), R13")
	p("\tSHLQ $2, R13")
	p("\tMOVQ ldc+48(FP), DX")
	p("\tSHLQ $2, DX")
	if k.avx512 {
		p("\tMOVQ mask+72(FP), R9")
		for v := 0; v < k.nv; v++ {
			p("\tKMOVW R9, K%d", v+1)
			if v+1 < k.nv {
				p("\tSHRQ $16, R9")
			}
		}
	}
	if k.rowA {
		p("\tLEAQ (R8)(R8*2), R9")
		for i := 1; i*5 < k.mr; i++ {
			p("\tLEAQ (%s)(R8*4), %s", rowBases[i-1], rowBases[i])
			p("\tADDQ R8, %s", rowBases[i])
		}
	}
	for i := 0; i < nacc; i++ {
		if k.avx512 {
			p("\tVPXORD %s, %s, %s", k.reg(i), k.reg(i), k.reg(i))
		} else {
			p("\tVXORPS %s, %s, %s", k.reg(i), k.reg(i), k.reg(i))
		}
	}
	step := func(u int) {
		bo := u * nr * 4
		for v := 0; v < k.nv; v++ {
			if k.directB {
				p("\tVMOVUPS.Z %d(BX), K%d, %s", v*k.vw()*4, v+1, bReg(v))
			} else {
				p("\tVMOVUPS %d(BX), %s", bo+v*k.vw()*4, bReg(v))
			}
		}
		if k.directB {
			p("\tADDQ R13, BX")
		}
		for r := 0; r < k.mr; r++ {
			if k.rowA {
				p("\tVBROADCASTSS %s, %s", rowAddr(r, u*4), bc(r))
			} else {
				p("\tVBROADCASTSS %d(AX), %s", r*4, bc(r))
			}
			for v := 0; v < k.nv; v++ {
				p("\tVFMADD231PS %s, %s, %s", bc(r), bReg(v), acc(r, v))
			}
		}
		if !k.rowA {
			p("\tADDQ R8, AX")
		}
	}
	advance := func(steps int) {
		if k.rowA {
			for i := 0; i*5 < k.mr; i++ {
				p("\tADDQ $%d, %s", steps*4, rowBases[i])
			}
		}
		if !k.directB {
			p("\tADDQ $%d, BX", steps*nr*4)
		}
	}
	U := k.unroll
	p("\tCMPQ CX, $%d", U)
	p("\tJL %s_tail", k.name)
	p("%s_loop:", k.name)
	for u := 0; u < U; u++ {
		step(u)
	}
	advance(U)
	p("\tSUBQ $%d, CX", U)
	p("\tCMPQ CX, $%d", U)
	p("\tJGE %s_loop", k.name)
	p("%s_tail:", k.name)
	p("\tTESTQ CX, CX")
	p("\tJE %s_store", k.name)
	p("%s_one:", k.name)
	step(0)
	advance(1)
	p("\tDECQ CX")
	p("\tJNZ %s_one", k.name)

	p("%s_store:", k.name)
	alpha, beta := bReg(0), bc(0)
	p("\tVBROADCASTSS alpha+56(FP), %s", alpha)
	p("\tVBROADCASTSS beta+60(FP), %s", beta)
	p("\tMOVQ rows+64(FP), SI")
	for i := 0; i < nacc; i++ {
		p("\tVMULPS %s, %s, %s", alpha, k.reg(i), k.reg(i))
	}
	p("\tMOVL beta+60(FP), R8")
	p("\tTESTL R8, R8")
	p("\tJE %s_zero", k.name)
	for _, withBeta := range []bool{true, false} {
		if !withBeta {
			p("%s_zero:", k.name)
		}
		for r := 0; r < k.mr; r++ {
			for v := 0; v < k.nv; v++ {
				off := v * k.vw() * 4
				if k.avx512 {
					if withBeta {
						p("\tVFMADD231PS %d(DI), %s, K%d, %s", off, beta, v+1, acc(r, v))
					}
					p("\tVMOVUPS %s, K%d, %d(DI)", acc(r, v), v+1, off)
				} else {
					if withBeta {
						p("\tVFMADD231PS %d(DI), %s, %s", off, beta, acc(r, v))
					}
					p("\tVMOVUPS %s, %d(DI)", acc(r, v), off)
				}
			}
			if r+1 < k.mr {
				p("\tDECQ SI")
				p("\tJZ %s_done", k.name)
				p("\tADDQ DX, DI")
			}
		}
		p("\tJMP %s_done", k.name)
	}
	p("%s_done:", k.name)
	p("\tVZEROUPPER")
	p("\tRET")
	p("")
}

// genTranspose16 writes
//
//	func transpose16AVX512(d, src *float32, ld, w, blocks int)
//
// which, for each of blocks consecutive 16×16 blocks along p, transposes
// src[r·ld + p] (r, p < 16) into d[p·w + r]; the next block starts 16
// floats further in src and 16·w floats further in d.
func genTranspose16() {
	p("// func transpose16AVX512(d, src *float32, ld, w, blocks int)")
	p("TEXT ·transpose16AVX512(SB), NOSPLIT, $0-40")
	p("\tMOVQ d+0(FP), DI")
	p("\tMOVQ src+8(FP), SI")
	p("\tMOVQ ld+16(FP), R8")
	p("\tSHLQ $2, R8")
	p("\tMOVQ w+24(FP), DX")
	p("\tSHLQ $2, DX")
	p("\tMOVQ blocks+32(FP), CX")
	p("\tLEAQ (R8)(R8*2), R9")
	p("\tTESTQ CX, CX")
	p("\tJE tr16_done")
	p("tr16_loop:")
	// Rows 0..15 of the block into Z0..Z15, via four row bases.
	p("\tMOVQ SI, AX")
	for r := 0; r < 16; r++ {
		if r > 0 && r%4 == 0 {
			p("\tLEAQ (AX)(R8*4), AX")
		}
		switch r % 4 {
		case 0:
			p("\tVMOVUPS (AX), Z%d", r)
		case 1:
			p("\tVMOVUPS (AX)(R8*1), Z%d", r)
		case 2:
			p("\tVMOVUPS (AX)(R8*2), Z%d", r)
		case 3:
			p("\tVMOVUPS (AX)(R9*1), Z%d", r)
		}
	}
	// Stage 1: interleave pairs of rows (32-bit elements).
	for i := 0; i < 16; i += 2 {
		p("\tVUNPCKLPS Z%d, Z%d, Z%d", i+1, i, 16+i)
		p("\tVUNPCKHPS Z%d, Z%d, Z%d", i+1, i, 17+i)
	}
	// Stage 2: interleave 64-bit pairs.
	for i := 0; i < 16; i += 4 {
		p("\tVSHUFPS $0x44, Z%d, Z%d, Z%d", 18+i, 16+i, i)
		p("\tVSHUFPS $0xEE, Z%d, Z%d, Z%d", 18+i, 16+i, i+1)
		p("\tVSHUFPS $0x44, Z%d, Z%d, Z%d", 19+i, 17+i, i+2)
		p("\tVSHUFPS $0xEE, Z%d, Z%d, Z%d", 19+i, 17+i, i+3)
	}
	// Now Z(4q+t) holds, in each 128-bit lane l, column 4l+t of rows 4q..4q+3.
	// Stage 3: gather lanes 0,2 / 1,3 of row groups (0,1) and (2,3).
	for t := 0; t < 4; t++ {
		p("\tVSHUFF32X4 $0x88, Z%d, Z%d, Z%d", 4+t, t, 16+t)
		p("\tVSHUFF32X4 $0xDD, Z%d, Z%d, Z%d", 4+t, t, 20+t)
		p("\tVSHUFF32X4 $0x88, Z%d, Z%d, Z%d", 12+t, 8+t, 24+t)
		p("\tVSHUFF32X4 $0xDD, Z%d, Z%d, Z%d", 12+t, 8+t, 28+t)
	}
	// Stage 4: combine row groups (0,1) with (2,3).
	// Z16+t: lanes = [q0:l0, q0:l2, q1:l0, q1:l2] of column 4l+t
	// Output column c = 4l + t is row c of d.
	p("\tMOVQ DI, AX")
	for t := 0; t < 4; t++ {
		// columns t (lane 0), 4+t (lane 1), 8+t (lane 2), 12+t (lane 3)
		p("\tVSHUFF32X4 $0x88, Z%d, Z%d, Z%d", 24+t, 16+t, t)    // lane 0: col t
		p("\tVSHUFF32X4 $0x88, Z%d, Z%d, Z%d", 28+t, 20+t, 4+t)  // lane 1: col 4+t
		p("\tVSHUFF32X4 $0xDD, Z%d, Z%d, Z%d", 24+t, 16+t, 8+t)  // lane 2: col 8+t
		p("\tVSHUFF32X4 $0xDD, Z%d, Z%d, Z%d", 28+t, 20+t, 12+t) // lane 3: col 12+t
	}
	for c := 0; c < 16; c++ {
		p("\tVMOVUPS Z%d, (AX)", c)
		p("\tADDQ DX, AX")
	}
	p("\tADDQ $64, SI")
	p("\tMOVQ DX, R10")
	p("\tSHLQ $4, R10")
	p("\tADDQ R10, DI")
	p("\tDECQ CX")
	p("\tJNZ tr16_loop")
	p("tr16_done:")
	p("\tVZEROUPPER")
	p("\tRET")
	p("")
}

func main() {
	p("// Code generated by gen_kernels.go; DO NOT EDIT.")
	p("")
	p("//go:build amd64 && !purego")
	p("")
	p("#include \"textflag.h\"")
	p("")
	for _, k := range []kernel{
		{name: "gemmAVX512Step8x32", avx512: true, mr: 8, nv: 2, unroll: 4},
		{name: "gemmAVX512Row8x32", avx512: true, rowA: true, mr: 8, nv: 2, unroll: 4},
		{name: "gemmAVX512StepB8x32", avx512: true, directB: true, mr: 8, nv: 2, unroll: 4},
		{name: "gemmAVX512RowB8x32", avx512: true, rowA: true, directB: true, mr: 8, nv: 2, unroll: 4},
		{name: "gemmAVX512Step16x16", avx512: true, mr: 16, nv: 1, unroll: 4},
		{name: "gemmAVX512Row16x16", avx512: true, rowA: true, mr: 16, nv: 1, unroll: 4},
		{name: "gemmAVX512StepB16x16", avx512: true, directB: true, mr: 16, nv: 1, unroll: 4},
		{name: "gemmAVX512RowB16x16", avx512: true, rowA: true, directB: true, mr: 16, nv: 1, unroll: 4},
		{name: "gemmAVX2Step6x16", mr: 6, nv: 2, unroll: 4},
		{name: "gemmAVX2Row6x16", rowA: true, mr: 6, nv: 2, unroll: 4},
	} {
		gen(k)
	}
	genTranspose16()
	if err := os.WriteFile("gemm_amd64.s", out.Bytes(), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
