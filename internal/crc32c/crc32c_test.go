package crc32c

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"
	"math/rand/v2"
	"strconv"
	"testing"
)

// TestMatchesStdlib compares Update with hash/crc32 on every length up to
// 2 KiB and on longer ones, at several offsets into the buffer and from
// several starting CRCs.
func TestMatchesStdlib(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 70000)
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	lengths := []int{}
	for n := 0; n <= 2048; n++ {
		lengths = append(lengths, n)
	}
	lengths = append(lengths, 4095, 4096, 4097, 65536, 65536+63, 69000)
	for _, n := range lengths {
		for _, off := range []int{0, 1, 7, 64, 333} {
			if off+n > len(buf) {
				continue
			}
			p := buf[off : off+n]
			for _, crc := range []uint32{0, 0xffffffff, r.Uint32()} {
				if got, want := Update(crc, p), crc32.Update(crc, table, p); got != want {
					t.Fatalf("len %d off %d crc %#x: got %#x, want %#x", n, off, crc, got, want)
				}
			}
		}
	}
}

// TestModel checks the folding arithmetic the kernel does, in pure Go: a
// wrong constant or a block taken in the wrong order fails it on machines
// without AVX-512 too.
func TestModel(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{256, 320, 512, 4096 + 64, 65536} {
		p := make([]byte, n)
		for i := range p {
			p[i] = byte(r.Uint32())
		}
		crc := r.Uint32()
		if got, want := crc32.Update(^modelFold(^crc, p), table, nil), crc32.Update(crc, table, p); got != want {
			t.Fatalf("n %d: model %#x, want %#x", n, got, want)
		}
	}
}

// modelFold is foldAVX512 in Go, one 128-bit block at a time.
func modelFold(reg uint32, p []byte) uint32 {
	type blk struct{ lo, hi uint64 }
	load := func(b []byte) blk {
		return blk{le64(b), le64(b[8:])}
	}
	fold := func(a blk, k int) blk {
		klo, khi := foldKeys[2*k], foldKeys[2*k+1]
		h1, l1 := clmul(a.lo, klo)
		h2, l2 := clmul(a.hi, khi)
		return blk{l1 ^ l2, h1 ^ h2}
	}
	xor := func(a, b blk) blk { return blk{a.lo ^ b.lo, a.hi ^ b.hi} }
	var acc [16]blk
	for i := range acc {
		acc[i] = load(p[16*i:])
	}
	acc[0].lo ^= uint64(reg)
	off := 256
	for ; off+256 <= len(p); off += 256 {
		for i := range acc {
			acc[i] = xor(fold(acc[i], 0), load(p[off+16*i:]))
		}
	}
	z := acc[:4]
	for j := 1; j < 4; j++ {
		for i := range z {
			z[i] = xor(fold(z[i], 1), acc[4*j+i])
		}
	}
	for ; off+64 <= len(p); off += 64 {
		for i := range z {
			z[i] = xor(fold(z[i], 1), load(p[off+16*i:]))
		}
	}
	f := xor(xor(fold(z[0], 2), fold(z[1], 3)), xor(fold(z[2], 4), z[3]))
	var b [16]byte
	for i := range 8 {
		b[i], b[8+i] = byte(f.lo>>(8*i)), byte(f.hi>>(8*i))
	}
	return ^crc32.Update(^uint32(0), table, b[:])
}

func le64(b []byte) uint64 {
	var v uint64
	for i := range 8 {
		v |= uint64(b[i]) << (8 * i)
	}
	return v
}

// clmul returns the carry-less product of a and b as (high, low) halves.
func clmul(a, b uint64) (hi, lo uint64) {
	for i := range 64 {
		if b>>i&1 != 0 {
			lo ^= a << i
			if i > 0 {
				hi ^= a >> (64 - i)
			}
		}
	}
	return hi, lo
}

func BenchmarkUpdate(b *testing.B) {
	for _, n := range []int{256, 512, 4096, 256 << 10} {
		p := make([]byte, n)
		b.Run("crc32c/"+strconv.Itoa(n), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				Update(0, p)
			}
		})
		b.Run("stdlib/"+strconv.Itoa(n), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				crc32.Update(0, table, p)
			}
		})
	}
}

// TestUpdateFinite compares UpdateFinite with hash/crc32 and a value by
// value check: on finite data, and with one NaN, +Inf, -Inf or a NaN of
// another payload at every position class (first block, the kernel's
// 256-byte loop, its 64-byte loop, the tail), on lengths around the
// kernel's thresholds and at offsets that misalign the floats.
func TestUpdateFinite(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	bad := []uint32{0x7fc00000, 0x7f800000, 0xff800000, 0x7f800001, 0xffffffff}
	for _, n := range []int{0, 4, 60, 64, 252, 256, 260, 320, 508, 512, 516, 1024, 1028 + 64, 4096, 65536 + 4*7} {
		for _, off := range []int{0, 4, 1} {
			buf := make([]byte, n+off)
			for i := 0; i+4 <= len(buf); i += 4 {
				binary.LittleEndian.PutUint32(buf[i:], math.Float32bits(float32(r.NormFloat64()*1e30)))
			}
			p := buf[off:]
			crc := r.Uint32()
			check := func(what string) {
				t.Helper()
				got, fin := UpdateFinite(crc, p)
				want := crc32.Update(crc, table, p)
				wantFin := len(p)%4 == 0 && finiteBytes(p)
				if got != want || fin != wantFin {
					t.Fatalf("n %d off %d %s: crc %#x finite %v, want %#x %v", n, off, what, got, fin, want, wantFin)
				}
			}
			check("finite")
			if off%4 != 0 || n == 0 {
				continue
			}
			for _, pos := range []int{0, n/4 - 1, (n / 4) / 2, min(70, n/4-1), min(200, n/4-1)} {
				for _, b := range bad {
					old := binary.LittleEndian.Uint32(p[4*pos:])
					binary.LittleEndian.PutUint32(p[4*pos:], b)
					check(fmt.Sprintf("%#x at value %d", b, pos))
					binary.LittleEndian.PutUint32(p[4*pos:], old)
				}
			}
		}
	}
}

func BenchmarkUpdateFinite(b *testing.B) {
	p := make([]byte, 1<<20)
	b.Run("crc", func(b *testing.B) {
		b.SetBytes(int64(len(p)))
		for b.Loop() {
			Update(0, p)
		}
	})
	b.Run("crc+finite", func(b *testing.B) {
		b.SetBytes(int64(len(p)))
		for b.Loop() {
			UpdateFinite(0, p)
		}
	})
}
