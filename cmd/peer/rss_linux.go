package main

import "syscall"

// peakRSSMB returns the process's peak resident set in MB (getrusage's
// maxrss, KiB on Linux), or 0 if it cannot be read.
func peakRSSMB() float64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return float64(ru.Maxrss) * 1024 / 1e6
}
