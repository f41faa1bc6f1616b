package data_test

import (
	"fmt"

	"github.com/starling-ml/starling/data"
)

func ExampleTextWindows() {
	corpus := &data.Corpus{Root: "example", Docs: []data.Document{{Name: "a.txt", Text: []byte("abcabd")}}}
	vocab, _ := data.NewVocab(corpus, data.ByteLevel)
	windows, _ := data.TextWindows(corpus, vocab, 2, 1)
	fmt.Println(vocab.Size(), "tokens,", windows.Len(), "windows")
	x, y := make([]float32, 2), make([]int32, 2)
	for i := range windows.Len() {
		windows.Batch([]int{i}, x, y)
		fmt.Printf("%q → %q\n", vocab.Decode(nil, []int32{int32(x[0]), int32(x[1])}), vocab.Decode(nil, y))
	}
	// Output:
	// 5 tokens, 4 windows
	// "ab" → "bc"
	// "bc" → "ca"
	// "ca" → "ab"
	// "ab" → "bd"
}
