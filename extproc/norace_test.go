//go:build !race

package extproc_test

const raceEnabled = false
