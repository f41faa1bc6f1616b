//go:build !unix

package serve

import (
	"fmt"
	"os"
	"runtime"
)

// mapShared fails: serve maps shared memory on Unix systems only, so its
// tensor calls work there only (the rest of the binary builds anywhere).
func mapShared(*os.File, int) ([]byte, error) {
	return nil, fmt.Errorf("shared memory is not supported on %s", runtime.GOOS)
}

// unmapShared undoes mapShared.
func unmapShared([]byte) {}
