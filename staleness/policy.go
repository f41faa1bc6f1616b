package staleness

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/starling-ml/starling/internal/spec"
)

// Func is a staleness weight function: it maps τ ≥ 0 to a weight, which
// Policy clamps to [0, 1] (a NaN becomes 0).
type Func func(tau uint64) float64

// Action is what to do with a contribution or with one's own next step.
type Action uint8

// Actions.
const (
	// Accept: apply the contribution with Decision.Weight (or proceed).
	Accept Action = iota
	// Reject: drop the contribution; it is beyond the SSP bound.
	Reject
	// Wait: do not start the next local step yet; this peer is more than the
	// SSP bound ahead of the slowest live peer.
	Wait
)

func (a Action) String() string {
	switch a {
	case Accept:
		return "accept"
	case Reject:
		return "reject"
	case Wait:
		return "wait"
	}
	return "action(" + strconv.Itoa(int(a)) + ")"
}

// Decision is a policy's verdict on one contribution (or one gate check).
type Decision struct {
	Action Action
	// Tau is the staleness (or, from Gate, the lag) the decision was made on.
	Tau uint64
	// Weight is s(τ) ∈ [0, 1] when Action is Accept, 0 otherwise.
	Weight float64
}

func (d Decision) String() string {
	if d.Action == Accept {
		return fmt.Sprintf("τ=%d accept w=%.4f", d.Tau, d.Weight)
	}
	return fmt.Sprintf("τ=%d %s", d.Tau, d.Action)
}

// Policy is a staleness weight function with an optional SSP bound. The
// zero value is the constant policy (weight 1, no bound). Policies are
// small values; copy them freely.
type Policy struct {
	name  string // canonical spec of the weight part; "" is "const"
	w     Func   // nil is constant 1
	bound int64  // SSP bound s; < 0 means none
	set   bool   // bound is meaningful (the zero value has no bound)
}

// Defaults from the papers.
const (
	DefaultPolyA  = 0.5 // FedAsync polynomial exponent
	DefaultHingeA = 10  // FedAsync hinge slope
	DefaultHingeB = 4   // FedAsync hinge knee
)

// Constant returns s(τ) = 1.
func Constant() Policy { return Policy{name: "const"} }

// Polynomial returns s(τ) = (τ+1)^−a (FedAsync). a must be ≥ 0 and finite;
// Parse checks it, this constructor does not.
func Polynomial(a float64) Policy {
	return Policy{
		name: "poly:" + fmtFloat(a),
		w:    func(tau uint64) float64 { return math.Pow(float64(tau)+1, -a) },
	}
}

// Hinge returns s(τ) = 1 for τ ≤ b and 1/(a(τ−b)+1) beyond (FedAsync).
func Hinge(a, b float64) Policy {
	return Policy{
		name: "hinge:" + fmtFloat(a) + "," + fmtFloat(b),
		w: func(tau uint64) float64 {
			t := float64(tau)
			if t <= b {
				return 1
			}
			return 1 / (a*(t-b) + 1)
		},
	}
}

// Inverse returns s(τ) = 1/τ with s(0) = 1: Zhang et al. 2016 divide the
// learning rate by the gradient's staleness.
func Inverse() Policy {
	return Policy{
		name: "inv",
		w: func(tau uint64) float64 {
			if tau == 0 {
				return 1
			}
			return 1 / float64(tau)
		},
	}
}

// InvSqrt returns s(τ) = 1/√(1+τ) (FedBuff).
func InvSqrt() Policy {
	return Policy{
		name: "sqrt",
		w:    func(tau uint64) float64 { return 1 / math.Sqrt(1+float64(tau)) },
	}
}

// SSP returns the constant policy with an SSP bound s.
func SSP(s int) Policy { return Constant().WithBound(s) }

// Custom returns a policy with the weight function f, named name in String.
// name must not contain '+' or ':' if the policy is to be printed and
// parsed back; Parse does not know custom names.
func Custom(name string, f Func) Policy { return Policy{name: name, w: f} }

// WithBound returns p with the SSP bound s (s < 0 removes the bound).
func (p Policy) WithBound(s int) Policy {
	p.bound, p.set = int64(s), s >= 0
	return p
}

// Bound returns the SSP bound and whether there is one.
func (p Policy) Bound() (s int, ok bool) {
	if !p.set || p.bound < 0 {
		return 0, false
	}
	return int(p.bound), true
}

// Weight returns s(τ) clamped to [0, 1], ignoring the bound.
func (p Policy) Weight(tau uint64) float64 {
	if p.w == nil {
		return 1
	}
	v := p.w(tau)
	switch {
	case math.IsNaN(v) || v < 0:
		return 0
	case v > 1:
		return 1
	}
	return v
}

// Decide returns the verdict on a contribution of staleness tau: Reject
// beyond the bound, Accept with s(τ) otherwise.
func (p Policy) Decide(tau uint64) Decision {
	if s, ok := p.Bound(); ok && tau > uint64(s) {
		return Decision{Action: Reject, Tau: tau}
	}
	return Decision{Action: Accept, Tau: tau, Weight: p.Weight(tau)}
}

// Gate returns whether a peer that is lag versions ahead of the slowest live
// peer may start its next step: Wait beyond the bound, Accept (weight 1)
// otherwise. Without a bound it always accepts.
func (p Policy) Gate(lag uint64) Decision {
	if s, ok := p.Bound(); ok && lag > uint64(s) {
		return Decision{Action: Wait, Tau: lag}
	}
	return Decision{Action: Accept, Tau: lag, Weight: 1}
}

// String returns the policy's canonical spec, which Parse reads back for
// the built-in policies.
func (p Policy) String() string {
	name := p.name
	if name == "" {
		name = "const"
	}
	s, ok := p.Bound()
	if !ok {
		return name
	}
	ssp := "ssp:" + strconv.Itoa(s)
	if name == "const" {
		return ssp
	}
	return name + "+" + ssp
}

// fmtFloat prints f so that Parse reads it back: shortest round-trip form,
// without the '+' of a positive exponent (which would split the spec).
func fmtFloat(f float64) string {
	return strings.Replace(strconv.FormatFloat(f, 'g', -1, 64), "e+", "e", 1)
}

// Parse reads a policy spec: a weight term, an SSP term, or both joined by
// '+' in either order. Weight terms: "const", "poly[:a]", "hinge[:a,b]",
// "inv", "sqrt"; omitted arguments take the papers' defaults. SSP term:
// "ssp:s" with an integer s ≥ 0. Errors wrap ErrBadSpec.
func Parse(s string) (Policy, error) {
	terms, err := spec.Parse(s)
	if err != nil {
		return Policy{}, fmt.Errorf("%w: %w (want const, poly:a, hinge:a,b, inv, sqrt or ssp:s)", ErrBadSpec, err)
	}
	var (
		p            = Constant()
		haveW, haveB bool
		bound        = -1
	)
	for _, t := range terms {
		r := t.Reader()
		switch t.Name {
		case "ssp":
			if haveB {
				return Policy{}, fmt.Errorf("%w: %w", ErrBadSpec, t.Errorf("more than one ssp term"))
			}
			r.Require("s")
			bound, haveB = r.Int("s", -1, 0, math.MaxInt32), true
		case "const", "constant", "inv", "sqrt", "poly", "hinge":
			if haveW {
				return Policy{}, fmt.Errorf("%w: %w", ErrBadSpec, t.Errorf("more than one weight term"))
			}
			haveW = true
			switch t.Name {
			case "const", "constant":
				p = Constant()
			case "inv":
				p = Inverse()
			case "sqrt":
				p = InvSqrt()
			case "poly":
				p = Polynomial(r.Float("a", DefaultPolyA, spec.AtLeast(0)))
			case "hinge": // both or neither
				a := r.Float("a", DefaultHingeA, spec.AtLeast(0))
				if len(t.Args) > 0 {
					r.Require("b")
				}
				p = Hinge(a, r.Float("b", DefaultHingeB, spec.AtLeast(0)))
			}
		default:
			return Policy{}, fmt.Errorf("%w: %w", ErrBadSpec, t.Errorf("unknown policy %q (want const, poly:a, hinge:a,b, inv, sqrt or ssp:s)", t.Name))
		}
		if err := r.Done(); err != nil {
			return Policy{}, fmt.Errorf("%w: %w", ErrBadSpec, err)
		}
	}
	return p.WithBound(bound), nil
}

// MarshalText implements encoding.TextMarshaler: the canonical spec.
func (p Policy) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler: flag.TextVar and
// encoding/json parse a policy through it (Parse).
func (p *Policy) UnmarshalText(b []byte) error {
	q, err := Parse(string(b))
	if err != nil {
		return err
	}
	*p = q
	return nil
}
