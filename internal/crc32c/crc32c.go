// Package crc32c computes CRC-32C (Castagnoli), the payload checksum of
// plaintext tensor frames, at the speed of AVX-512's carry-less multiply
// where the CPU has it. Its results are hash/crc32's with the Castagnoli
// table, bit for bit.
package crc32c

import (
	"encoding/binary"
	"hash/crc32"
	"math/bits"
	"unsafe"

	"github.com/starling-ml/starling/device"
)

var table = crc32.MakeTable(crc32.Castagnoli)

var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// poly is the Castagnoli polynomial without its x^32 term, bit i holding
// the coefficient of x^i.
const poly = 0x1EDC6F41

// minFold is the shortest input the folding kernel takes: below it
// hash/crc32's three-way SSE4.2 loop is as fast.
const minFold = 256

// Update returns the CRC-32C of p appended to the data whose CRC-32C is
// crc, as crc32.Update(crc, crc32.MakeTable(crc32.Castagnoli), p) does.
func Update(crc uint32, p []byte) uint32 {
	if haveFold && len(p) >= minFold {
		n := len(p) &^ 63
		reg := foldAVX512(^crc, &p[0], n, &foldKeys)
		return crc32.Update(^reg, table, p[n:])
	}
	return crc32.Update(crc, table, p)
}

// UpdateFinite is Update, and also reports whether p, read as
// little-endian float32 values, holds no NaN or ±Inf: one pass over p for
// both. finite is false when len(p) is not a multiple of 4.
func UpdateFinite(crc uint32, p []byte) (_ uint32, finite bool) {
	if len(p)%4 != 0 {
		return Update(crc, p), false
	}
	n := 0
	bad := false
	if haveFold && len(p) >= minFold {
		n = len(p) &^ 63
		var reg uint32
		reg, bad = foldFiniteAVX512(^crc, &p[0], n, &foldKeys)
		crc = ^reg
	}
	crc = crc32.Update(crc, table, p[n:])
	return crc, !bad && finiteBytes(p[n:])
}

// finiteBytes reports whether p, read as little-endian float32 values
// (len(p) a multiple of 4), holds no NaN or ±Inf: device.AllFinite where p
// is laid out as float32s (little-endian host, p aligned), as on CPUs
// without the folding kernel all of p is.
func finiteBytes(p []byte) bool {
	if len(p) == 0 {
		return true
	}
	if littleEndian && uintptr(unsafe.Pointer(&p[0]))%4 == 0 {
		return device.AllFinite(unsafe.Slice((*float32)(unsafe.Pointer(&p[0])), len(p)/4))
	}
	for i := 0; i+4 <= len(p); i += 4 {
		if binary.LittleEndian.Uint32(p[i:])&0x7f800000 == 0x7f800000 {
			return false
		}
	}
	return true
}

// Checksum returns the CRC-32C of p.
func Checksum(p []byte) uint32 { return Update(0, p) }

// foldKeys are the kernel's constants, in 128-bit pairs (low, high):
// pair 0 folds a 16-byte block forward by 256 bytes, pair 1 by 64 bytes,
// and pairs 2–5 fold the four blocks of a 64-byte register onto the last
// (by 48, 32 and 16 bytes; the last pair is zero).
var foldKeys = [12]uint64{}

func init() {
	for i, d := range []int{256, 64, 48, 32, 16} {
		foldKeys[2*i], foldKeys[2*i+1] = foldPair(8 * d)
	}
}

// foldPair returns the constants that move a 128-bit block d bits forward
// in the message, modulo P. In the bit-reflected order of the CRC a block's
// low 64 bits (its first 8 bytes) are its high-degree half A_H and its high
// 64 bits the low-degree half A_L, so the block contributes
// A_H·x^(d+64) + A_L·x^d. A carry-less product of two reflected 64-bit
// values comes out multiplied by x once more, so the constants are
// x^(d+63) mod P for A_H and x^(d−1) mod P for A_L, each reflected into 64
// bits (the coefficient of x^k at bit 63−k).
func foldPair(d int) (lo, hi uint64) {
	return bits.Reverse64(xPowMod(d + 63)), bits.Reverse64(xPowMod(d - 1))
}

// xPowMod returns x^n mod P with bit i holding the coefficient of x^i.
func xPowMod(n int) uint64 {
	r := uint64(1)
	for range n {
		r <<= 1
		if r&(1<<32) != 0 {
			r ^= 1<<32 | poly
		}
	}
	return r
}

// AxpyTo sets out = alpha·x + y (device.AxpyTo's FMA, bit for bit) and in
// the same pass extends crcY over y's bytes and crcOut over out's (as
// Update over their bytes in memory), and reports whether y and out hold
// no NaN or ±Inf. It is the receiving end of an all-reduce's partial sum
// over plaintext: the checksum of what arrived, the sums, and the
// checksum they are sent on with. It panics where device.AxpyTo does
// (see device.AxpyToRuns) and when the lengths differ.
func AxpyTo(alpha float32, x, y, out []float32, crcY, crcOut uint32) (_, _ uint32, yFinite, outFinite bool) {
	if len(x) != len(y) || len(out) != len(y) {
		panic("crc32c: AxpyTo lengths differ")
	}
	n := 0
	var bad uint8
	if haveFold && len(y) >= 64 {
		n = len(y) &^ 63
		var regY, regOut uint32
		regY, regOut, bad = axpyToFoldAVX512(alpha, &x[0], &y[0], &out[0], n, ^crcY, ^crcOut, &foldKeys)
		crcY, crcOut = ^regY, ^regOut
	}
	crcY, yFinite = UpdateFinite(crcY, floatBytes(y[n:]))
	outFinite = device.AxpyTo(alpha, x[n:], y[n:], out[n:])
	crcOut = Update(crcOut, floatBytes(out[n:]))
	return crcY, crcOut, yFinite && bad&1 == 0, outFinite && bad&2 == 0
}

// floatBytes is x's memory as bytes.
func floatBytes(x []float32) []byte {
	if len(x) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&x[0])), 4*len(x))
}
