package device

// Memory is implemented by a backend whose kernels need memory of its own,
// such as a GPU's unified (managed) memory, which the host addresses as a
// slice and the device computes on. Every buffer a model hands a kernel
// then comes from the backend: its parameters, gradients and optimiser
// state (one allocation each), each layer's activations and scratch, and
// the batch, staged in at the model's edge. A backend without Memory (the
// CPU ones) computes on any host slice, and Alloc, Stage and Sync cost it
// nothing.
type Memory interface {
	// AllocFloat32 returns n zeroed float32 values in the backend's memory.
	AllocFloat32(n int) []float32
	// AllocInt32 returns n zeroed int32 values in the backend's memory
	// (labels, token ids, pooling's argmax).
	AllocInt32(n int) []int32
	// Sync returns once every kernel queued so far has finished: the host
	// may then read and write the backend's buffers. The drivers call it
	// at the edges, where the host takes or gives a whole vector: the
	// exchange with peers, checkpoints and export.
	Sync()
}

// Alloc returns n zeroed float32 values in be's memory: be's own when it
// implements Memory, the Go heap otherwise.
func Alloc(be Backend, n int) []float32 {
	if m, ok := be.(Memory); ok {
		return m.AllocFloat32(n)
	}
	return make([]float32, n)
}

// AllocInt32 is Alloc for int32 values.
func AllocInt32(be Backend, n int) []int32 {
	if m, ok := be.(Memory); ok {
		return m.AllocInt32(n)
	}
	return make([]int32, n)
}

// Grow returns buf[:n] when buf has room for n values, else a new buffer
// of n from Alloc (buf's contents are not kept).
func Grow(be Backend, buf []float32, n int) []float32 {
	if cap(buf) < n {
		return Alloc(be, n)
	}
	return buf[:n]
}

// GrowInt32 is Grow for int32 values.
func GrowInt32(be Backend, buf []int32, n int) []int32 {
	if cap(buf) < n {
		return AllocInt32(be, n)
	}
	return buf[:n]
}

// Stage returns host values x where be's kernels can read them: x itself
// for a backend without Memory, else a copy in *buf (grown with Grow).
func Stage(be Backend, buf *[]float32, x []float32) []float32 {
	if _, ok := be.(Memory); !ok {
		return x
	}
	*buf = Grow(be, *buf, len(x))
	copy(*buf, x)
	return *buf
}

// StageInt32 is Stage for int32 values.
func StageInt32(be Backend, buf *[]int32, x []int32) []int32 {
	if _, ok := be.(Memory); !ok {
		return x
	}
	*buf = GrowInt32(be, *buf, len(x))
	copy(*buf, x)
	return *buf
}

// Sync waits for be's queued kernels when be implements Memory; it
// returns at once otherwise.
func Sync(be Backend) {
	if m, ok := be.(Memory); ok {
		m.Sync()
	}
}
