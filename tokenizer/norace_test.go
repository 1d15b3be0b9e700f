//go:build !race

package tokenizer_test

// raceEnabled: see race_test.go.
const raceEnabled = false
