// Package testtext holds text for tests and benchmarks: deterministic prose of a given
// length (Prose) and the reading of JSON Lines fixtures (ReadJSONL). It is imported by
// _test.go files only.
//
// Concurrency: every function is safe to call from several goroutines; none keeps state.
package testtext
