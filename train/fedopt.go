package train

import (
	"errors"
	"fmt"
	"math"
)

// ErrStrategy reports an unknown strategy (federated, asynchronous or
// gossip) or bad settings for one.
var ErrStrategy = errors.New("train: bad strategy settings")

// ServerOpt turns the round's averaged client delta Δ = mean(x_i − x) into
// a new global model. Every peer applies it identically to the same Δ, so
// its state is part of the global state a late peer fetches. Pure: no I/O,
// no goroutines.
type ServerOpt interface {
	// Apply updates global in place from delta.
	Apply(global, delta []float32)
	// State returns the optimiser's state vector (a view; may be empty).
	State() []float32
	// Name describes the optimiser and its settings.
	Name() string
}

// FedAvgServer is FedAvg's server step, x ← x + η·Δ (η = 1 makes the new
// model the weighted average of the clients').
type FedAvgServer struct{ LR float32 }

// Apply implements ServerOpt.
func (s *FedAvgServer) Apply(global, delta []float32) {
	for i, d := range delta {
		global[i] += s.LR * d
	}
}

// State implements ServerOpt.
func (s *FedAvgServer) State() []float32 { return nil }

// Name implements ServerOpt.
func (s *FedAvgServer) Name() string { return fmt.Sprintf("fedavg(server_lr=%g)", s.LR) }

// FedOptServer is the adaptive server optimisers of Reddi et al. 2021
// ("Adaptive Federated Optimization", Algorithm 2): FedAdagrad, FedAdam and
// FedYogi, with the paper's update (no bias correction).
type FedOptServer struct {
	Kind         string  // "adagrad", "adam" or "yogi"
	LR           float32 // η, server learning rate
	Beta1, Beta2 float32
	Tau          float32 // adaptivity τ
	state        []float32
}

// NewFedOptServer returns a FedOpt server optimiser for n parameters with
// the paper's defaults where zero: β1 = 0.9, β2 = 0.99, τ = 1e-3.
func NewFedOptServer(kind string, lr float32, n int) (*FedOptServer, error) {
	switch kind {
	case "adagrad", "adam", "yogi":
	default:
		return nil, fmt.Errorf("%w: unknown FedOpt kind %q", ErrStrategy, kind)
	}
	return &FedOptServer{Kind: kind, LR: lr, Beta1: 0.9, Beta2: 0.99, Tau: 1e-3, state: make([]float32, 2*n)}, nil
}

// Apply implements ServerOpt.
func (s *FedOptServer) Apply(global, delta []float32) {
	n := len(global)
	m, v := s.state[:n], s.state[n:2*n]
	b1, b2 := s.Beta1, s.Beta2
	for i, d := range delta {
		m[i] = b1*m[i] + (1-b1)*d
		d2 := d * d
		switch s.Kind {
		case "adagrad":
			v[i] += d2
		case "adam":
			v[i] = b2*v[i] + (1-b2)*d2
		case "yogi":
			diff := v[i] - d2
			sign := float32(0)
			if diff > 0 {
				sign = 1
			} else if diff < 0 {
				sign = -1
			}
			v[i] -= (1 - b2) * d2 * sign
		}
		global[i] += s.LR * m[i] / (float32(math.Sqrt(float64(v[i]))) + s.Tau)
	}
}

// State implements ServerOpt.
func (s *FedOptServer) State() []float32 { return s.state }

// Name implements ServerOpt.
func (s *FedOptServer) Name() string {
	return fmt.Sprintf("fed%s(server_lr=%g, betas=(%g, %g), tau=%g)", s.Kind, s.LR, s.Beta1, s.Beta2, s.Tau)
}

// NesterovServer is DiLoCo's outer optimiser (Douillard et al. 2023): SGD
// with Nesterov momentum on the outer gradient g = −Δ.
type NesterovServer struct {
	LR, Momentum float32
	buf          []float32
}

// NewNesterovServer returns DiLoCo's outer optimiser for n parameters
// (the paper uses lr 0.7, momentum 0.9).
func NewNesterovServer(lr, momentum float32, n int) *NesterovServer {
	return &NesterovServer{LR: lr, Momentum: momentum, buf: make([]float32, n)}
}

// Apply implements ServerOpt.
func (s *NesterovServer) Apply(global, delta []float32) {
	mu := s.Momentum
	for i, d := range delta {
		g := -d
		b := mu*s.buf[i] + g
		s.buf[i] = b
		global[i] -= s.LR * (g + mu*b)
	}
}

// State implements ServerOpt.
func (s *NesterovServer) State() []float32 { return s.buf }

// Name implements ServerOpt.
func (s *NesterovServer) Name() string {
	return fmt.Sprintf("outer-nesterov(lr=%g, momentum=%g)", s.LR, s.Momentum)
}
