// Package rusage reads the process's own resource use: its CPU time and
// peak resident memory (getrusage; 0 where that cannot be read).
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

// PeakRSS returns the process's peak resident set in bytes (Linux
// reports KiB).
func PeakRSS() int64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return ru.Maxrss * 1024
}
