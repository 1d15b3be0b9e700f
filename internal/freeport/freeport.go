// Package freeport finds free TCP ports on 127.0.0.1 for a process about to be told to
// bind them (a child process, a configuration written before the listener exists).
//
// Ports are probed below the kernel's ephemeral range (net.ipv4.ip_local_port_range).
// A port taken from ":0" and released is in that range, where any outgoing connection or
// ":0" listener of a test package running in parallel can be given it before the child
// binds it ("address already in use"). Below the range only another explicit bind can
// take it, and a random start makes two processes probing at once unlikely to meet.
// Where a listener can be handed over instead (net.Listen("tcp", "127.0.0.1:0") kept
// open), do that: it has no race at all.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// lowest is the first port probed: below it are well-known and registered services.
const lowest = 10000

// Range returns the first of n consecutive ports on 127.0.0.1 that were free when probed.
func Range(n int) (int, error) {
	top := ephemeralLow() - n
	if n < 1 || top <= lowest {
		return 0, fmt.Errorf("freeport: no room for %d consecutive ports below %d", n, ephemeralLow())
	}
	for range 200 {
		base := lowest + rand.IntN(top-lowest)
		var lns []net.Listener
		for p := base; p < base+n; p++ {
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
			if err != nil {
				break
			}
			lns = append(lns, l)
		}
		for _, l := range lns {
			l.Close()
		}
		if len(lns) == n {
			return base, nil
		}
	}
	return 0, fmt.Errorf("freeport: no %d consecutive free ports below %d", n, ephemeralLow())
}

// List returns n distinct ports (consecutive) that were free when probed.
func List(n int) ([]int, error) {
	base, err := Range(n)
	if err != nil {
		return nil, err
	}
	ports := make([]int, n)
	for i := range ports {
		ports[i] = base + i
	}
	return ports, nil
}

// ephemeralLow is the first port of the kernel's ephemeral range; Linux's default
// (32768) where it cannot be read.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if lo, err := strconv.Atoi(f[0]); err == nil && lo > lowest+1000 {
				return lo
			}
		}
	}
	return 32768
}
