package rule

import (
	"fmt"
	"strconv"

	"github.com/starling-ml/starling/internal/spec"
)

// Parse parses a rule spec, the value of an --aggregate flag:
//
//	sum                       Σ xᵢ
//	mean                      weighted mean, weights = sample counts
//	median                    coordinate-wise median
//	trimmed:0.2               coordinate-wise trimmed mean, β = 0.2 (also trimmed:beta=0.2)
//	krum:f=2                  Krum tolerating f = 2 Byzantine peers
//	krum:f=2,m=3              Multi-Krum: average the m = 3 best
//	cclip:tau=10,iters=3      centered clipping, τ = 10, 3 iterations (start=zero|median)
//
// Errors wrap ErrBadSpec.
func Parse(s string) (Rule, error) {
	t, err := spec.One(s)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadSpec, err)
	}
	r := t.Reader()
	var out Rule
	switch t.Name {
	case "sum":
		out = Sum{}
	case "mean":
		out = Mean{}
	case "median":
		out = Median{}
	case "trimmed":
		r.Require("beta")
		out = Trimmed{Beta: r.Float("beta", 0, spec.In(0, 0.5, true, false))}
	case "krum":
		r.Keyed()
		r.Require("f")
		out = Krum{F: r.Int("f", 0, 0, 1<<20), M: r.Int("m", 1, 1, 1<<20)}
	case "cclip":
		r.Keyed()
		r.Require("tau")
		r.Require("iters")
		c := CClip{Tau: r.Float("tau", 0, spec.Positive()), Iters: r.Int("iters", 0, 1, maxCClipIters)}
		if r.String("start", "median", "median", "zero") == "zero" {
			c.From = StartZero
		}
		out = c
	default:
		return nil, fmt.Errorf("%w: %w", ErrBadSpec, t.Errorf("unknown rule %q (want sum, mean, median, trimmed, krum or cclip)", t.Name))
	}
	if err := r.Done(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadSpec, err)
	}
	return out, nil
}

// MarshalText implements encoding.TextMarshaler for every rule: a rule in
// a JSON document reads as its spec.
func (r Sum) MarshalText() ([]byte, error)     { return []byte(r.String()), nil }
func (r Mean) MarshalText() ([]byte, error)    { return []byte(r.String()), nil }
func (r Median) MarshalText() ([]byte, error)  { return []byte(r.String()), nil }
func (r Trimmed) MarshalText() ([]byte, error) { return []byte(r.String()), nil }
func (r Krum) MarshalText() ([]byte, error)    { return []byte(r.String()), nil }
func (r CClip) MarshalText() ([]byte, error)   { return []byte(r.String()), nil }

// Flag is a flag.Value that parses a rule spec into *Rule.
type Flag struct{ Rule *Rule }

// String implements flag.Value.
func (f Flag) String() string {
	if f.Rule == nil || *f.Rule == nil {
		return ""
	}
	return (*f.Rule).String()
}

// Set implements flag.Value (Parse).
func (f Flag) Set(s string) error {
	r, err := Parse(s)
	if err != nil {
		return err
	}
	*f.Rule = r
	return nil
}

func fmtFloat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }
