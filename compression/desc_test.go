package compression

import (
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// descSpecs returns specs of d's codec that span its parameters: the
// defaults, each parameter at its bounds (and the word "all" where it takes
// it), each with the entropy stage off, s2 and zstd.
func descSpecs(d Desc) []string {
	params := []string{""}
	for _, p := range d.Params {
		switch p.Kind {
		case IntParam:
			params = append(params, p.Key+"="+strconv.Itoa(int(p.Min)), p.Key+"="+strconv.Itoa(int(p.Max)))
			if p.All != 0 {
				params = append(params, p.Key+"=all")
			}
		case FracParam:
			params = append(params, p.Key+"="+strconv.FormatFloat(p.Max, 'g', -1, 64), p.Key+"=0.001")
		case UintParam:
			params = append(params, p.Key+"=18446744073709551615")
		}
	}
	var specs []string
	for _, p := range params {
		for _, e := range []string{"entropy=none", "entropy=s2", "entropy=zstd"} {
			specs = append(specs, d.Name+":"+strings.TrimPrefix(p+","+e, ","))
		}
	}
	return specs
}

// relErr returns ‖y − x‖ / ‖x‖.
func relErr(x, y []float32) float64 {
	e := make([]float32, len(x))
	for i := range x {
		e[i] = y[i] - x[i]
	}
	return norm2(e) / norm2(x)
}

// TestDescs walks the codec table and checks every descriptor against its
// codec, so that a new codec whose entry forgets or misstates something
// fails here.
func TestDescs(t *testing.T) {
	seen := map[string]bool{}
	ds := Descs()
	if len(ds) == 0 || !slices.Equal(Names(), func() (n []string) {
		for _, d := range ds {
			n = append(n, d.Name)
		}
		return n
	}()) {
		t.Fatalf("Names %v do not follow Descs", Names())
	}
	for i, d := range ds {
		t.Run(d.Name, func(t *testing.T) {
			// The table itself.
			if i > 0 && d.ID <= ds[i-1].ID {
				t.Fatalf("id %d after %d: Descs is not in id order", d.ID, ds[i-1].ID)
			}
			if got, ok := Describe(d.ID | IDEntropy); !ok || got.ID != d.ID || got.Name != d.Name {
				t.Fatalf("Describe(%d|IDEntropy) = %v, %v", d.ID, got.Name, ok)
			}
			if !Known(d.ID) || !Known(d.ID|IDEntropy) || d.ID&IDEntropy != 0 {
				t.Fatalf("id %d: Known or in the entropy bit", d.ID)
			}
			if d.Doc == "" || d.MaxEncodedLen == nil || d.build == nil {
				t.Fatal("Doc, MaxEncodedLen or build missing")
			}
			for _, name := range append([]string{d.Name}, d.Aliases...) {
				if seen[name] || name != strings.ToLower(name) || strings.ContainsAny(name, ":,=+ ") {
					t.Fatalf("name %q: taken, not lower case, or not a spec name", name)
				}
				seen[name] = true
			}
			keys := map[string]bool{"ef": true, "entropy": true}
			for k, p := range d.Params {
				if keys[p.Key] || (p.Main && k != 0) {
					t.Fatalf("parameter %q: key taken, or main but not first", p.Key)
				}
				keys[p.Key] = true
			}
			if _, ok := decoders[d.ID].(adder); !ok {
				t.Fatal("the decoder does not implement decodeAdd")
			}

			// Parse and New build the codec the descriptor names.
			c, err := Parse(d.Name)
			if err != nil {
				t.Fatal(err)
			}
			if c.ID()&^IDEntropy != d.ID || (c.ID()&IDEntropy != 0) != (d.Entropy != EntropyStored) {
				t.Fatalf("Parse(%q).ID() = %#x; entropy auto %v", d.Name, c.ID(), d.Entropy)
			}
			if again, err := Parse(c.Name()); err != nil || again.Name() != c.Name() {
				t.Fatalf("Parse(%q) = %v, %v: the name does not round-trip", c.Name(), again, err)
			}
			for _, a := range d.Aliases {
				if ac, err := Parse(a); err != nil || ac.Name() != c.Name() {
					t.Fatalf("alias %q: %v, %v", a, ac, err)
				}
			}
			base, err := New(d.ID, "")
			if err != nil || base.ID() != d.ID {
				t.Fatalf("New(%d, \"\") = %v, %v", d.ID, base, err)
			}
			// The table's defaults are those the codec's zero value uses.
			zero := reflect.Zero(reflect.TypeOf(base))
			if zero.Kind() == reflect.Pointer {
				zero = reflect.New(zero.Type().Elem())
			}
			if z := zero.Interface().(Codec); z.Name() != base.Name() {
				t.Fatalf("the zero value is %s, the table's defaults %s", z.Name(), base.Name())
			}
			for _, p := range d.Params {
				def := strconv.FormatFloat(p.Default, 'g', -1, 64)
				if pc, err := Parse(d.Name + ":" + p.Key + "=" + def); err != nil || pc.Name() != c.Name() {
					t.Fatalf("%s=%s (the default) gives %v, %v; the defaults give %s", p.Key, def, pc, err, c.Name())
				}
			}
			if _, err := Parse(d.Name + ":ef"); (err == nil) != d.Lossy {
				t.Fatalf("Parse(%s:ef): %v; Lossy %v", d.Name, err, d.Lossy)
			}

			// MaxEncodedLen bounds real encodings; every decoder reads them.
			for _, s := range descSpecs(d) {
				sc, err := Parse(s)
				if err != nil {
					t.Fatalf("Parse(%q): %v", s, err)
				}
				rng := rand.New(rand.NewPCG(uint64(d.ID), 1))
				for _, n := range []int{0, 1, 7, 300, 4097} {
					for _, x := range [][]float32{gradLike(n, uint64(n)), randomBits(n, rng)} {
						b := sc.Encode(nil, x)
						if m := MaxEncodedLen(sc.ID(), n); len(b) > m || m > MaxEncodedLenAny(n) {
							t.Fatalf("%s, %d values: %d bytes, MaxEncodedLen %d, MaxEncodedLenAny %d", s, n, len(b), m, MaxEncodedLenAny(n))
						}
						var dec Decoder
						y, z := make([]float32, n), make([]float32, n)
						if err := dec.Decode(y, b); err != nil {
							t.Fatalf("%s, %d values: Decoder: %v", s, n, err)
						}
						if err := dec.DecodeAdd(z, b); err != nil {
							t.Fatalf("%s, %d values: DecodeAdd: %v", s, n, err)
						}
						for k := range y {
							if y[k] != z[k] && !(y[k] != y[k] && z[k] != z[k]) {
								t.Fatalf("%s, %d values: value %d decodes to %g, adds %g", s, n, k, y[k], z[k])
							}
						}
					}
				}
			}

			// Lossy, Dense, Sparse and Hop say what the codec does.
			x := gradLike(4096, 9)
			y := make([]float32, len(x))
			mustDecode(t, base, y, base.Encode(nil, x))
			exact := slices.Equal(math32bits(x), math32bits(y))
			if exact == d.Lossy {
				t.Fatalf("bit-exact %v, Lossy %v", exact, d.Lossy)
			}
			if e := relErr(x, y); (e <= 1.0/64) != d.Dense || Dense(c) != d.Dense || Dense(NewErrorFeedback(base)) != d.Dense {
				t.Fatalf("relative error %.3g at the defaults, Dense %v, Dense(codec) %v", e, d.Dense, Dense(c))
			}
			b := base.Encode(nil, x)
			if _, err := MergeSparse(nil, b, b, len(x)); (err == nil) != d.Sparse || IsSparse(d.ID) != d.Sparse {
				t.Fatalf("MergeSparse: %v; Sparse %v", err, d.Sparse)
			}
			hop := HopCodec(c)
			hd, ok := Describe(d.Hop)
			// A hop re-encodes with a dense codec, or a lossy stateless
			// codec with itself (the 4-bit all-reduce).
			if !ok || !(hd.Dense || d.Hop == d.ID) || hop.ID() != d.Hop|c.ID()&IDEntropy {
				t.Fatalf("HopCodec(%s) = %s; Hop %d (dense %v)", c.Name(), hop.Name(), d.Hop, hd.Dense)
			}
		})
	}
	if _, ok := Describe(ID(len(descs))); ok || Known(ID(len(descs))) || MaxEncodedLen(ID(len(descs)), 10) != 0 {
		t.Fatal("an id past the table is described")
	}
}

func math32bits(x []float32) []uint32 {
	out := make([]uint32, len(x))
	for i, v := range x {
		out[i] = math.Float32bits(v)
	}
	return out
}
