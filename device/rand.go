package device

import "math"

// mix is splitmix64's finaliser: a bijective 64-bit hash.
func mix(z uint64) uint64 {
	z ^= z >> 30
	z *= 0xbf58476d1ce4e5b9
	z ^= z >> 27
	z *= 0x94d049bb133111eb
	z ^= z >> 31
	return z
}

// Hash64 returns a well-mixed 64-bit value derived from (seed, i) alone.
// Backends use it so that seeded fills are identical everywhere.
func Hash64(seed, i uint64) uint64 {
	return mix(mix(seed+0x9e3779b97f4a7c15) ^ (i * 0xd1b54a32d192ed03))
}

// UniformAt returns the i-th value in [0, 1) of the stream named by seed.
func UniformAt(seed, i uint64) float64 {
	return float64(Hash64(seed, i)>>11) * (1.0 / (1 << 53))
}

// NormalAt returns the i-th standard normal value of the stream named by seed
// (Box–Muller over two independent uniforms).
func NormalAt(seed, i uint64) float64 {
	u1 := float64(Hash64(seed, 2*i)>>11+1) * (1.0 / (1<<53 + 1)) // (0, 1]
	u2 := UniformAt(seed, 2*i+1)
	return math.Sqrt(-2*math.Log(u1)) * math.Cos(2*math.Pi*u2)
}
