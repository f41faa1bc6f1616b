//go:build unix

package serve

import (
	"os"
	"syscall"
)

// mapShared maps the first n bytes of f, shared and writable.
func mapShared(f *os.File, n int) ([]byte, error) {
	return syscall.Mmap(int(f.Fd()), 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
}

// unmapShared undoes mapShared.
func unmapShared(b []byte) { syscall.Munmap(b) }
