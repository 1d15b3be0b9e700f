package freeport_test

import (
	"net"
	"strconv"
	"testing"

	"github.com/kvrouter/kvrouter/internal/freeport"
)

func TestRangeIsFreeAndBelowTheEphemeralRange(t *testing.T) {
	for _, n := range []int{1, 2, 24} {
		base, err := freeport.Range(n)
		if err != nil {
			t.Fatal(err)
		}
		if base < 10000 || base+n > 32768 {
			t.Errorf("Range(%d) = %d, want within [10000, 32768)", n, base)
		}
		for p := base; p < base+n; p++ {
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
			if err != nil {
				t.Fatalf("Range(%d): port %d not free: %v", n, p, err)
			}
			l.Close()
		}
	}
	if _, err := freeport.Range(0); err == nil {
		t.Error("Range(0) = nil error, want one")
	}
}

func TestListIsDistinct(t *testing.T) {
	ports, err := freeport.List(5)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if seen[p] {
			t.Fatalf("List(5) = %v: %d twice", ports, p)
		}
		seen[p] = true
	}
}
