package demo

import (
	"os"
	"testing"
	"time"
)

func TestParseStatCPU(t *testing.T) {
	for _, tc := range []struct {
		name, line string
		want       time.Duration
		wantErr    bool
	}{
		{"plain", "4242 (kvrouter) S 1 4242 4242 0 -1 4194560 2917 0 0 0 150 25 0 0 20 0 9 0 1000 0 0", 1750 * time.Millisecond, false},
		{"spaces and parens in the name", "7 (a) b) c) R 1 7 7 0 -1 0 0 0 0 0 3 4 0 0 20 0 1 0 5 0 0", 70 * time.Millisecond, false},
		{"no name", "7 a R 1", 0, true},
		{"truncated", "7 (x) R 1 2 3", 0, true},
		{"not a number", "7 (x) R 1 7 7 0 -1 0 0 0 0 0 x 4 0", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseStatCPU([]byte(tc.line))
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Fatalf("parseStatCPU = %v, %v; want %v, error %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
	t.Run("this process", func(t *testing.T) {
		if _, err := childCPU(os.Getpid()); err != nil {
			t.Fatal(err)
		}
	})
}
