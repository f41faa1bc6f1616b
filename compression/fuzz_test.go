package compression

import (
	"errors"
	"math"
	"testing"
)

// checkDecodeErr fails unless err is nil or wraps one of the package's
// decode sentinels.
func checkDecodeErr(t *testing.T, err error) {
	t.Helper()
	if err == nil {
		return
	}
	for _, s := range []error{ErrCorrupt, ErrLength, ErrTooLarge, ErrUnknownCodec} {
		if errors.Is(err, s) {
			return
		}
	}
	t.Fatalf("error wraps no sentinel: %v", err)
}

// fuzzDecoder fuzzes c.Decode: any bytes and any destination length give a
// result or a sentinel error, never a panic; what is accepted is within
// MaxEncodedLen; DecodeAdd agrees with Decode.
func fuzzDecoder(f *testing.F, c Codec) {
	for _, n := range []int{0, 1, 7, 64, 300} {
		x := gradLike(n, uint64(n))
		f.Add(c.Encode(nil, x), uint16(n))
	}
	f.Add([]byte{}, uint16(3))
	f.Add([]byte{byte(c.ID()), 0xff, 0xff, 0xff, 0xff, 0x0f}, uint16(3))
	f.Fuzz(func(t *testing.T, data []byte, n16 uint16) {
		n := int(n16 % 2048)
		dst := make([]float32, n)
		err := c.Decode(dst, data)
		checkDecodeErr(t, err)
		if err != nil {
			return
		}
		if max := MaxEncodedLen(c.ID(), n); len(data) > max && c.ID()&IDEntropy == 0 {
			t.Fatalf("accepted %d bytes for %d values, MaxEncodedLen %d", len(data), n, max)
		}
		if e, ok := c.(*Entropy); ok {
			if b := MaxEncodedLen(e.inner.ID(), n); cap(e.buf) > b && cap(e.buf) > 1<<16 {
				t.Fatalf("entropy scratch grew to %d, bound %d", cap(e.buf), b)
			}
			return
		}
		acc := make([]float32, n)
		if err := c.(adder).decodeAdd(acc, data); err != nil {
			t.Fatalf("Decode accepted what decodeAdd rejects: %v", err)
		}
		for i := range acc {
			if math.Float32bits(acc[i]) != math.Float32bits(dst[i]) && !(math.IsNaN(float64(acc[i])) && math.IsNaN(float64(dst[i]))) && !(acc[i] == 0 && dst[i] == 0) {
				t.Fatalf("value %d: decodeAdd into zeros %g, Decode %g", i, acc[i], dst[i])
			}
		}
	})
}

func FuzzDecodeFP32(f *testing.F)     { fuzzDecoder(f, FP32{}) }
func FuzzDecodeFP16(f *testing.F)     { fuzzDecoder(f, FP16{}) }
func FuzzDecodeBF16(f *testing.F)     { fuzzDecoder(f, BF16{}) }
func FuzzDecodeInt8(f *testing.F)     { fuzzDecoder(f, Int8{Block: 16}) }
func FuzzDecodeTopK(f *testing.F)     { fuzzDecoder(f, &TopK{Frac: 0.1}) }
func FuzzDecodeRandK(f *testing.F)    { fuzzDecoder(f, &RandK{Frac: 0.1}) }
func FuzzDecodeSign(f *testing.F)     { fuzzDecoder(f, Sign{Block: 10}) }
func FuzzDecodePowerSGD(f *testing.F) { fuzzDecoder(f, &PowerSGD{Rank: 2}) }
func FuzzDecodeFP4(f *testing.F)      { fuzzDecoder(f, FP4{Block: 7}) }
func FuzzDecodeInt4(f *testing.F)     { fuzzDecoder(f, Int4{Block: 16}) }

func FuzzDecodeEntropyZstd(f *testing.F) {
	e, _ := NewEntropy(&TopK{Frac: 0.3}, EntropyZstd)
	fuzzDecoder(f, e)
}

func FuzzDecodeEntropyS2(f *testing.F) {
	e, _ := NewEntropy(FP16{}, EntropyS2)
	fuzzDecoder(f, e)
}

// FuzzDecoder feeds any bytes to the id-dispatching Decoder and Combiner.
func FuzzDecoder(f *testing.F) {
	x := gradLike(100, 1)
	for _, spec := range []string{"fp32", "fp16", "int8", "topk:0.1", "randk:0.1", "sign", "powersgd:2", "fp16:entropy=s2"} {
		c, _ := Parse(spec)
		f.Add(c.Encode(nil, x), uint16(100))
	}
	f.Fuzz(func(t *testing.T, data []byte, n16 uint16) {
		n := int(n16 % 2048)
		var d Decoder
		dst := make([]float32, n)
		checkDecodeErr(t, d.Decode(dst, data))
		checkDecodeErr(t, d.DecodeAdd(dst, data))
		cb := NewCombiner(&TopK{})
		cb.Reset(n)
		checkDecodeErr(t, cb.Add(data))
		checkDecodeErr(t, cb.Add(data))
		_ = cb.Encode(nil)
	})
}

// FuzzMergeSparse merges arbitrary bytes with a valid sparse encoding.
func FuzzMergeSparse(f *testing.F) {
	x := gradLike(200, 2)
	a := (&TopK{Frac: 0.1}).Encode(nil, x)
	f.Add((&TopK{Frac: 0.2}).Encode(nil, gradLike(200, 3)), uint16(200))
	f.Add((&RandK{Frac: 0.2}).Encode(nil, x), uint16(200))
	f.Fuzz(func(t *testing.T, b []byte, n16 uint16) {
		n := int(n16%400) + 1
		av := a
		if n != 200 {
			av = (&TopK{Frac: 0.1}).Encode(nil, gradLike(n, 2))
		}
		m, err := MergeSparse(nil, av, b, n)
		checkDecodeErr(t, err)
		if err != nil {
			return
		}
		var d Decoder
		got, va, vb := make([]float32, n), make([]float32, n), make([]float32, n)
		if err := d.Decode(got, m); err != nil {
			t.Fatalf("merge output does not decode: %v", err)
		}
		if err := d.Decode(va, av); err != nil {
			t.Fatal(err)
		}
		if err := d.Decode(vb, b); err != nil {
			t.Fatalf("merge accepted an operand Decode rejects: %v", err)
		}
		for i := range got {
			if w := va[i] + vb[i]; math.Float32bits(got[i]) != math.Float32bits(w) && !(math.IsNaN(float64(w)) && math.IsNaN(float64(got[i]))) && !(w == 0 && got[i] == 0) {
				t.Fatalf("value %d: merged %g, want %g", i, got[i], w)
			}
		}
	})
}

// FuzzLoadState loads arbitrary bytes as codec state: an error or a codec
// that still encodes, never a panic.
func FuzzLoadState(f *testing.F) {
	for _, spec := range []string{"topk:0.1,ef", "powersgd:2,ef", "randk:0.1,ef"} {
		c, _ := Parse(spec)
		c.Encode(nil, gradLike(50, 1))
		f.Add(AppendState(nil, c), spec)
	}
	f.Fuzz(func(t *testing.T, st []byte, spec string) {
		c, err := Parse(spec)
		if err != nil {
			return
		}
		if err := LoadState(c, st); err != nil {
			if !errors.Is(err, ErrState) {
				t.Fatalf("LoadState error wraps no ErrState: %v", err)
			}
			return
		}
		if p, ok := unwrapAll(c).(*PowerSGD); ok && p.fixed {
			if err := p.SetLayout(nil); err != nil {
				t.Fatal(err)
			}
			p.fixed = false
		}
		n := 50
		if ef, ok := unwrapEF(c); ok && ef.residual != nil {
			n = len(ef.residual)
		}
		if n > 1<<16 {
			return
		}
		c.Encode(nil, make([]float32, n))
	})
}

func unwrapAll(c Codec) Codec {
	for {
		switch w := c.(type) {
		case *Entropy:
			c = w.inner
		case *ErrorFeedback:
			c = w.inner
		default:
			return c
		}
	}
}

func unwrapEF(c Codec) (*ErrorFeedback, bool) {
	if e, ok := c.(*Entropy); ok {
		c = e.inner
	}
	ef, ok := c.(*ErrorFeedback)
	return ef, ok
}

// FuzzRoundTrip encodes arbitrary floats with every codec and checks the
// codec's bound on the decoded values.
func FuzzRoundTrip(f *testing.F) {
	f.Add([]byte{0, 0, 128, 63, 0, 0, 0, 192, 1, 2, 3, 4}, uint8(0))
	f.Fuzz(func(t *testing.T, data []byte, which uint8) {
		x := make([]float32, len(data)/4)
		for i := range x {
			x[i] = math.Float32frombits(uint32(data[4*i]) | uint32(data[4*i+1])<<8 | uint32(data[4*i+2])<<16 | uint32(data[4*i+3])<<24)
		}
		cs := allCodecs()
		c := cs[int(which)%len(cs)]
		b := c.Encode(nil, x)
		y := make([]float32, len(x))
		if err := c.Decode(y, b); err != nil {
			t.Fatalf("%s: own output: %v", c.Name(), err)
		}
		if len(b) > MaxEncodedLen(c.ID(), len(x)) {
			t.Fatalf("%s: %d bytes > MaxEncodedLen", c.Name(), len(b))
		}
		switch q := c.(type) {
		case Int8:
			checkInt8Bound(t, x, y, q.block())
		case FP4:
			checkFourBitBound(t, x, y, fourBitBlock(q.Block), 6)
		case Int4:
			checkFourBitBound(t, x, y, fourBitBlock(q.Block), 14)
		}
		for i, v := range x {
			a := math.Abs(float64(v))
			if math.IsNaN(a) || math.IsInf(a, 0) {
				continue
			}
			e := math.Abs(float64(y[i]) - float64(v))
			switch c.(type) {
			case FP32:
				if math.Float32bits(y[i]) != math.Float32bits(v) {
					t.Fatalf("fp32 value %d: %g became %g", i, v, y[i])
				}
			case FP16:
				if a <= f16Max && e > math.Max(a*0x1p-11, 0x1p-25) {
					t.Fatalf("fp16 value %d: %g became %g", i, v, y[i])
				}
			case BF16:
				if a < 3.38e38 && e > math.Max(a*0x1p-8, 0x1p-134) {
					t.Fatalf("bf16 value %d: %g became %g", i, v, y[i])
				}
			}
		}
	})
}

// checkInt8Bound checks |x̂ − x| ≤ absmax/254 (plus float32 rounding, and
// the subnormal spacing for blocks whose scale is subnormal) in every block
// of finite values.
func checkInt8Bound(t *testing.T, x, y []float32, block int) {
	t.Helper()
	for lo := 0; lo < len(x); lo += block {
		hi := min(lo+block, len(x))
		absmax, finite := blockAbsmax(x[lo:hi])
		if !finite {
			continue
		}
		bound := absmax/254 + absmax*0x1p-20 + 128*0x1p-149
		for i := lo; i < hi; i++ {
			if e := math.Abs(float64(y[i]) - float64(x[i])); e > bound {
				t.Fatalf("int8 value %d: %g became %g, error %g > %g (absmax %g)", i, x[i], y[i], e, bound, absmax)
			}
		}
	}
}

// checkFourBitBound checks |x̂ − x| ≤ absmax/div (FP4: 6, the half step
// between 4 and 6; Int4: 14, half a step of absmax/7) plus float32
// rounding and the subnormal spacing, in every block of finite values, and
// that the sign is kept.
func checkFourBitBound(t *testing.T, x, y []float32, block int, div float64) {
	t.Helper()
	for lo := 0; lo < len(x); lo += block {
		hi := min(lo+block, len(x))
		absmax, finite := blockAbsmax(x[lo:hi])
		if !finite {
			for i := lo; i < hi; i++ {
				if !math.IsNaN(float64(y[i])) {
					t.Fatalf("value %d of a non-finite block decodes to %g, want NaN", i, y[i])
				}
			}
			continue
		}
		bound := absmax/div + absmax*0x1p-20 + 16*0x1p-149
		for i := lo; i < hi; i++ {
			if e := math.Abs(float64(y[i]) - float64(x[i])); e > bound || y[i]*x[i] < 0 {
				t.Fatalf("4-bit value %d: %g became %g, error %g > %g (absmax %g)", i, x[i], y[i], e, bound, absmax)
			}
		}
	}
}

// Huge block sizes in the header are one block, not an overflow.
func TestHugeBlockHeader(t *testing.T) {
	for _, id := range []ID{IDInt8, IDSign, IDFP4, IDInt4} {
		x := gradLike(5, 1)
		var b []byte
		switch id {
		case IDInt8:
			b = Int8{Block: 8}.Encode(nil, x)
		case IDSign:
			b = Sign{Block: 8}.Encode(nil, x)
		case IDFP4:
			b = FP4{Block: 8}.Encode(nil, x)
		case IDInt4:
			b = Int4{Block: 8}.Encode(nil, x)
		}
		// Replace the block uvarint (8) with 2⁶⁴−1.
		huge := append([]byte{b[0], b[1]}, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01)
		huge = append(huge, b[3:]...)
		c, _ := New(id, "")
		y := make([]float32, 5)
		if err := c.Decode(y, huge); err != nil {
			t.Fatalf("id %d: %v", id, err)
		}
		z := make([]float32, 5)
		mustDecode(t, c, z, b)
		if !bitsEqual(y, z) {
			t.Fatalf("id %d: huge block decodes to %v, want %v", id, y, z)
		}
	}
}

// blockAbsmax returns the largest |v| of a block and whether every value
// is finite.
func blockAbsmax(x []float32) (absmax float64, finite bool) {
	finite = true
	for _, v := range x {
		a := math.Abs(float64(v))
		finite = finite && !math.IsNaN(a) && !math.IsInf(a, 0)
		absmax = math.Max(absmax, a)
	}
	return absmax, finite
}
