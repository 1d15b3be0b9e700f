// Command sim-calibrate reruns the reference experiment's baseline (random routing) on the
// simulated fleet and prints every published cell beside its reproduction and residual.
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/kvrouter/kvrouter/testbench/sim"
)

func main() {
	ref := sim.DefaultReference()
	flag.IntVar(&ref.MaxTokens, "max-tokens", ref.MaxTokens, "output tokens per request")
	flag.IntVar(&ref.Requests, "requests", ref.Requests, "requests per grid point (cold start)")
	flag.IntVar(&ref.Reps, "reps", ref.Reps, "repetitions per point (median)")
	flag.Float64Var(&ref.RTT, "rtt", ref.RTT, "client round trip, seconds")
	base := flag.Float64("base", ref.Servers[0].Timing.Base, "step base time, s")
	pt := flag.Float64("prefill-token", ref.Servers[0].Timing.PrefillToken, "per prefill token, s")
	ds := flag.Float64("decode-seq", ref.Servers[0].Timing.DecodeSeq, "per decode sequence, s")
	at := flag.Float64("attention", ref.Servers[0].Timing.Attention, "per 1e6 attention pairs, s")
	slow := flag.Float64("slow-speed", ref.Servers[2].Speed, "speed of the four laptop-GPU workers")
	flag.Parse()
	for i := range ref.Servers {
		ref.Servers[i].Timing = sim.Timing{Base: *base, PrefillToken: *pt, DecodeSeq: *ds, Attention: *at}
		if i >= 2 {
			ref.Servers[i].Speed = *slow
		}
	}
	start := time.Now()
	cells, err := ref.Calibrate()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("| metric         |  N |  c |      ref |      sim | residual | |")
	fmt.Println("|----------------|----|----|----------|----------|----------|-|")
	out := 0
	for _, c := range cells {
		fmt.Println(c)
		if !c.OK() {
			out++
		}
	}
	fmt.Printf("\n%d of %d cells outside tolerance; %s wall\n", out, len(cells), time.Since(start).Round(time.Millisecond))
}
