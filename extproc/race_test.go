//go:build race

package extproc_test

// raceEnabled: under -race sync.Pool drops a random share of what is put back, so the
// pooled id and render buffers are allocated again and allocation counts are not what
// the server allocates; TestParseCostCoversPromptAllocations runs without -race
// (`make test` runs it on its own line).
const raceEnabled = true
