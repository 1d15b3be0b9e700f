// Package cputime reads the CPU time this process has used, for benchmarks and load
// reports on machines shared with other work: wall time also counts the time other
// processes held the cores, CPU time (user + system) does not.
//
// Concurrency: Process is safe to call from any goroutine.
package cputime
