package average_test

import (
	"fmt"

	"github.com/starling-ml/starling/gossip/average"
)

func ExampleExpGraphPeer() {
	// Peer 0 of 8 sends to peers 1, 2, 4 ahead, then starts over.
	for k := range uint64(4) {
		fmt.Print(average.ExpGraphPeer(0, 8, k), " ")
	}
	fmt.Println()
	// Output: 1 2 4 1
}

func ExamplePushSum() {
	// Four peers hold 0, 4, 8, 12. On the one-peer exponential graph,
	// log2(4) = 2 synchronous rounds make every estimate the exact mean.
	const n = 4
	peers := make([]*average.PushSum, n)
	for i := range peers {
		peers[i] = average.NewPushSum([]float32{float32(4 * i)})
	}
	for k := range uint64(2) {
		type msg struct {
			to int
			x  []float32
			w  float64
		}
		var inbox []msg
		for i, p := range peers {
			x, w := p.Share(nil, 1)
			inbox = append(inbox, msg{average.ExpGraphPeer(i, n, k), x, w})
		}
		for _, m := range inbox {
			if err := peers[m.to].Absorb(m.x, m.w); err != nil {
				panic(err)
			}
		}
	}
	for _, p := range peers {
		fmt.Print(p.Estimate(nil), " w=", p.W, " ")
	}
	fmt.Println()
	// Output: [6] w=1 [6] w=1 [6] w=1 [6] w=1
}
