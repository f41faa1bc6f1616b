//go:build !linux

// Package rusage reads the process's own resource use: its CPU time and
// peak resident memory (getrusage; 0 where that cannot be read).
package rusage

import "time"

// CPU returns 0: the process's CPU time is read on Linux only.
func CPU() time.Duration { return 0 }

// PeakRSS returns 0: the peak resident set is read on Linux only.
func PeakRSS() int64 { return 0 }
