//go:build !unix

package rusage

import "time"

// CPU returns 0: the process's CPU time is read on Unix only.
func CPU() time.Duration { return 0 }
