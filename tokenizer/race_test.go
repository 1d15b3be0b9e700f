//go:build race

package tokenizer_test

// raceEnabled: under -race, TestGolden checks a sample of the corpus (the race
// detector makes each Encode ~10x slower); `make test` also runs TestGolden in full
// without -race.
const raceEnabled = true
