package demo

import (
	"os"
	"testing"
	"time"
)

func TestParseStat(t *testing.T) {
	for _, tc := range []struct {
		name, line string
		want       procUsage
		wantErr    bool
	}{
		{"plain", "4242 (kvrouter) S 1 4242 4242 0 -1 4194560 2917 0 0 0 150 25 0 0 20 0 9 0 1000 0 0", procUsage{1750 * time.Millisecond, 2917}, false},
		{"spaces and parens in the name", "7 (a) b) c) R 1 7 7 0 -1 0 12 0 0 0 3 4 0 0 20 0 1 0 5 0 0", procUsage{70 * time.Millisecond, 12}, false},
		{"no name", "7 a R 1", procUsage{}, true},
		{"truncated", "7 (x) R 1 2 3", procUsage{}, true},
		{"not a number", "7 (x) R 1 7 7 0 -1 0 0 0 0 0 x 4 0", procUsage{}, true},
		{"faults not a number", "7 (x) R 1 7 7 0 -1 0 y 0 0 0 3 4 0", procUsage{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseStat([]byte(tc.line))
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Fatalf("parseStat = %+v, %v; want %+v, error %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
	t.Run("this process", func(t *testing.T) {
		u, err := childUsage(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		if u.MinorFaults <= 0 {
			t.Fatalf("this process has %d minor faults: a running Go process has mapped pages", u.MinorFaults)
		}
	})
}
