package kvbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvrouter/kvrouter/scoring"
)

// ScriptOutput is what one run of a script produced.
type ScriptOutput struct {
	Results []Result
	// BoundCached is, per result, the prompt tokens an infinite prefix cache would have
	// served (the requests in the order they were sent).
	BoundCached []int
	// Servers are the fleet's addresses (for the load spread); Preemptions the engines'
	// total (sim mode; -1 when unknown).
	Servers     []string
	Preemptions int64
}

// ScriptSummary holds the figures of one script run, or the medians of several.
type ScriptSummary struct {
	// Requests counts the turns sent; Rejected those the server refused as invalid
	// (longer than max_model_len: vLLM's 400); Errors other failures; Skipped the later
	// turns of conversations that ended at a failed turn.
	Requests int `json:"requests"`
	Rejected int `json:"rejected"`
	Errors   int `json:"errors"`
	Skipped  int `json:"skipped"`
	// CachedRatio is cached prompt tokens over prompt tokens of the served requests;
	// BoundCachedRatio what an infinite cache would serve of the same requests.
	CachedRatio      float64 `json:"cached_ratio"`
	BoundCachedRatio float64 `json:"bound_cached_ratio"`
	TTFTP50Ms        float64 `json:"ttft_p50_ms"`
	TTFTP99Ms        float64 `json:"ttft_p99_ms"`
	// Throughput is served requests per second from the first send to the last end;
	// TokensPerS prompt plus output tokens per second over the same window.
	Throughput float64 `json:"requests_per_s"`
	TokensPerS float64 `json:"tokens_per_s"`
	// LoadSpread is the busiest server's computed prefill tokens (prompt minus cached)
	// over the mean across servers: 1 is even, the number of servers is all on one.
	LoadSpread float64 `json:"load_spread"`
	// ServersPerSession is the mean of the distinct servers each session's turns went to.
	ServersPerSession float64 `json:"servers_per_session"`
	Preemptions       float64 `json:"preemptions"`
	DecisionP50Us     float64 `json:"decision_p50_us"`
	DurationS         float64 `json:"duration_s"`
	FirstError        string  `json:"first_error,omitempty"`
}

// SummarizeScript computes a run's figures.
func SummarizeScript(out ScriptOutput) ScriptSummary {
	var s ScriptSummary
	var ttft, decision []float64
	var prompt, cached, bound, tokens int
	var first, last time.Duration
	started := false
	load := map[string]float64{}
	for _, a := range out.Servers {
		load[a] = 0
	}
	sessions := map[int]map[string]bool{}
	for i := range out.Results {
		r := &out.Results[i]
		if r.Err == "not sent" {
			s.Skipped++
			continue
		}
		s.Requests++
		if r.Rejected {
			s.Rejected++
			continue
		}
		if r.Err != "" {
			if s.Errors == 0 {
				s.FirstError = r.Err
			}
			s.Errors++
			continue
		}
		if !started || r.Start < first {
			first = r.Start
		}
		if !started || r.End > last {
			last = r.End
		}
		started = true
		prompt += r.PromptTokens
		cached += r.CachedTokens
		tokens += r.PromptTokens + r.OutputTokens
		if i < len(out.BoundCached) {
			bound += out.BoundCached[i]
		}
		ttft = append(ttft, float64(r.TTFT)/float64(time.Millisecond))
		if r.Decision > 0 {
			decision = append(decision, float64(r.Decision)/float64(time.Microsecond))
		}
		if r.Server != "" {
			load[r.Server] += float64(r.PromptTokens - r.CachedTokens)
			if sessions[r.Prefix] == nil {
				sessions[r.Prefix] = map[string]bool{}
			}
			sessions[r.Prefix][r.Server] = true
		}
	}
	if prompt > 0 {
		s.CachedRatio = float64(cached) / float64(prompt)
		s.BoundCachedRatio = float64(bound) / float64(prompt)
	}
	s.TTFTP50Ms = zeroNaN(Percentile(ttft, 50))
	s.TTFTP99Ms = zeroNaN(Percentile(ttft, 99))
	s.DecisionP50Us = zeroNaN(Percentile(decision, 50))
	if d := last - first; d > 0 {
		s.DurationS = d.Seconds()
		s.Throughput = float64(len(ttft)) / d.Seconds()
		s.TokensPerS = float64(tokens) / d.Seconds()
	}
	var sum, peak float64
	for _, v := range load {
		sum += v
		peak = math.Max(peak, v)
	}
	if sum > 0 {
		s.LoadSpread = peak / (sum / float64(len(load)))
	}
	if len(sessions) > 0 {
		n := 0
		for _, m := range sessions {
			n += len(m)
		}
		s.ServersPerSession = float64(n) / float64(len(sessions))
	}
	s.Preemptions = float64(out.Preemptions)
	return s
}

// MedianScript is the figure-by-figure median of several runs; counts of failures are
// summed so that one failure in any run shows.
func MedianScript(runs []ScriptSummary) ScriptSummary {
	if len(runs) == 0 {
		return ScriptSummary{}
	}
	med := func(f func(ScriptSummary) float64) float64 {
		xs := make([]float64, len(runs))
		for i, r := range runs {
			xs[i] = f(r)
		}
		return Percentile(xs, 50)
	}
	out := ScriptSummary{
		Requests:          int(math.Round(med(func(s ScriptSummary) float64 { return float64(s.Requests) }))),
		CachedRatio:       med(func(s ScriptSummary) float64 { return s.CachedRatio }),
		BoundCachedRatio:  med(func(s ScriptSummary) float64 { return s.BoundCachedRatio }),
		TTFTP50Ms:         med(func(s ScriptSummary) float64 { return s.TTFTP50Ms }),
		TTFTP99Ms:         med(func(s ScriptSummary) float64 { return s.TTFTP99Ms }),
		Throughput:        med(func(s ScriptSummary) float64 { return s.Throughput }),
		TokensPerS:        med(func(s ScriptSummary) float64 { return s.TokensPerS }),
		LoadSpread:        med(func(s ScriptSummary) float64 { return s.LoadSpread }),
		ServersPerSession: med(func(s ScriptSummary) float64 { return s.ServersPerSession }),
		Preemptions:       med(func(s ScriptSummary) float64 { return s.Preemptions }),
		DecisionP50Us:     med(func(s ScriptSummary) float64 { return s.DecisionP50Us }),
		DurationS:         med(func(s ScriptSummary) float64 { return s.DurationS }),
	}
	for _, r := range runs {
		out.Rejected += r.Rejected
		out.Errors += r.Errors
		out.Skipped += r.Skipped
		if out.FirstError == "" {
			out.FirstError = r.FirstError
		}
	}
	return out
}

// RunScriptSim runs one repetition of a script in the simulated fleet with one policy:
// every session starts at its time (open loop) and sends its turns in order, each turn
// its think time after the previous response reached the client. rep varies the
// policies' seeds.
func RunScriptSim(ctx context.Context, cfg SimConfig, s *Script, policy string, rep int) (ScriptOutput, error) {
	if err := cfg.Validate(); err != nil {
		return ScriptOutput{}, err
	}
	if s.API == APIChat && cfg.Prompts == nil {
		return ScriptOutput{}, errors.New("kvbench: chat in sim mode needs the chat template: the model's tokenizer_config.json (--tokenizer)")
	}
	r, _, err := newSimRun(ctx, &cfg, policy, rep, s.vocab)
	if err != nil {
		return ScriptOutput{}, err
	}
	r.pending = s.Requests()
	r.scrape()
	out := ScriptOutput{Results: make([]Result, r.pending), BoundCached: make([]int, r.pending), Servers: r.addrs}
	entries := make([]boundEntry, r.pending)
	rtt2 := cfg.RTT.Seconds() / 2
	seq := 0
	for si := range s.Sessions {
		sess := &s.Sessions[si]
		base := seq
		seq += len(sess.Turns)
		answers := make([]string, len(sess.Turns))
		var send func(k int)
		send = func(k int) {
			i := base + k
			res := &out.Results[i]
			*res = Result{Seq: i, Prefix: si, Start: secs(r.f.Now())}
			// stop ends the session at turn k: its later turns are never sent.
			stop := func() {
				for j := k + 1; j < len(sess.Turns); j++ {
					out.Results[base+j] = Result{Seq: base + j, Prefix: si, Err: "not sent"}
				}
				r.pending -= len(sess.Turns) - k
			}
			if ctx.Err() != nil || r.err != nil {
				res.Err = "not sent"
				stop()
				return
			}
			var ids []uint32
			var err error
			if s.API == APIChat {
				ids, err = cfg.Prompts.PromptTokens(s.Path(), s.Body(sess, k, answers, cfg.Model, true))
			} else {
				ids = s.PromptIDs(&sess.Turns[k])
			}
			if err != nil {
				res.Err = "tokenizing: " + err.Error()
				stop()
				return
			}
			var outputs []uint32
			fail := func(err error) {
				res.Err = err.Error()
				res.End = secs(r.f.Now() + rtt2)
				stop()
			}
			done := func() {
				if res.Err != "" {
					stop()
					return
				}
				r.pending--
				// The bound's cache holds what the server computed: the prompt and every
				// output but the last (sampled, never fed back).
				entries[i] = boundEntry{promptLen: len(ids),
					keys: chainKeys(append(ids[:len(ids):len(ids)], outputs[:max(len(outputs)-1, 0)]...), cfg.Engine.BlockSize)}
				answers[k] = s.OutputText(outputs)
				if k+1 < len(sess.Turns) {
					r.f.After(rtt2+sess.Turns[k+1].Think.Seconds(), func() { send(k + 1) })
				}
			}
			r.f.After(rtt2, func() {
				sreq := &scoring.Request{ID: "req-" + strconv.Itoa(i), Model: cfg.Model, BaseModel: cfg.Model, TokenIDs: ids}
				r.pick(simJob{sreq: sreq, replica: i % len(r.routers), res: res, output: sess.Turns[k].Output,
					onToken: func(t uint32) { outputs = append(outputs, t) }, fail: fail, done: done})
			})
		}
		r.f.After(sess.Start.Seconds(), func() { send(0) })
	}
	r.f.Run()
	if r.err != nil {
		return ScriptOutput{}, r.err
	}
	if err := ctx.Err(); err != nil {
		return ScriptOutput{}, fmt.Errorf("kvbench: run interrupted: %w", err)
	}
	for _, st := range r.stats() {
		out.Preemptions += st.Preemptions
	}
	infiniteBound(&out, entries, cfg.Engine.BlockSize)
	return out, nil
}

// ScriptRecord is one policy's result on one workload, for the JSON report.
type ScriptRecord struct {
	Workload    string `json:"workload"`
	Policy      string `json:"policy"`
	Mode        string `json:"mode"`
	Workers     int    `json:"workers"`
	KVBytes     int64  `json:"kv_bytes_per_server"`
	MaxModelLen int    `json:"max_model_len"`
	Reps        int    `json:"reps"`
	ScriptSummary
}

// ScriptOptions is a script benchmark: every policy, Reps times, in the simulated fleet
// (Sim) or against a URL (HTTP, one policy label).
type ScriptOptions struct {
	Script   *Script
	Policies []string
	Reps     int
	Sim      *SimConfig
	HTTP     *HTTPConfig
	Parallel int
	JSONPath string
}

// ExecuteScript runs every policy's repetitions (sim runs in parallel), prints a table and
// writes the JSON records when asked.
func ExecuteScript(ctx context.Context, o ScriptOptions, w io.Writer) ([]ScriptRecord, error) {
	if (o.Sim == nil) == (o.HTTP == nil) {
		return nil, errors.New("kvbench: choose exactly one target: --url or --sim")
	}
	if o.Reps < 1 || len(o.Policies) == 0 {
		return nil, errors.New("kvbench: need at least one policy and one repetition")
	}
	runs := make([][]ScriptSummary, len(o.Policies))
	for i := range runs {
		runs[i] = make([]ScriptSummary, o.Reps)
	}
	rec := ScriptRecord{Workload: o.Script.Name, Reps: o.Reps}
	if o.HTTP != nil {
		if len(o.Policies) != 1 {
			return nil, errors.New("kvbench: URL mode measures whatever routes behind the URL: give one --policy label")
		}
		t, err := NewHTTPTarget(*o.HTTP)
		if err != nil {
			return nil, err
		}
		rec.Mode, rec.Workers = "url", len(o.HTTP.MetricsURLs)
		for k := range o.Reps {
			out, err := t.RunScript(ctx, o.Script)
			if err != nil {
				return nil, err
			}
			runs[0][k] = SummarizeScript(out)
		}
	} else {
		rec.Mode, rec.Workers, rec.MaxModelLen = "sim", len(o.Sim.Servers), o.Sim.Engine.MaxModelLen
		rec.KVBytes = o.Sim.Servers[0].KVBytes
		type job struct{ p, k int }
		jobs := make(chan job)
		errs := make([]error, len(o.Policies)*o.Reps)
		var wg sync.WaitGroup
		for range max(o.Parallel, 1) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := range jobs {
					out, err := RunScriptSim(ctx, *o.Sim, o.Script, o.Policies[j.p], j.k)
					errs[j.p*o.Reps+j.k] = err
					if err == nil {
						runs[j.p][j.k] = SummarizeScript(out)
					}
				}
			}()
		}
		for p := range o.Policies {
			for k := range o.Reps {
				jobs <- job{p, k}
			}
		}
		close(jobs)
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return nil, err
		}
	}
	var recs []ScriptRecord
	for p, name := range o.Policies {
		r := rec
		r.Policy = name
		r.ScriptSummary = MedianScript(runs[p])
		recs = append(recs, r)
	}
	if err := WriteScriptTable(w, recs); err != nil {
		return nil, err
	}
	if o.JSONPath != "" {
		if err := writeFile(o.JSONPath, func(w io.Writer) error { return writeJSONValue(w, recs) }); err != nil {
			return recs, err
		}
	}
	return recs, nil
}

// WriteScriptTable prints one row per policy.
func WriteScriptTable(w io.Writer, recs []ScriptRecord) error {
	if len(recs) == 0 {
		return nil
	}
	var b strings.Builder
	r0 := recs[0]
	fmt.Fprintf(&b, "workload %s (%s mode, %d servers, %d requests, %d reps, medians)\n\n", r0.Workload, r0.Mode, r0.Workers, r0.Requests, r0.Reps)
	header := []string{"policy", "cached", "bound", "TTFT p50 ms", "TTFT p99 ms", "req/s", "tok/s", "load spread", "servers/session", "preempt", "rejected", "errors"}
	var rows [][]string
	for _, r := range recs {
		rows = append(rows, []string{r.Policy, pct(r.CachedRatio, 1), pct(r.BoundCachedRatio, 1),
			fmt.Sprintf("%.0f", r.TTFTP50Ms), fmt.Sprintf("%.0f", r.TTFTP99Ms), fmt.Sprintf("%.2f", r.Throughput),
			thousands(r.TokensPerS), fmt.Sprintf("%.2f", r.LoadSpread), fmt.Sprintf("%.2f", r.ServersPerSession),
			fmt.Sprintf("%.0f", r.Preemptions), strconv.Itoa(r.Rejected), strconv.Itoa(r.Errors)})
	}
	writeTable(&b, header, rows)
	b.WriteString("\n")
	for _, r := range recs {
		if r.FirstError != "" {
			fmt.Fprintf(&b, "%s: first error: %s\n", r.Policy, r.FirstError)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}
