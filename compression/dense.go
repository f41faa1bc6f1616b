package compression

import (
	"encoding/binary"
	"math"
	"sync"
	"unsafe"

	"github.com/starling-ml/starling/device"
)

// FP32 is the identity codec: raw little-endian float32s, bit-exact.
//
// Wire: header, then 4·n bytes. FP32 has no state and is safe for concurrent
// use.
type FP32 struct{}

var _ Codec = FP32{}

// ID implements Codec.
func (FP32) ID() ID { return IDFP32 }

// Name implements Codec.
func (c FP32) Name() string { return nameOf(c) }

func (FP32) spec() string { return "fp32" }

// Encode implements Codec.
func (FP32) Encode(dst []byte, src []float32) []byte {
	h := headerLen(len(src))
	out := resize(dst, h+4*len(src))
	putHeader(out, IDFP32, len(src))
	putFloats(out[h:], src)
	return out
}

// Decode implements Codec.
func (FP32) Decode(dst []float32, src []byte) error {
	p, err := fp32Payload(dst, src)
	if err != nil {
		return err
	}
	getFloats(dst, p)
	return nil
}

func (FP32) decodeAdd(acc []float32, src []byte) error {
	p, err := fp32Payload(acc, src)
	if err != nil {
		return err
	}
	addFloats(acc, p)
	return nil
}

func fp32Payload(dst []float32, src []byte) ([]byte, error) {
	r, err := readHeader(src, IDFP32, len(dst))
	if err != nil {
		return nil, err
	}
	p := r.bytes(4 * uint64(len(dst)))
	return p, r.end()
}

// FP16 rounds every value to IEEE 754 half precision (round to nearest even).
// Finite values beyond ±65504 saturate to ±65504. The relative error is at
// most 2⁻¹¹ for |x| ≥ 2⁻¹⁴ and the absolute error at most 2⁻²⁵ below.
//
// Wire: header, then n little-endian binary16 values. FP16 has no state and is
// safe for concurrent use.
type FP16 struct{}

var _ Codec = FP16{}

// ID implements Codec.
func (FP16) ID() ID { return IDFP16 }

// Name implements Codec.
func (c FP16) Name() string { return nameOf(c) }

func (FP16) spec() string { return "fp16" }

// Encode implements Codec.
func (FP16) Encode(dst []byte, src []float32) []byte {
	h := headerLen(len(src))
	out := resize(dst, h+2*len(src))
	putHeader(out, IDFP16, len(src))
	encodeF16(out[h:], src)
	return out
}

// Decode implements Codec.
func (FP16) Decode(dst []float32, src []byte) error {
	p, err := halfPayload(IDFP16, dst, src)
	if err != nil {
		return err
	}
	decodeF16(dst, p)
	return nil
}

func (FP16) decodeAdd(acc []float32, src []byte) error {
	p, err := halfPayload(IDFP16, acc, src)
	if err != nil {
		return err
	}
	p = p[:2*len(acc)]
	t := f16Table()
	for i := range acc {
		b := p[2*i : 2*i+2 : 2*i+2]
		acc[i] += t[uint16(b[0])|uint16(b[1])<<8]
	}
	return nil
}

// BF16 rounds every value to bfloat16 (round to nearest even): float32's
// range with 8 significant bits, a relative error of at most 2⁻⁹ for normal
// values.
//
// Wire: header, then n little-endian bfloat16 values. BF16 has no state and is
// safe for concurrent use.
type BF16 struct{}

var _ Codec = BF16{}

// ID implements Codec.
func (BF16) ID() ID { return IDBF16 }

// Name implements Codec.
func (c BF16) Name() string { return nameOf(c) }

func (BF16) spec() string { return "bf16" }

// Encode implements Codec.
func (BF16) Encode(dst []byte, src []float32) []byte {
	h := headerLen(len(src))
	out := resize(dst, h+2*len(src))
	putHeader(out, IDBF16, len(src))
	encodeBF16(out[h:], src)
	return out
}

// Decode implements Codec.
func (BF16) Decode(dst []float32, src []byte) error {
	p, err := halfPayload(IDBF16, dst, src)
	if err != nil {
		return err
	}
	decodeBF16(dst, p)
	return nil
}

func (BF16) decodeAdd(acc []float32, src []byte) error {
	p, err := halfPayload(IDBF16, acc, src)
	if err != nil {
		return err
	}
	p = p[:2*len(acc)]
	for i := range acc {
		acc[i] += bf16ToF32(binary.LittleEndian.Uint16(p[2*i:]))
	}
	return nil
}

func halfPayload(id ID, dst []float32, src []byte) ([]byte, error) {
	r, err := readHeader(src, id, len(dst))
	if err != nil {
		return nil, err
	}
	p := r.bytes(2 * uint64(len(dst)))
	return p, r.end()
}

// The bulk loops. They go through encodeF16Go and friends unless an assembly
// kernel for this CPU replaced them at init.

func encodeF16Go(out []byte, src []float32) {
	out = out[:2*len(src)]
	for i, v := range src {
		// f32ToF16 inlined by hand: it is over the compiler's inlining budget.
		f := math.Float32bits(v)
		sign := f >> 16 & 0x8000
		f &= 0x7fffffff
		o := (f + 0xc8000fff + (f>>13)&1) >> 13
		s := math.Float32bits(math.Float32frombits(f)+0.5) - 0x3f000000
		if f < 0x38800000 {
			o = s
		}
		if f >= 0x477ff000 {
			o = uint32(f16Special(f))
		}
		o |= sign
		b := out[2*i : 2*i+2 : 2*i+2]
		b[0] = byte(o)
		b[1] = byte(o >> 8)
	}
}

// f16Table maps every binary16 bit pattern to its float32 value (256 KiB,
// built on first use). A lookup beats the arithmetic conversion by about 1.5×
// here because gradients use few exponents, so the touched lines stay in L1/L2.
var f16Table = sync.OnceValue(func() *[1 << 16]float32 {
	t := new([1 << 16]float32)
	for i := range t {
		t[i] = f16ToF32(uint16(i))
	}
	return t
})

func decodeF16Go(dst []float32, p []byte) {
	p = p[:2*len(dst)]
	t := f16Table()
	for i := range dst {
		b := p[2*i : 2*i+2 : 2*i+2]
		dst[i] = t[uint16(b[0])|uint16(b[1])<<8]
	}
}

// encodeBF16LE writes src as little-endian bfloat16s: device's bulk
// conversion straight into out where the machine is little-endian.
func encodeBF16LE(out []byte, src []float32) {
	if nativeLE && len(src) > 0 {
		device.EncodeBF16(unsafe.Slice((*uint16)(unsafe.Pointer(&out[:2*len(src)][0])), len(src)), src)
		return
	}
	encodeBF16Go(out, src)
}

// decodeBF16LE reads len(dst) little-endian bfloat16s from p.
func decodeBF16LE(dst []float32, p []byte) {
	if nativeLE && len(dst) > 0 {
		device.DecodeBF16(dst, unsafe.Slice((*uint16)(unsafe.Pointer(&p[:2*len(dst)][0])), len(dst)))
		return
	}
	decodeBF16Go(dst, p)
}

func encodeBF16Go(out []byte, src []float32) {
	out = out[:2*len(src)]
	for i, v := range src {
		binary.LittleEndian.PutUint16(out[2*i:], f32ToBF16(math.Float32bits(v)))
	}
}

func decodeBF16Go(dst []float32, p []byte) {
	p = p[:2*len(dst)]
	for i := range dst {
		dst[i] = bf16ToF32(binary.LittleEndian.Uint16(p[2*i:]))
	}
}

var (
	encodeF16  = encodeF16Go
	decodeF16  = decodeF16Go
	encodeBF16 = encodeBF16LE
	decodeBF16 = decodeBF16LE
)
