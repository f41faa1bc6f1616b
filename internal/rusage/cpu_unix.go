//go:build unix

package rusage

import (
	"syscall"
	"time"
)

// CPU returns the process's CPU time so far, user and system.
func CPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
