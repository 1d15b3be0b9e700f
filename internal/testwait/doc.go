// Package testwait waits in tests for a condition that another goroutine or process
// brings about (a socket listening, a stream connected, a fleet change applied). Its
// time limit only turns a hang into a failure: tests assert behaviour, never timing.
//
// Concurrency: For may be called from several tests at once; cond runs on the caller's
// goroutine.
package testwait
