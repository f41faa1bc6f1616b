// Package spec reads the small spec strings Starling's flags take: a
// codec ("topk:0.01,ef"), an aggregation rule ("krum:f=2,m=3"), a
// staleness policy ("poly:0.5+ssp:3"), a federated strategy
// ("diloco:h=50,lr=0.7"), a learning-rate schedule ("warmup:100+cosine")
// and a model ("mlp:784-200-10"). They share one grammar:
//
//	spec = term { "+" term }
//	term = name [ ":" arg { "," arg } ]
//	arg  = value | key "=" value
//
// Names and keys are case-insensitive; blanks around them are ignored.
// A package that reads a term declares its parameters through a Reader,
// and every problem comes back as an error that quotes the whole spec and
// says what is wrong in one line:
//
//	t, err := spec.One(s)                 // exactly one term
//	r := t.Reader()
//	ef := r.Flag("ef")                    // flags (bare words) first
//	frac := r.Float("frac", 0.01, spec.In(0, 1, false, true))
//	if err := r.Done(); err != nil { … }   // unknown or malformed arguments
//
// Pure: no I/O, no goroutines.
package spec

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxLen bounds the length of a spec (they come from flags and config
// files).
const MaxLen = 256

// ErrSyntax is wrapped by every error of this package.
var ErrSyntax = errors.New("spec")

// Term is one name and its arguments, in order.
type Term struct {
	Name string
	Args []Arg
	spec string // the whole spec, for errors
}

// Arg is one argument; Key is empty for a positional value.
type Arg struct {
	Key, Value string
}

// Errorf returns an error about term t's spec: `spec "…": …`.
func (t Term) Errorf(format string, args ...any) error {
	return fmt.Errorf("%w %q: %s", ErrSyntax, t.spec, fmt.Sprintf(format, args...))
}

// String returns the term as written, normalised: "topk:frac=0.01,ef".
func (t Term) String() string {
	if len(t.Args) == 0 {
		return t.Name
	}
	parts := make([]string, len(t.Args))
	for i, a := range t.Args {
		parts[i] = a.Value
		if a.Key != "" {
			parts[i] = a.Key + "=" + a.Value
		}
	}
	return t.Name + ":" + strings.Join(parts, ",")
}

// Parse splits s into its terms.
func Parse(s string) ([]Term, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w %q: %s", ErrSyntax, s, fmt.Sprintf(format, args...))
	}
	if len(s) > MaxLen {
		return nil, bad("longer than %d bytes", MaxLen)
	}
	if strings.TrimSpace(s) == "" {
		return nil, bad("empty")
	}
	if !utf8.ValidString(s) || strings.ContainsFunc(s, unicode.IsControl) {
		return nil, bad("not printable text")
	}
	var out []Term
	for _, ts := range strings.Split(s, "+") {
		name, args, hasArgs := strings.Cut(ts, ":")
		t := Term{Name: strings.ToLower(strings.TrimSpace(name)), spec: s}
		if t.Name == "" {
			return nil, bad("a term has no name")
		}
		if hasArgs {
			if strings.TrimSpace(args) == "" {
				return nil, bad("%s: empty arguments after ':'", t.Name)
			}
			for _, a := range strings.Split(args, ",") {
				k, v, kv := strings.Cut(a, "=")
				k, v = strings.TrimSpace(k), strings.TrimSpace(v)
				switch {
				case !kv && k == "":
					return nil, bad("%s: an empty argument", t.Name)
				case kv && (k == "" || v == ""):
					return nil, bad("%s: argument %q is not key=value", t.Name, strings.TrimSpace(a))
				case kv:
					k = strings.ToLower(k)
					for _, b := range t.Args {
						if b.Key == k {
							return nil, bad("%s: %s given twice", t.Name, k)
						}
					}
					t.Args = append(t.Args, Arg{Key: k, Value: v})
				default:
					t.Args = append(t.Args, Arg{Value: k})
				}
			}
		}
		out = append(out, t)
	}
	return out, nil
}

// One parses s, which must be a single term.
func One(s string) (Term, error) {
	ts, err := Parse(s)
	if err != nil {
		return Term{}, err
	}
	if len(ts) != 1 {
		return Term{}, ts[0].Errorf("one term expected, got %d joined by '+'", len(ts))
	}
	return ts[0], nil
}

// Reader reads a term's arguments by name. Each read takes the argument
// given as key=value, else the next positional value not yet taken, else
// the default. Read flags first: a bare word that names a flag is the
// flag, not a positional value. The first problem is kept and returned by
// Done, which also refuses arguments nobody read.
type Reader struct {
	t    Term
	used []bool
	keys []string
	err  error
}

// Reader returns a reader of t's arguments.
func (t Term) Reader() *Reader { return &Reader{t: t, used: make([]bool, len(t.Args))} }

// Name returns the term's name.
func (r *Reader) Name() string { return r.t.Name }

// Failf records a problem the caller found in an argument it read; Done
// returns the first problem recorded.
func (r *Reader) Failf(format string, args ...any) { r.fail(format, args...) }

func (r *Reader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = r.t.Errorf("%s: %s", r.t.Name, fmt.Sprintf(format, args...))
	}
}

// take returns the raw value of parameter key.
func (r *Reader) take(key string) (string, bool) {
	r.keys = append(r.keys, key)
	for i, a := range r.t.Args {
		if !r.used[i] && a.Key == key {
			r.used[i] = true
			return a.Value, true
		}
	}
	for i, a := range r.t.Args {
		if !r.used[i] && a.Key == "" {
			r.used[i] = true
			return a.Value, true
		}
	}
	return "", false
}

// Has reports whether the term has an argument that key would read (a
// key=value for it, or a positional value left).
func (r *Reader) Has(key string) bool {
	for i, a := range r.t.Args {
		if !r.used[i] && (a.Key == key || a.Key == "") {
			return true
		}
	}
	return false
}

// Keyed requires every argument to be key=value (flags excepted when
// read first): for terms whose parameters have no natural order.
func (r *Reader) Keyed() {
	for i, a := range r.t.Args {
		if !r.used[i] && a.Key == "" {
			r.fail("name the parameters (key=value), not %q", a.Value)
			return
		}
	}
}

// Require fails unless the term gives key (as key=value, or as a
// positional value left for it).
func (r *Reader) Require(key string) {
	if !r.Has(key) {
		r.fail("missing %s=", key)
	}
}

// Flag reports whether the bare word name (or name=true) is among the
// arguments; name=false turns it off.
func (r *Reader) Flag(name string) bool {
	r.keys = append(r.keys, name)
	on := false
	for i, a := range r.t.Args {
		switch {
		case r.used[i]:
		case a.Key == "" && strings.EqualFold(a.Value, name):
			r.used[i], on = true, true
		case a.Key == name:
			b, err := strconv.ParseBool(a.Value)
			if err != nil {
				r.fail("%s=%q: want true or false", name, a.Value)
			}
			r.used[i], on = true, b
		}
	}
	return on
}

// Check is a test a numeric argument must pass, and what it wants.
type Check struct {
	ok   func(float64) bool
	want string
}

// In requires lo ≤ x ≤ hi, with either end open when its flag is false.
func In(lo, hi float64, loClosed, hiClosed bool) Check {
	l, h := "(", ")"
	if loClosed {
		l = "["
	}
	if hiClosed {
		h = "]"
	}
	return Check{func(x float64) bool {
		return (x > lo || loClosed && x == lo) && (x < hi || hiClosed && x == hi)
	}, fmt.Sprintf("a number in %s%v, %v%s", l, lo, hi, h)}
}

// AtLeast requires x ≥ lo.
func AtLeast(lo float64) Check {
	return Check{func(x float64) bool { return x >= lo }, fmt.Sprintf("a number ≥ %v", lo)}
}

// Positive requires x > 0.
func Positive() Check { return Check{func(x float64) bool { return x > 0 }, "a number > 0"} }

// Float returns parameter key as a finite number passing check (no
// check: any finite number), or def when it is absent. A value may end in
// '%' to mean a hundredth of it.
func (r *Reader) Float(key string, def float64, check ...Check) float64 {
	v, ok := r.take(key)
	if !ok {
		return def
	}
	s, pct := strings.CutSuffix(v, "%")
	x, err := strconv.ParseFloat(s, 64)
	if pct {
		x /= 100
	}
	want := "a finite number"
	for _, c := range check {
		want = c.want
	}
	if err != nil || math.IsNaN(x) || math.IsInf(x, 0) {
		r.fail("%s=%q: want %s", key, v, want)
		return def
	}
	for _, c := range check {
		if !c.ok(x) {
			r.fail("%s=%q: want %s", key, v, want)
			return def
		}
	}
	return x
}

// Int returns parameter key as an integer in [lo, hi], or def when it is
// absent.
func (r *Reader) Int(key string, def, lo, hi int) int {
	v, ok := r.take(key)
	if !ok {
		return def
	}
	x, err := strconv.Atoi(v)
	if err != nil || x < lo || x > hi {
		r.fail("%s=%q: want an integer in [%d, %d]", key, v, lo, hi)
		return def
	}
	return x
}

// Uint returns parameter key as an unsigned integer, or def when it is
// absent.
func (r *Reader) Uint(key string, def uint64) uint64 {
	v, ok := r.take(key)
	if !ok {
		return def
	}
	x, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		r.fail("%s=%q: want an unsigned integer", key, v)
		return def
	}
	return x
}

// String returns parameter key, lower-cased, or def when it is absent.
// With choices, the value must be one of them.
func (r *Reader) String(key, def string, choices ...string) string {
	v, ok := r.take(key)
	if !ok {
		return def
	}
	v = strings.ToLower(v)
	if len(choices) > 0 {
		for _, c := range choices {
			if v == c {
				return v
			}
		}
		r.fail("%s=%q: want one of %s", key, v, strings.Join(choices, ", "))
		return def
	}
	return v
}

// Done returns the first problem met, or an error naming an argument no
// read took, or nil.
func (r *Reader) Done() error {
	if r.err != nil {
		return r.err
	}
	for i, a := range r.t.Args {
		if r.used[i] {
			continue
		}
		has := "takes no arguments"
		if len(r.keys) > 0 {
			has = "has " + strings.Join(r.keys, ", ")
		}
		if a.Key != "" {
			return r.t.Errorf("%s: unknown parameter %q (%s)", r.t.Name, a.Key, has)
		}
		if len(r.keys) == 0 {
			return r.t.Errorf("%s takes no arguments (got %q)", r.t.Name, a.Value)
		}
		return r.t.Errorf("%s: too many values (%q is one more than %s)", r.t.Name, a.Value, strings.Join(r.keys, ", "))
	}
	return nil
}
