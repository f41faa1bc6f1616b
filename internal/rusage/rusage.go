// Package rusage reads the process's own resource use: its CPU time and
// peak resident memory (getrusage; 0 where that cannot be read).
package rusage
