package device

// freeList keeps objects for reuse. Unlike a sync.Pool it is not emptied
// by the garbage collector, so steady-state calls never allocate; it holds
// at most as many objects as were ever in use at once (up to its
// capacity).
type freeList[T any] chan *T

// get returns a kept object, or a new zero one.
func (l freeList[T]) get() *T {
	select {
	case x := <-l:
		return x
	default:
		return new(T)
	}
}

// put keeps x if there is room.
func (l freeList[T]) put(x *T) {
	select {
	case l <- x:
	default:
	}
}
