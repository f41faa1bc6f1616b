//go:build !linux

package rusage

// PeakRSS returns 0: the peak resident set is read on Linux only.
func PeakRSS() int64 { return 0 }
