package nn_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/starling-ml/starling/nn"
)

// A small causal language model: token and position embeddings, one
// pre-LayerNorm attention block with a skip connection, and a head.
func ExampleNewModel() {
	block := nn.NewNamedSequential(
		nn.Child{Name: "ln", Layer: &nn.LayerNorm{Dim: 16}},
		nn.Child{Name: "attn", Layer: &nn.CausalSelfAttention{Dim: 16, Heads: 2}},
	)
	root := nn.NewNamedSequential(
		nn.Child{Name: "wte", Layer: &nn.Embedding{Num: 10, Dim: 16}},
		nn.Child{Name: "wpe", Layer: &nn.PositionEmbedding{T: 8, Dim: 16}},
		nn.Child{Name: "block", Layer: nn.NewResidual(block)},
		nn.Child{Name: "head", Layer: &nn.Dense{In: 16, Out: 10}},
	)
	m, err := nn.NewModel(root, nn.Shape{8}, nn.NextTokenCrossEntropy{}, 1)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, v := range m.Views() {
		fmt.Println(v.Name, v.Shape)
	}
	x := []float32{1, 2, 3, 4, 5, 6, 7, 8} // one sample of 8 token ids
	y := []int32{2, 3, 4, 5, 6, 7, 8, 9}   // the next token at each position
	loss, _ := m.ForwardBackward(x, y)
	fmt.Printf("%d parameters, output %v, loss %.2f\n", len(m.Params), m.Output, loss)
	// Output:
	// wte.weight [10 16]
	// wpe.weight [8 16]
	// block.ln.weight [16]
	// block.ln.bias [16]
	// block.attn.c_attn.weight [48 16]
	// block.attn.c_attn.bias [48]
	// block.attn.c_proj.weight [16 16]
	// block.attn.c_proj.bias [16]
	// head.weight [10 16]
	// head.bias [10]
	// 1578 parameters, output [8 10], loss 2.78
}

// Weights saved from one model and loaded into another that does not
// match are refused with one line that names the tensor, both shapes and
// the architecture the file was saved from.
func ExampleModel_LoadFile() {
	dir, err := os.MkdirTemp("", "weights")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "w.safetensors")
	small, _ := nn.New("mlp:784-128-10", 1)
	if err := small.SaveFile(path); err != nil {
		fmt.Println(err)
		return
	}
	m, _ := nn.New("mlp", 1) // 784-200-200-10
	err = m.LoadFile(path)
	fmt.Println(strings.TrimPrefix(err.Error(), dir+string(filepath.Separator)))
	// Output:
	// w.safetensors: nn: shape mismatch: tensor "0.weight" has shape [128 784], the model's is [200 784] (the file holds mlp:784-128-10)
}
