// Package kvbench reproduces the reference experiment's measurement of prefix-cache-aware
// routing: a workload of N shared prefixes with unique tails sent in a closed loop, run
// either against any OpenAI-compatible URL (HTTPTarget) or against an in-process simulated
// fleet on a virtual clock (sim mode), and the figures, sweeps, Markdown tables, JSON
// records and plots that compare policies with the theoretical bound.
//
// Concurrency: a Workload is immutable and safe for concurrent use; an HTTPTarget runs one
// workload at a time with its own goroutines, which end before Run returns; Sweep runs
// cells in parallel and calls RunFunc from several goroutines; Progress is safe for
// concurrent use. Everything else is a pure function of its arguments.
package kvbench
