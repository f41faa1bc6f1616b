package device

// MinMax leaves the smaller of a[i] and b[i] in a[i] and the larger in
// b[i], for i < len(a) (b must be as long): the compare-exchange of a
// sorting network run on whole vectors, which the robust all-reduce rules
// use to sort many columns of a few values at once. The values must not
// be NaN (the callers check contributions first); which of +0 and −0 ends
// in a is unspecified. It runs AVX-512 where the CPU has it.
func MinMax(a, b []float32) {
	if len(b) < len(a) {
		panic("device: MinMax: b shorter than a")
	}
	if len(a) == 0 {
		return
	}
	if finiteVec {
		minMaxAVX512(&a[0], &b[0], len(a))
		return
	}
	minMaxGo(a, b)
}

func minMaxGo(a, b []float32) {
	b = b[:len(a)]
	for i, x := range a {
		y := b[i]
		a[i], b[i] = min(x, y), max(x, y)
	}
}

// MinMaxVectorized reports whether MinMax runs a vector kernel (about 16
// values a cycle) rather than a loop of one value at a time.
func MinMaxVectorized() bool { return finiteVec }
