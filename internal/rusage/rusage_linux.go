package rusage

import "syscall"

// PeakRSS returns the process's peak resident set in bytes (Linux
// reports KiB).
func PeakRSS() int64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return ru.Maxrss * 1024
}
