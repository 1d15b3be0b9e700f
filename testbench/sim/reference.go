package sim

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// Reference is the reproduction of the reference experiment's baseline (random routing
// per request, 6 workers with 1 GiB of KV cache each, closed loop): one parameter set
// for every cell.
type Reference struct {
	// Servers are the fleet's engines.
	Servers []Config
	// MaxTokens is every request's output length (the reference did not publish it).
	MaxTokens int
	// Requests per grid point, each run from empty caches (cold).
	Requests int
	// Reps repetitions per point, each with its own workload draw (prefix order and tails)
	// and routing draw; the median of each figure is reported.
	Reps int
	// RTT is the client's round trip to a server (Kubernetes Service hop included).
	RTT float64
	// Seed fixes the workload (the same for every cell of one N) and the routing draws.
	Seed uint64
}

// DefaultReference is the calibrated reproduction documented in README.md.
func DefaultReference() Reference {
	speeds := []float64{1, 1, 0.7, 0.7, 0.7, 0.7}
	servers := make([]Config, len(speeds))
	for i, s := range speeds {
		c := DefaultConfig()
		c.Speed = s
		c.EnableEvents = false
		c.HashSeed = uint64(i + 1)
		servers[i] = c
	}
	return Reference{Servers: servers, MaxTokens: 100, Requests: 240, Reps: 9, RTT: 0.035, Seed: 20261113}
}

// RunPoint runs one grid point (n prefixes, conc clients) Reps times with random routing
// and returns the median of each figure.
func (r Reference) RunPoint(n, conc int) (Summary, error) {
	var sums []Summary
	for rep := range max(r.Reps, 1) {
		w := NewWorkload(n, r.Requests, RefPrefixTokens, RefTailTokens, r.Seed+uint64(1000*rep+n))
		f, err := NewFleet(r.Servers, FleetOptions{})
		if err != nil {
			return Summary{}, err
		}
		rng := rand.New(rand.NewPCG(r.Seed, uint64(1000*n+10*conc+rep)))
		loop := ClosedLoop{Concurrency: conc, MaxTokens: r.MaxTokens, RTT: r.RTT,
			Route: func(int, WorkloadRequest) int { return rng.IntN(len(r.Servers)) }}
		outs, err := loop.Run(f, w)
		if err != nil {
			return Summary{}, err
		}
		sums = append(sums, Summarize(outs))
	}
	med := func(get func(Summary) float64) float64 {
		v := make([]float64, len(sums))
		for i, s := range sums {
			v[i] = get(s)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	return Summary{
		Requests:    r.Requests,
		CachedRatio: med(func(s Summary) float64 { return s.CachedRatio }),
		HitRate:     med(func(s Summary) float64 { return s.HitRate }),
		TTFTP50:     med(func(s Summary) float64 { return s.TTFTP50 }),
		TTFTP99:     med(func(s Summary) float64 { return s.TTFTP99 }),
		Throughput:  med(func(s Summary) float64 { return s.Throughput }),
		Makespan:    med(func(s Summary) float64 { return s.Makespan }),
		Preemptions: int(med(func(s Summary) float64 { return float64(s.Preemptions) })),
	}, nil
}

// Cell is one published baseline figure and its reproduction.
type Cell struct {
	Metric string // "cached_ratio", "hit_rate", "ttft_p50_ms", "ttft_p99_ms", "throughput_rps"
	N      int
	Conc   int
	Ref    float64
	Sim    float64
	// Tol is the allowed residual: absolute for ratios and rates, relative for the rest.
	Tol      float64
	Relative bool
}

// Residual is Sim-Ref, or (Sim-Ref)/Ref for relative cells.
func (c Cell) Residual() float64 {
	if c.Relative {
		return (c.Sim - c.Ref) / c.Ref
	}
	return c.Sim - c.Ref
}

// OK reports whether the residual is within tolerance.
func (c Cell) OK() bool { return math.Abs(c.Residual()) <= c.Tol+1e-9 }

// String formats the cell for a table.
func (c Cell) String() string {
	unit := ""
	if c.Relative {
		unit = "%"
	}
	res := c.Residual()
	if c.Relative {
		res *= 100
	}
	mark := "ok"
	if !c.OK() {
		mark = "OUT"
	}
	return fmt.Sprintf("| %-14s | %2d | %2d | %8.3f | %8.3f | %+7.3f%s | %s |", c.Metric, c.N, c.Conc, c.Ref, c.Sim, res, unit, mark)
}

// referenceJSON holds the reference experiment's published figures: the one copy that
// this package's calibration and the docs' renderer (scripts/docs.py) both read.
//
//go:embed reference.json
var referenceJSON []byte

// Published is the part of the reference's published figures the baseline calibration uses.
type Published struct {
	Ns             []int                   `json:"ns"`
	HitRateC8      map[string][]float64    `json:"hit_rate_c8"`
	CachedRatioC4  map[string][]float64    `json:"cached_ratio_c4"`
	CachedRatioC16 map[string][]float64    `json:"cached_ratio_c16"`
	TTFTMsC16      map[string][][2]float64 `json:"ttft_ms_c16"`
	RequestsPerS16 map[string][]float64    `json:"requests_per_s_c16"`
}

// PublishedFigures decodes reference.json.
func PublishedFigures() (Published, error) {
	var p Published
	if err := json.Unmarshal(referenceJSON, &p); err != nil {
		return Published{}, fmt.Errorf("sim: reference.json: %w", err)
	}
	return p, nil
}

// BaselineCells are the reference's baseline column with the tolerances:
// cached-token ratio at concurrency 4 and 16 (+-0.03), request hit rate at 8 (+-0.05),
// TTFT p50/p99 and throughput at 16 (+-30%).
func BaselineCells() ([]Cell, error) {
	p, err := PublishedFigures()
	if err != nil {
		return nil, err
	}
	const col = "baseline"
	var cells []Cell
	for i, n := range p.Ns {
		cells = append(cells,
			Cell{Metric: "cached_ratio", N: n, Conc: 4, Ref: p.CachedRatioC4[col][i], Tol: 0.03},
			Cell{Metric: "cached_ratio", N: n, Conc: 16, Ref: p.CachedRatioC16[col][i], Tol: 0.03},
			Cell{Metric: "hit_rate", N: n, Conc: 8, Ref: p.HitRateC8[col][i], Tol: 0.05},
			Cell{Metric: "ttft_p50_ms", N: n, Conc: 16, Ref: p.TTFTMsC16[col][i][0], Tol: 0.30, Relative: true},
			Cell{Metric: "ttft_p99_ms", N: n, Conc: 16, Ref: p.TTFTMsC16[col][i][1], Tol: 0.30, Relative: true},
			Cell{Metric: "throughput_rps", N: n, Conc: 16, Ref: p.RequestsPerS16[col][i], Tol: 0.30, Relative: true},
		)
	}
	return cells, nil
}

// Calibrate runs every grid point the baseline cells need and fills in Sim.
func (r Reference) Calibrate() ([]Cell, error) {
	cells, err := BaselineCells()
	if err != nil {
		return nil, err
	}
	points := map[[2]int]Summary{}
	for i := range cells {
		c := &cells[i]
		key := [2]int{c.N, c.Conc}
		s, ok := points[key]
		if !ok {
			var err error
			if s, err = r.RunPoint(c.N, c.Conc); err != nil {
				return nil, err
			}
			points[key] = s
		}
		switch c.Metric {
		case "cached_ratio":
			c.Sim = s.CachedRatio
		case "hit_rate":
			c.Sim = s.HitRate
		case "ttft_p50_ms":
			c.Sim = s.TTFTP50 * 1000
		case "ttft_p99_ms":
			c.Sim = s.TTFTP99 * 1000
		case "throughput_rps":
			c.Sim = s.Throughput
		}
	}
	return cells, nil
}
