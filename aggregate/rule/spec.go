package rule

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Parse parses a rule spec, the value of a --rule flag:
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
func Parse(spec string) (Rule, error) {
	name, args, hasArgs := strings.Cut(strings.TrimSpace(spec), ":")
	kv, bare, err := parseArgs(args)
	if err != nil {
		return nil, fmt.Errorf("%w: %q: %v", ErrBadSpec, spec, err)
	}
	if hasArgs && len(kv) == 0 && bare == "" {
		return nil, fmt.Errorf("%w: %q: empty arguments", ErrBadSpec, spec)
	}
	noArgs := func(r Rule) (Rule, error) {
		if hasArgs {
			return nil, fmt.Errorf("%w: %q takes no arguments", ErrBadSpec, name)
		}
		return r, nil
	}
	switch strings.ToLower(name) {
	case "sum":
		return noArgs(Sum{})
	case "mean":
		return noArgs(Mean{})
	case "median":
		return noArgs(Median{})
	case "trimmed":
		if bare != "" {
			if len(kv) != 0 {
				return nil, fmt.Errorf("%w: %q: mixes a bare value with key=value", ErrBadSpec, spec)
			}
			kv = map[string]string{"beta": bare}
		}
		r := Trimmed{}
		if err := takeArgs(kv, map[string]any{"beta": &r.Beta}, "beta"); err != nil {
			return nil, fmt.Errorf("%w: %q: %v", ErrBadSpec, spec, err)
		}
		return r, wrapSpec(spec, r.Validate())
	case "krum":
		r := Krum{M: 1}
		if bare != "" {
			return nil, fmt.Errorf("%w: %q: want krum:f=N[,m=M]", ErrBadSpec, spec)
		}
		if err := takeArgs(kv, map[string]any{"f": &r.F, "m": &r.M}, "f"); err != nil {
			return nil, fmt.Errorf("%w: %q: %v", ErrBadSpec, spec, err)
		}
		return r, wrapSpec(spec, r.Validate())
	case "cclip":
		r := CClip{}
		if bare != "" {
			return nil, fmt.Errorf("%w: %q: want cclip:tau=T,iters=L", ErrBadSpec, spec)
		}
		var start string
		if err := takeArgs(kv, map[string]any{"tau": &r.Tau, "iters": &r.Iters, "start": &start}, "tau", "iters"); err != nil {
			return nil, fmt.Errorf("%w: %q: %v", ErrBadSpec, spec, err)
		}
		switch start {
		case "", "median":
			r.From = StartMedian
		case "zero":
			r.From = StartZero
		default:
			return nil, fmt.Errorf("%w: %q: start must be median or zero", ErrBadSpec, spec)
		}
		return r, wrapSpec(spec, r.Validate())
	}
	return nil, fmt.Errorf("%w: unknown rule %q (want sum, mean, median, trimmed, krum or cclip)", ErrBadSpec, name)
}

func wrapSpec(spec string, err error) error {
	if err != nil {
		return fmt.Errorf("%q: %w", spec, err)
	}
	return nil
}

// parseArgs splits "a=1,b=2" into a map, or returns a lone "0.2" as bare.
func parseArgs(args string) (kv map[string]string, bare string, err error) {
	if args == "" {
		return nil, "", nil
	}
	kv = map[string]string{}
	for _, part := range strings.Split(args, ",") {
		k, v, ok := strings.Cut(part, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok {
			if bare != "" || len(kv) != 0 || strings.Contains(args, ",") {
				return nil, "", fmt.Errorf("argument %q is not key=value", part)
			}
			bare = k
			continue
		}
		if k == "" || v == "" {
			return nil, "", fmt.Errorf("argument %q is not key=value", part)
		}
		k = strings.ToLower(k)
		if _, dup := kv[k]; dup {
			return nil, "", fmt.Errorf("argument %q given twice", k)
		}
		kv[k] = v
	}
	return kv, bare, nil
}

// takeArgs stores kv into dst (*int, *float64 or *string per key), refusing
// unknown keys and missing required ones.
func takeArgs(kv map[string]string, dst map[string]any, required ...string) error {
	for _, k := range required {
		if _, ok := kv[k]; !ok {
			return fmt.Errorf("missing %s=", k)
		}
	}
	for k, v := range kv {
		p, ok := dst[k]
		if !ok {
			return fmt.Errorf("unknown argument %q", k)
		}
		switch p := p.(type) {
		case *int:
			n, err := strconv.Atoi(v)
			if err != nil {
				return fmt.Errorf("%s=%q is not an integer", k, v)
			}
			*p = n
		case *float64:
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
				return fmt.Errorf("%s=%q is not a finite number", k, v)
			}
			*p = f
		case *string:
			*p = strings.ToLower(v)
		}
	}
	return nil
}

func fmtFloat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }
