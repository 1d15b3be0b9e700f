package kvbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// Options is one kvbench invocation: a workload, a target (URL or simulated fleet), the
// cells to run and where to write the results. testbench/cmd/kvbench fills it from flags.
type Options struct {
	Workload WorkloadConfig
	// Prefixes and Concurrency list the N and C of the grid (one each for a single run).
	Prefixes    []int
	Concurrency []int
	// Policies are the policies of the grid (sim mode); URL mode uses one label.
	Policies []string
	Workers  int
	Reps     int
	// Sweep marks a grid run: its report is the reference's tables, not one cell's runs.
	Sweep bool
	// URL mode when HTTP is set, sim mode when Sim is set (exactly one of them).
	HTTP *HTTPConfig
	Sim  *SimConfig
	// BlockSize and BlocksPerServer give the bound's capacity in URL mode when the
	// engines' metrics do not (blocks of every server).
	BlockSize       int
	BlocksPerServer int
	// Tokenizer, when set, checks and produces the workload's token ids.
	Tokenizer Tokenizer
	// Parallel is how many sim runs go at once (URL mode always runs one at a time).
	Parallel int
	// JSONPath and PlotPath, when set, receive the records and the plot (.svg or .png).
	JSONPath string
	PlotPath string
	// PlotConcurrency is the concurrency the plot shows.
	PlotConcurrency int
	// KVPolicy is the policy of the bound table.
	KVPolicy string
	// Progress receives a progress bar; nil for none. Terminal selects in-place redraws.
	Progress         io.Writer
	ProgressTerminal bool
}

// Validate checks the options.
func (o *Options) Validate() error {
	if (o.HTTP == nil) == (o.Sim == nil) {
		return errors.New("kvbench: choose exactly one target: --url or --sim")
	}
	if len(o.Prefixes) == 0 || len(o.Concurrency) == 0 || len(o.Policies) == 0 {
		return errors.New("kvbench: need at least one prefix count, concurrency and policy")
	}
	for _, c := range o.Concurrency {
		if c < 1 {
			return fmt.Errorf("kvbench: concurrency must be at least 1, got %d", c)
		}
	}
	if o.Reps < 1 {
		return fmt.Errorf("kvbench: reps must be at least 1, got %d", o.Reps)
	}
	if o.Workers < 1 {
		return fmt.Errorf("kvbench: workers must be at least 1, got %d", o.Workers)
	}
	if o.HTTP != nil && len(o.Policies) != 1 {
		return errors.New("kvbench: URL mode measures whatever routes behind the URL: give one --policy label, not a list")
	}
	if o.PlotPath != "" {
		switch strings.ToLower(filepath.Ext(o.PlotPath)) {
		case ".svg", ".png":
		default:
			return fmt.Errorf("kvbench: plot file %q must end in .svg or .png", o.PlotPath)
		}
	}
	for _, n := range o.Prefixes {
		w := o.Workload
		w.Prefixes = n
		if err := w.Validate(); err != nil {
			return err
		}
	}
	if o.Sim != nil {
		if err := o.Sim.Validate(); err != nil {
			return err
		}
	}
	return nil
}

// Execute runs every repetition of every cell, prints the report on out, and writes the
// JSON and plot files when asked.
func Execute(ctx context.Context, o Options, out io.Writer) ([]CellResult, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	grid := Grid{Policies: o.Policies, Workers: o.Workers, Prefixes: o.Prefixes, Concurrency: o.Concurrency, Repetitions: o.Reps}
	workloads := newWorkloadCache(o.Workload, o.Tokenizer)
	total := len(grid.Cells()) * o.Reps
	var prog *Progress
	if o.Progress != nil {
		prog = NewProgress(o.Progress, o.ProgressTerminal, "kvbench", total, nil)
	}
	done := func() {
		if prog != nil {
			prog.Add(1)
		}
	}
	var run RunFunc
	parallel := 1
	mode := "url"
	if o.HTTP != nil {
		target, err := NewHTTPTarget(*o.HTTP)
		if err != nil {
			return nil, err
		}
		run = func(ctx context.Context, cell Cell, rep int) (Summary, error) {
			w, err := workloads.get(cell.Prefixes, rep)
			if err != nil {
				return Summary{}, err
			}
			res, err := target.Run(ctx, w, cell.Concurrency, nil)
			if err != nil {
				return Summary{}, err
			}
			blocks, bs := res.Blocks, res.BlockSize
			if len(blocks) == 0 {
				blocks, bs = repeat(o.BlocksPerServer, o.Workers), o.BlockSize
			}
			bound := ComputeBound(blocks, bs, cell.Prefixes, o.Workload.PrefixTokens, o.Workload.TailTokens)
			return Summarize(res.Results, SummaryInput{PrefixTokens: o.Workload.PrefixTokens, BlockSize: bs, Bound: bound, EngineHitRate: res.EngineHitRate}), nil
		}
	} else {
		mode = "sim"
		parallel = max(o.Parallel, 1)
		run = func(ctx context.Context, cell Cell, rep int) (Summary, error) {
			w, err := workloads.get(cell.Prefixes, rep)
			if err != nil {
				return Summary{}, err
			}
			res, err := RunSim(ctx, *o.Sim, w, cell.Policy, cell.Concurrency, rep)
			if err != nil {
				return Summary{}, err
			}
			return Summarize(res.Results, SummaryInput{PrefixTokens: o.Workload.PrefixTokens, BlockSize: res.BlockSize,
				Bound:         ComputeBound(res.Blocks, res.BlockSize, cell.Prefixes, o.Workload.PrefixTokens, o.Workload.TailTokens),
				EngineHitRate: res.EngineHitRate, SyncMessages: res.SyncMessages, SyncBytes: res.SyncBytes}), nil
		}
	}
	results, err := Sweep(ctx, grid, parallel, run, done)
	if prog != nil {
		prog.Finish()
	}
	if err != nil {
		return nil, err
	}
	if o.Sweep {
		err = WriteTables(out, results, o.KVPolicy)
	} else {
		for i, r := range results {
			if i > 0 {
				fmt.Fprintln(out)
			}
			if err = WriteSummary(out, r); err != nil {
				break
			}
		}
	}
	if err != nil {
		return nil, err
	}
	if o.JSONPath != "" {
		if err := writeFile(o.JSONPath, func(w io.Writer) error {
			return WriteJSON(w, Records(results, mode, o.Workload))
		}); err != nil {
			return results, err
		}
	}
	if o.PlotPath != "" {
		p := CachedRatioPlot(results, o.PlotConcurrency)
		write := p.WriteSVG
		if strings.EqualFold(filepath.Ext(o.PlotPath), ".png") {
			write = p.WritePNG
		}
		if err := writeFile(o.PlotPath, write); err != nil {
			return results, err
		}
	}
	return results, nil
}

func repeat(v, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = v
	}
	return out
}

func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("kvbench: %w", err)
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("kvbench: %w", err)
	}
	return nil
}

// workloadCache builds each (N, repetition) workload once: every policy and concurrency of
// one N and repetition sees the same requests in the same order.
type workloadCache struct {
	base WorkloadConfig
	tok  Tokenizer
	mu   sync.Mutex
	m    map[[2]int]*workloadEntry
}

type workloadEntry struct {
	once sync.Once
	w    *Workload
	err  error
}

func newWorkloadCache(base WorkloadConfig, tok Tokenizer) *workloadCache {
	return &workloadCache{base: base, tok: tok, m: map[[2]int]*workloadEntry{}}
}

func (c *workloadCache) get(prefixes, rep int) (*Workload, error) {
	c.mu.Lock()
	e := c.m[[2]int{prefixes, rep}]
	if e == nil {
		e = &workloadEntry{}
		c.m[[2]int{prefixes, rep}] = e
	}
	c.mu.Unlock()
	e.once.Do(func() {
		cfg := c.base
		cfg.Prefixes = prefixes
		cfg.Seed = c.base.Seed + uint64(rep)
		e.w, e.err = NewWorkload(cfg, c.tok)
	})
	return e.w, e.err
}
