package train

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/starling-ml/starling/peerid"
)

func TestSampleDeterministic(t *testing.T) {
	members := make([]peerid.ID, 100)
	for i := range members {
		members[i] = peerid.ID(fmt.Sprintf("p%03d", i))
	}
	a := Sample(1, 7, members, 0.1)
	b := Sample(1, 7, slices.Clone(members), 0.1)
	if len(a) != 10 || !slices.Equal(a, b) || !slices.IsSorted(a) {
		t.Fatalf("sample %v vs %v", a, b)
	}
	if c := Sample(1, 8, members, 0.1); slices.Equal(a, c) {
		t.Fatal("different rounds gave the same sample")
	}
	if got := Sample(1, 1, members[:3], 0.01); len(got) != 1 {
		t.Fatalf("at least one peer: got %v", got)
	}
	if got := Sample(1, 1, members[:3], 1); len(got) != 3 {
		t.Fatalf("C=1: got %v", got)
	}
	// Every peer is sampled about as often as the others.
	count := map[peerid.ID]int{}
	for r := uint64(1); r <= 1000; r++ {
		for _, p := range Sample(3, r, members, 0.1) {
			count[p]++
		}
	}
	for p, c := range count {
		if c < 60 || c > 140 {
			t.Fatalf("%s sampled %d times in 1000 rounds, want about 100", p, c)
		}
	}
}

func TestParseStrategy(t *testing.T) {
	var c FedConfig
	if err := c.ParseStrategy("fedprox:mu=0.1"); err != nil || c.Mu != 0.1 || c.ServerLR != 1 {
		t.Fatalf("%+v %v", c, err)
	}
	if err := c.ParseStrategy("diloco:h=20"); err != nil || c.LocalSteps != 20 || c.LocalEpochs != 0 || c.ServerLR != 0.7 || c.ResetClientOpt {
		t.Fatalf("%+v %v", c, err)
	}
	for _, bad := range []string{"fedsgdx", "fedprox:mu", "fedadam:beta=3", "fedavg:lr=nan"} {
		if err := c.ParseStrategy(bad); err == nil {
			t.Errorf("%q: want error", bad)
		}
	}
}

func TestServerOpts(t *testing.T) {
	// FedAvg with η=1 turns the global model into the mean of the clients'.
	g := []float32{1, 2}
	(&FedAvgServer{LR: 1}).Apply(g, []float32{0.5, -1})
	if g[0] != 1.5 || g[1] != 1 {
		t.Fatalf("fedavg: %v", g)
	}
	// FedAdam's first step is η·(1−β1)Δ/(√((1−β2)Δ²)+τ) per coordinate.
	s, _ := NewFedOptServer("adam", 0.01, 1)
	g = []float32{0}
	s.Apply(g, []float32{0.2})
	want := 0.01 * 0.1 * 0.2 / (math.Sqrt(0.01*0.04) + 1e-3)
	if math.Abs(float64(g[0])-want) > 1e-7 {
		t.Fatalf("fedadam: %v want %v", g[0], want)
	}
	y, _ := NewFedOptServer("yogi", 0.01, 1)
	y.Apply([]float32{0}, []float32{0.2})
	if v := y.State()[1]; math.Abs(float64(v)-0.01*0.04) > 1e-9 {
		t.Fatalf("fedyogi v after one step from 0: %v", v)
	}
	nv := NewNesterovServer(0.5, 0.9, 1)
	g = []float32{1}
	nv.Apply(g, []float32{-0.2}) // outer gradient 0.2: buf 0.2, step 0.5·(0.2+0.18)
	if math.Abs(float64(g[0])-(1-0.5*0.38)) > 1e-6 {
		t.Fatalf("nesterov: %v", g[0])
	}
}

func TestFedConfigValidate(t *testing.T) {
	for _, mut := range []func(*FedConfig){
		func(c *FedConfig) { c.Rounds = 0 },
		func(c *FedConfig) { c.Fraction = 0 },
		func(c *FedConfig) { c.Fraction = 1.5 },
		func(c *FedConfig) { c.LocalEpochs, c.LocalSteps = 0, 0 },
		func(c *FedConfig) { c.Mu = -1 },
	} {
		c := DefaultFedConfig()
		mut(&c)
		if c.Validate() == nil {
			t.Errorf("%+v: want error", c)
		}
	}
}
