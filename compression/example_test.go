package compression_test

import (
	"fmt"

	"github.com/starling-ml/starling/compression"
)

// A sender picks a codec from a spec; the receiver knows only the id and the
// vector length.
func Example() {
	grad := []float32{0.5, -0.01, 0.002, -2, 0.03, 0, 0.7, -0.4}

	enc, err := compression.Parse("topk:0.25,ef")
	if err != nil {
		panic(err)
	}
	payload := enc.Encode(nil, grad)

	dec, err := compression.New(enc.ID(), "")
	if err != nil {
		panic(err)
	}
	got := make([]float32, len(grad))
	if err := dec.Decode(got, payload); err != nil {
		panic(err)
	}
	fmt.Println(enc.Name())
	fmt.Println(got)
	fmt.Println("kept for later:", enc.(*compression.Entropy).Inner().(*compression.ErrorFeedback).Residual())
	// Output:
	// topk:0.25,ef,entropy=zstd
	// [0 0 0 -2 0 0 0.7 0]
	// kept for later: [0.5 -0.01 0.002 0 0.03 0 0 -0.4]
}

// A hop of an all-reduce sums what its children sent and forwards the sum.
func ExampleCombiner() {
	a := []float32{1, 0, 0, 4, 0, 0}
	b := []float32{0, 2, 0, 5, 0, 0}
	topk := &compression.TopK{Frac: 0.34} // k = 2 of 6
	ea := topk.Encode(nil, a)
	eb := topk.Encode(nil, b)

	cb := compression.NewCombiner(topk)
	cb.Reset(len(a))
	for _, e := range [][]byte{ea, eb} {
		if err := cb.Add(e); err != nil {
			panic(err)
		}
	}
	up := cb.Encode(nil) // still sparse: indices 0, 1, 3

	var d compression.Decoder
	sum := make([]float32, len(a))
	if err := d.Decode(sum, up); err != nil {
		panic(err)
	}
	fmt.Println(sum, cb.Dense())
	// Output: [1 2 0 9 0 0] false
}

func ExampleParse_errors() {
	_, err := compression.Parse("topk:2")
	fmt.Println(err)
	// Output: compression: bad codec spec: spec "topk:2": topk: frac="2": want a number in (0, 1]
}
