package kvbench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"sync"
)

// Cell is one point of a grid: a policy on a fleet of workers, N prefixes, concurrency C.
type Cell struct {
	Policy      string `json:"policy"`
	Workers     int    `json:"workers"`
	Prefixes    int    `json:"prefixes"`
	Concurrency int    `json:"concurrency"`
}

func (c Cell) String() string {
	return fmt.Sprintf("%s W=%d N=%d C=%d", c.Policy, c.Workers, c.Prefixes, c.Concurrency)
}

// Grid is the set of cells a sweep runs.
type Grid struct {
	Policies    []string
	Workers     int
	Prefixes    []int
	Concurrency []int
	Repetitions int
}

// ReferenceGrid returns the reference experiment's grid for the given policies: N in
// {2, 7, 12, 24}, concurrency in {4, 8, 16}, 6 workers, 3 repetitions.
func ReferenceGrid(policies []string) Grid {
	return Grid{
		Policies:    policies,
		Workers:     6,
		Prefixes:    []int{2, 7, 12, 24},
		Concurrency: []int{4, 8, 16},
		Repetitions: 3,
	}
}

// Cells lists the grid's cells, N outermost, then concurrency, then policy.
func (g Grid) Cells() []Cell {
	var out []Cell
	for _, n := range g.Prefixes {
		for _, c := range g.Concurrency {
			for _, p := range g.Policies {
				out = append(out, Cell{Policy: p, Workers: g.Workers, Prefixes: n, Concurrency: c})
			}
		}
	}
	return out
}

// CellResult is one cell's repetitions and their median.
type CellResult struct {
	Cell
	Reps   []Summary
	Median Summary
}

// RunFunc runs one repetition of one cell. Repetition r of every cell of the same N sees
// the same requests in the same order (the workload seed is derived from r, not from the
// policy or the concurrency).
type RunFunc func(ctx context.Context, cell Cell, rep int) (Summary, error)

// Sweep runs every repetition of every cell with at most parallel runs at once and
// returns the cells in grid order. done is called after each run (for progress). The first
// error cancels the sweep.
func Sweep(ctx context.Context, g Grid, parallel int, run RunFunc, done func()) ([]CellResult, error) {
	if g.Repetitions < 1 {
		return nil, fmt.Errorf("kvbench: repetitions must be at least 1, got %d", g.Repetitions)
	}
	if parallel < 1 {
		parallel = 1
	}
	cells := g.Cells()
	out := make([]CellResult, len(cells))
	for i, c := range cells {
		out[i] = CellResult{Cell: c, Reps: make([]Summary, g.Repetitions)}
	}
	type job struct{ cell, rep int }
	jobs := make(chan job)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	for range parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				s, err := run(ctx, cells[j.cell], j.rep)
				if err != nil {
					cancel(fmt.Errorf("kvbench: %s rep %d: %w", cells[j.cell], j.rep, err))
					continue
				}
				out[j.cell].Reps[j.rep] = s
				if done != nil {
					done()
				}
			}
		}()
	}
feed:
	for rep := 0; rep < g.Repetitions; rep++ {
		for i := range cells {
			select {
			case jobs <- job{i, rep}:
			case <-ctx.Done():
				break feed
			}
		}
	}
	close(jobs)
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return nil, err
	}
	for i := range out {
		out[i].Median = Median(out[i].Reps)
	}
	return out, nil
}

// Record is one cell of a JSON report: the cell, the workload and the median figures.
type Record struct {
	Cell
	Mode         string  `json:"mode"`
	Reps         int     `json:"reps"`
	PrefixTokens int     `json:"prefix_tokens"`
	TailTokens   int     `json:"tail_tokens"`
	OutputTokens int     `json:"output_tokens"`
	Warmup       int     `json:"warmup"`
	Seed         uint64  `json:"seed"`
	Zipf         float64 `json:"zipf"`
	API          API     `json:"api"`
	Summary
}

// Records turns cell results into JSON records.
func Records(results []CellResult, mode string, w WorkloadConfig) []Record {
	out := make([]Record, len(results))
	for i, r := range results {
		out[i] = Record{
			Cell: r.Cell, Mode: mode, Reps: len(r.Reps),
			PrefixTokens: w.PrefixTokens, TailTokens: w.TailTokens, OutputTokens: w.OutputTokens,
			Warmup: w.Warmup, Seed: w.Seed, Zipf: w.Zipf, API: w.API,
			Summary: r.Median,
		}
	}
	return out
}

// WriteJSON writes records as an indented JSON array.
func WriteJSON(w io.Writer, records []Record) error { return writeJSONValue(w, records) }

// writeJSONValue writes v as indented JSON.
func writeJSONValue(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("kvbench: writing json: %w", err)
	}
	return nil
}

// results indexes cell results for the report.
type resultIndex struct {
	policies    []string
	prefixes    []int
	concurrency []int
	byCell      map[Cell]*Summary
}

func indexResults(results []CellResult) resultIndex {
	ix := resultIndex{byCell: map[Cell]*Summary{}}
	seenP, seenN, seenC := map[string]bool{}, map[int]bool{}, map[int]bool{}
	for i := range results {
		r := &results[i]
		key := r.Cell
		key.Workers = 0
		ix.byCell[key] = &r.Median
		if !seenP[r.Policy] {
			seenP[r.Policy] = true
			ix.policies = append(ix.policies, r.Policy)
		}
		if !seenN[r.Prefixes] {
			seenN[r.Prefixes] = true
			ix.prefixes = append(ix.prefixes, r.Prefixes)
		}
		if !seenC[r.Concurrency] {
			seenC[r.Concurrency] = true
			ix.concurrency = append(ix.concurrency, r.Concurrency)
		}
	}
	sort.Ints(ix.prefixes)
	sort.Ints(ix.concurrency)
	return ix
}

func (ix resultIndex) get(policy string, n, c int) *Summary {
	return ix.byCell[Cell{Policy: policy, Prefixes: n, Concurrency: c}]
}
