package staleness_test

import (
	"fmt"
	"time"

	"github.com/starling-ml/starling/staleness"
)

func ExampleParse() {
	p, err := staleness.Parse("hinge:10,4+ssp:8")
	if err != nil {
		panic(err)
	}
	for _, tau := range []uint64{0, 4, 5, 9} {
		fmt.Println(p.Decide(tau))
	}
	// Output:
	// τ=0 accept w=1.0000
	// τ=4 accept w=1.0000
	// τ=5 accept w=0.0909
	// τ=9 reject
}

func ExampleMixer() {
	vc := staleness.NewVersionClock(12, 30*time.Second)
	mx, _ := staleness.NewMixer(staleness.MixerConfig{Alpha: 0.5, Policy: staleness.Polynomial(0.5)}, vc)
	model := []float32{0, 0}
	// A model computed from version 9 arrives at version 12: τ = 3,
	// s = 4^−0.5 = 0.5, so the model moves a quarter of the way.
	d, err := mx.Mix(model, []float32{4, -8}, 9)
	fmt.Println(d, err, model, vc.Local())
	// Output: τ=3 accept w=0.5000 <nil> [1 -2] 13
}
