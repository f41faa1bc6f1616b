package device

import "math"

// The Fast backend's GELU: float32 Go loops. s = 0.5·(1 + tanh(u)) and
// 1 − s come from a rational tanh where both are well conditioned
// (|u| < 1.5) and from the equal σ(±2u) = 1/(1 + e^(∓2u)) beyond, where
// 1 ± tanh(u) would cancel, so both tails keep their relative precision.
// (Scalar Go: about 10 ns a value here, most of it the division and the
// dependent multiply-adds; SIMD would take 16 values at a time.)

// tanh32 is tanh in float32 for |x| < 1.5, where its [7/6] Padé
// approximant (the continued fraction x/(1 + x²/(3 + x²/(5 + …)))) is
// within 4e-10 relative: the error is float32 rounding alone.
func tanh32(x float32) float32 {
	x2 := x * x
	p := ((x2+378)*x2+17325)*x2 + 135135
	q := ((28*x2+3150)*x2+62370)*x2 + 135135
	return x * p / q
}

// exp32 is e^x in float32 (Cephes' expf: a degree-7 polynomial after
// reducing x by multiples of ln 2), within about 1 ulp, for x clamped to
// [−87.3, 88.3] (the normal range of float32).
func exp32(x float32) float32 {
	x = max(min(x, 88.3), -87.3)
	t := x*math.Log2E + 0.5
	k := int32(t)
	if float32(k) > t {
		k-- // floor
	}
	fk := float32(k)
	r := x - fk*0.693359375 - fk*-2.12194440e-4
	p := float32(1.9875691500e-4)
	p = p*r + 1.3981999507e-3
	p = p*r + 8.3334519073e-3
	p = p*r + 4.1665795894e-2
	p = p*r + 1.6666665459e-1
	p = p*r + 5.0000001201e-1
	p = p*r*r + r + 1
	return p * math.Float32frombits(uint32(k+127)<<23)
}

// geluTail returns s = σ(2u) and 1 − s, for |u| ≥ 1.5.
func geluTail(u float32) (s, oneMinusS float32) {
	e := exp32(-2 * u)
	s = 1 / (1 + e)
	return s, e * s
}

// gelu32 sets y = GELU(x) and, unless d is nil, d = GELU'(x).
func gelu32(y, d, x []float32) {
	y = y[:len(x)]
	if d == nil {
		for i, v := range x {
			u := geluC * (v + geluA*v*v*v)
			if u > -1.5 && u < 1.5 {
				y[i] = 0.5 * v * (1 + tanh32(u))
				continue
			}
			s, _ := geluTail(u)
			y[i] = v * s
		}
		return
	}
	d = d[:len(x)]
	for i, v := range x {
		u := geluC * (v + geluA*v*v*v)
		var s, oms float32
		if u > -1.5 && u < 1.5 {
			t := tanh32(u)
			s, oms = 0.5*(1+t), 0.5*(1-t)
		} else {
			s, oms = geluTail(u)
		}
		y[i] = v * s
		d[i] = s + 2*v*s*oms*geluC*(1+3*geluA*v*v)
	}
}
