package compression

import (
	"fmt"
	"sync"
	"testing"
)

// Benchmarks report throughput in input float32 bytes per second (SetBytes
// = 4·n) and "ratio", the fp32 size over the encoded size.
//
//	go test -run '^$' -bench . -benchtime 10x ./compression/

var benchSizes = []int{1 << 16, 1 << 20, 1 << 24}

var benchData = sync.OnceValue(func() []float32 { return gradLike(1<<24, 42) })

var benchSpecs = []string{
	"fp32", "fp16", "bf16", "int8", "topk:0.01,entropy=none", "randk:0.01", "sign", "powersgd:rank=4", "fp4", "int4",
}

func BenchmarkEncode(b *testing.B) {
	for _, spec := range append(benchSpecs, "fp16:ef", "int8:ef", "topk:0.01,ef,entropy=none", "sign:ef", "topk:0.01") {
		for _, n := range benchSizes {
			b.Run(fmt.Sprintf("%s/n=%d", spec, n), func(b *testing.B) {
				c, err := Parse(spec)
				if err != nil {
					b.Fatal(err)
				}
				x := benchData()[:n]
				buf := c.Encode(nil, x)
				b.SetBytes(int64(4 * n))
				b.ReportAllocs()
				b.ResetTimer()
				for b.Loop() {
					buf = c.Encode(buf, x)
				}
				b.StopTimer()
				b.ReportMetric(float64(4*n)/float64(len(buf)), "ratio")
				checkBench(b, c, buf, n)
			})
		}
	}
}

func BenchmarkDecode(b *testing.B) {
	for _, spec := range append(benchSpecs, "topk:0.01") {
		for _, n := range benchSizes {
			b.Run(fmt.Sprintf("%s/n=%d", spec, n), func(b *testing.B) {
				c, err := Parse(spec)
				if err != nil {
					b.Fatal(err)
				}
				x := benchData()[:n]
				buf := c.Encode(nil, x)
				y := make([]float32, n)
				if err := c.Decode(y, buf); err != nil { // warm up scratch and coders
					b.Fatal(err)
				}
				b.SetBytes(int64(4 * n))
				b.ReportAllocs()
				b.ResetTimer()
				for b.Loop() {
					if err := c.Decode(y, buf); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				b.ReportMetric(float64(4*n)/float64(len(buf)), "ratio")
				checkBench(b, c, buf, n)
			})
		}
	}
}

// checkBench makes a benchmark check its own result: the bytes decode with a
// fresh decoder and the values are of the right kind.
func checkBench(b *testing.B, c Codec, buf []byte, n int) {
	d, err := New(c.ID(), "")
	if err != nil {
		b.Fatal(err)
	}
	y := make([]float32, n)
	if err := d.Decode(y, buf); err != nil {
		b.Fatalf("%s: %v", c.Name(), err)
	}
	if _, ok := unwrapAll(c).(FP32); ok && !bitsEqual(y, benchData()[:n]) {
		b.Fatal("fp32 round trip is not exact")
	}
}

// BenchmarkEntropy measures the entropy stage alone on each codec's bytes
// (1 M gradient-like values): throughput on the inner bytes, "saving" (the
// fraction of the inner bytes the compressor removes, before the stage's
// store-if-under-1/32 rule) and "stored" (1 when the stage then stores them).
func BenchmarkEntropy(b *testing.B) {
	n := 1 << 20
	x := benchData()[:n]
	for _, spec := range benchSpecs {
		inner, err := Parse(spec)
		if err != nil {
			b.Fatal(err)
		}
		if e, ok := inner.(*Entropy); ok {
			inner = e.inner
		}
		p := inner.Encode(nil, x)
		for _, mode := range []EntropyMode{EntropyS2, EntropyZstd} {
			e, err := NewEntropy(inner, mode)
			if err != nil {
				b.Fatal(err)
			}
			out := e.wrapID(nil, p, inner.ID())
			var raw []byte
			b.Run(fmt.Sprintf("%s/%v/compress", specOf(inner), mode), func(b *testing.B) {
				b.SetBytes(int64(len(p)))
				b.ReportAllocs()
				for b.Loop() {
					out = e.wrapID(out, p, inner.ID())
				}
				raw = e.compress(raw[:0], p)
				b.ReportMetric(1-float64(len(raw))/float64(len(p)), "saving")
				b.ReportMetric(map[bool]float64{true: 1}[EntropyMode(out[1]) == EntropyStored], "stored")
			})
			b.Run(fmt.Sprintf("%s/%v/decompress", specOf(inner), mode), func(b *testing.B) {
				b.SetBytes(int64(len(p)))
				b.ReportAllocs()
				for b.Loop() {
					if _, err := e.unwrap(out, inner.ID(), n); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkMergeSparse measures one tree hop of top-k 1 % partial sums.
func BenchmarkMergeSparse(b *testing.B) {
	n := 1 << 22
	x := benchData()
	t1 := (&TopK{Frac: 0.01}).Encode(nil, x[:n])
	t2 := (&TopK{Frac: 0.01}).Encode(nil, x[n:2*n])
	var out []byte
	b.SetBytes(int64(len(t1) + len(t2)))
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if out, err = MergeSparse(out, t1, t2, n); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkKernels compares each dispatched bulk loop (AVX2 where the CPU has
// it) with its pure-Go version on the same 16 M values, in the same run.
func BenchmarkKernels(b *testing.B) {
	x := benchData()
	n := len(x)
	half := make([]byte, 2*n)
	q := make([]byte, n)
	y := make([]float32, n)
	encodeF16Go(half, x)
	quantiseGo(q, x, 0.5)
	kernels := []struct {
		name    string
		fast, g func()
	}{
		{"fp16-encode", func() { encodeF16(half, x) }, func() { encodeF16Go(half, x) }},
		{"fp16-decode", func() { decodeF16(y, half) }, func() { decodeF16Go(y, half) }},
		{"bf16-encode", func() { encodeBF16(half, x) }, func() { encodeBF16Go(half, x) }},
		{"bf16-decode", func() { decodeBF16(y, half) }, func() { decodeBF16Go(y, half) }},
		{"int8-absmax", func() { absmaxBits(x) }, func() { absmaxBitsGo(x) }},
		{"int8-quantise", func() { quantise(q, x, 1e3) }, func() { quantiseGo(q, x, 1e3) }},
		{"int8-dequantise", func() { dequantise(y, q, 1e-3) }, func() { dequantiseGo(y, q, 1e-3) }},
	}
	for _, k := range kernels {
		for _, v := range []struct {
			name string
			f    func()
		}{{"dispatched", k.fast}, {"purego", k.g}} {
			b.Run(k.name+"/"+v.name, func(b *testing.B) {
				b.SetBytes(int64(4 * n))
				for b.Loop() {
					v.f()
				}
			})
		}
	}
}
