package kvbench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// ServedHeader is the response header in which the gateway names the endpoint that served
// a request.
const ServedHeader = "x-gateway-destination-endpoint-served"

// HTTPConfig configures the URL target.
type HTTPConfig struct {
	// URL is the base URL of an OpenAI-compatible server or gateway ("http://host:port");
	// the API path is appended.
	URL string
	// Model is the model name sent in every request.
	Model string
	// MetricsURLs are the engines' /metrics URLs; their counter deltas give the engines'
	// own prefix-cache hit rate and their cache_config_info the KV capacity for the bound.
	MetricsURLs []string
	// IgnoreEOS sends vLLM's ignore_eos so every response has exactly OutputTokens tokens.
	IgnoreEOS bool
	// ResetPrefixCache empties every engine's prefix cache before each run, with
	// POST <metrics URL without /metrics>/reset_prefix_cache (vLLM serves it with
	// VLLM_SERVER_DEV_MODE=1). Without it, runs against the same engines start from
	// whatever the previous run left cached.
	ResetPrefixCache bool
	// Timeout bounds one request; 0 means 5 minutes.
	Timeout time.Duration
	// Client is the HTTP client; nil means a client with keep-alive for the concurrency.
	Client *http.Client
}

// HTTPTarget sends a workload to an OpenAI-compatible URL with a closed loop. It is safe
// for one Run at a time.
type HTTPTarget struct {
	cfg    HTTPConfig
	client *http.Client
	now    func() time.Time
}

// NewHTTPTarget checks cfg and returns a target; it sends nothing.
func NewHTTPTarget(cfg HTTPConfig) (*HTTPTarget, error) {
	if !strings.HasPrefix(cfg.URL, "http://") && !strings.HasPrefix(cfg.URL, "https://") {
		return nil, fmt.Errorf("kvbench: url %q must start with http:// or https://", cfg.URL)
	}
	cfg.URL = strings.TrimRight(cfg.URL, "/")
	if cfg.Model == "" {
		return nil, errors.New("kvbench: a model name is required in URL mode")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Minute
	}
	if cfg.ResetPrefixCache && len(cfg.MetricsURLs) == 0 {
		return nil, errors.New("kvbench: resetting prefix caches needs the engines' metrics URLs")
	}
	client := cfg.Client
	if client == nil {
		client = &http.Client{Transport: &http.Transport{
			MaxIdleConnsPerHost: 256,
			MaxConnsPerHost:     0,
			IdleConnTimeout:     90 * time.Second,
		}}
	}
	return &HTTPTarget{cfg: cfg, client: client, now: time.Now}, nil
}

// RunOutput is what a run produced.
type RunOutput struct {
	Results []Result
	// EngineHitRate is the engines' prefix-cache hit rate over the measured requests,
	// nil when no metrics were scraped.
	EngineHitRate *float64
	// Blocks is each scraped server's KV capacity in blocks (from cache_config_info), and
	// BlockSize their block size; empty when unknown.
	Blocks    []int
	BlockSize int
	// SyncMessages and SyncBytes are the router replicas' state sync traffic (sim mode).
	SyncMessages, SyncBytes int
}

// Run sends the workload's warmup requests with a closed loop of concurrency requests,
// waits for them to finish, scrapes the engines' metrics, sends the measured requests the
// same way and scrapes again.
func (t *HTTPTarget) Run(ctx context.Context, w *Workload, concurrency int, progress func()) (RunOutput, error) {
	if concurrency < 1 {
		return RunOutput{}, fmt.Errorf("kvbench: concurrency must be at least 1, got %d", concurrency)
	}
	if t.cfg.ResetPrefixCache {
		if err := t.resetAll(ctx); err != nil {
			return RunOutput{}, err
		}
	}
	reqs := w.Requests()
	warm := w.Config().Warmup
	t0 := t.now()
	do := func(ctx context.Context, r *Request) Result { return t.do(ctx, w, r, t0) }
	results := make([]Result, 0, len(reqs))
	results = append(results, closedLoop(ctx, reqs[:warm], concurrency, do, progress)...)
	var out RunOutput
	before, errBefore := t.scrapeAll(ctx)
	results = append(results, closedLoop(ctx, reqs[warm:], concurrency, do, progress)...)
	if err := ctx.Err(); err != nil {
		return RunOutput{}, fmt.Errorf("kvbench: run interrupted: %w", err)
	}
	out.Results = results
	if len(t.cfg.MetricsURLs) == 0 {
		return out, nil
	}
	after, errAfter := t.scrapeAll(ctx)
	if err := errors.Join(errBefore, errAfter); err != nil {
		return out, err
	}
	var hits, queries float64
	for i := range after {
		hits += after[i].PrefixHits - before[i].PrefixHits
		queries += after[i].PrefixQueries - before[i].PrefixQueries
		if after[i].NumGPUBlocks > 0 {
			out.Blocks = append(out.Blocks, after[i].NumGPUBlocks)
			out.BlockSize = after[i].BlockSize
		}
	}
	if queries > 0 {
		rate := hits / queries
		out.EngineHitRate = &rate
	}
	if len(out.Blocks) != len(after) {
		out.Blocks = nil
	}
	return out, nil
}

// closedLoop sends reqs in order with at most concurrency in flight: each worker takes the
// next request as soon as its previous one ends.
func closedLoop(ctx context.Context, reqs []Request, concurrency int, do func(context.Context, *Request) Result, progress func()) []Result {
	out := make([]Result, len(reqs))
	var mu sync.Mutex
	next := 0
	var wg sync.WaitGroup
	for range min(concurrency, len(reqs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				if i >= len(reqs) {
					return
				}
				out[i] = do(ctx, &reqs[i])
				if progress != nil {
					progress()
				}
			}
		}()
	}
	wg.Wait()
	// Requests never sent because ctx ended are reported as errors.
	for i := range out {
		if out[i].Err == "" && out[i].End == 0 {
			out[i] = Result{Seq: reqs[i].Seq, Prefix: reqs[i].Prefix, Warmup: reqs[i].Warmup, Err: "not sent: run interrupted"}
		}
	}
	return out
}

func (t *HTTPTarget) do(ctx context.Context, w *Workload, r *Request, t0 time.Time) Result {
	res, _ := t.post(ctx, w.Path(), w.Body(r, t.cfg.Model, t.cfg.IgnoreEOS), t0)
	res.Seq, res.Prefix, res.Warmup = r.Seq, r.Prefix, r.Warmup
	return res
}

// StreamUsage is what ReadStream takes from a streamed response.
type StreamUsage struct {
	PromptTokens     int
	CompletionTokens int
	CachedTokens     int
	// Chunks counts data events, Tokens those carrying generated text.
	Chunks int
	Tokens int
	// Text is the generated text (completions' text, chat's content), concatenated.
	Text string
}

// ErrNoUsage is returned when a stream ends without a usage chunk (the server ignored
// stream_options.include_usage).
var ErrNoUsage = errors.New("kvbench: stream ended without usage")

type sseChunk struct {
	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Content          string `json:"content"`
			ReasoningContent string `json:"reasoning_content"`
			Reasoning        string `json:"reasoning"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// ReadStream reads an OpenAI server-sent-event stream (completions or chat) to its end.
// firstToken is called once, when the first chunk carrying generated text arrives. It
// returns the usage of the final chunk, or an error for a malformed stream, an error
// event, or a stream without usage.
func ReadStream(r io.Reader, firstToken func()) (u StreamUsage, err error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	gotUsage, done := false, false
	var text strings.Builder
	defer func() { u.Text = text.String() }()
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasPrefix(line, []byte("data:")) {
			continue // comments, event names, blank separators
		}
		data := bytes.TrimSpace(line[len("data:"):])
		if bytes.Equal(data, []byte("[DONE]")) {
			done = true
			break
		}
		var c sseChunk
		if err := json.Unmarshal(data, &c); err != nil {
			return u, fmt.Errorf("kvbench: bad stream chunk %q: %w", truncate(data, 80), err)
		}
		if c.Error != nil {
			return u, fmt.Errorf("kvbench: server error in stream: %s", c.Error.Message)
		}
		u.Chunks++
		for _, ch := range c.Choices {
			text.WriteString(ch.Text)
			text.WriteString(ch.Delta.Content)
			if ch.Text != "" || ch.Delta.Content != "" || ch.Delta.ReasoningContent != "" || ch.Delta.Reasoning != "" {
				if u.Tokens == 0 && firstToken != nil {
					firstToken()
				}
				u.Tokens++
				break
			}
		}
		if c.Usage != nil {
			gotUsage = true
			u.PromptTokens = c.Usage.PromptTokens
			u.CompletionTokens = c.Usage.CompletionTokens
			u.CachedTokens = 0
			if d := c.Usage.PromptTokensDetails; d != nil {
				u.CachedTokens = d.CachedTokens
			}
		}
	}
	if err := sc.Err(); err != nil {
		return u, fmt.Errorf("kvbench: reading stream: %w", err)
	}
	if !done {
		return u, errors.New("kvbench: stream ended before [DONE]")
	}
	if !gotUsage {
		return u, ErrNoUsage
	}
	if u.CachedTokens < 0 || u.CachedTokens > u.PromptTokens {
		return u, fmt.Errorf("kvbench: usage reports %d cached of %d prompt tokens", u.CachedTokens, u.PromptTokens)
	}
	return u, nil
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "..."
	}
	return string(b)
}

// EngineMetrics are the figures kvbench reads from one vLLM /metrics page.
type EngineMetrics struct {
	// PrefixHits and PrefixQueries are vllm:prefix_cache_hits_total and
	// vllm:prefix_cache_queries_total (tokens), summed over label sets (older vLLM:
	// vllm:gpu_prefix_cache_*).
	PrefixHits    float64
	PrefixQueries float64
	// NumGPUBlocks and BlockSize come from vllm:cache_config_info's labels; 0 if absent.
	NumGPUBlocks int
	BlockSize    int
}

// ParseEngineMetrics reads the Prometheus text exposition of a vLLM server with the same
// parser the router's fleet scraper uses (prometheus/common's expfmt).
func ParseEngineMetrics(r io.Reader) (EngineMetrics, error) {
	var m EngineMetrics
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return m, fmt.Errorf("kvbench: bad metrics: %w", err)
	}
	sum := func(name string) (float64, bool) {
		f, ok := fams[name]
		if !ok {
			return 0, false
		}
		var v float64
		for _, s := range f.GetMetric() {
			v += s.GetCounter().GetValue() + s.GetGauge().GetValue() + s.GetUntyped().GetValue()
		}
		return v, true
	}
	hits, okHits := sum("vllm:prefix_cache_hits_total")
	queries, okQueries := sum("vllm:prefix_cache_queries_total")
	m.PrefixHits, m.PrefixQueries = hits, queries
	if !okHits && !okQueries { // older vLLM
		m.PrefixHits, _ = sum("vllm:gpu_prefix_cache_hits_total")
		m.PrefixQueries, _ = sum("vllm:gpu_prefix_cache_queries_total")
	}
	for _, s := range fams["vllm:cache_config_info"].GetMetric() {
		for _, l := range s.GetLabel() {
			n, err := strconv.Atoi(l.GetValue())
			if err != nil {
				continue
			}
			switch l.GetName() {
			case "num_gpu_blocks":
				m.NumGPUBlocks += n
			case "block_size":
				m.BlockSize = n
			}
		}
	}
	return m, nil
}

func (t *HTTPTarget) scrapeAll(ctx context.Context) ([]EngineMetrics, error) {
	out := make([]EngineMetrics, len(t.cfg.MetricsURLs))
	var errs []error
	for i, u := range t.cfg.MetricsURLs {
		m, err := t.scrape(ctx, u)
		if err != nil {
			errs = append(errs, err)
		}
		out[i] = m
	}
	return out, errors.Join(errs...)
}

func (t *HTTPTarget) scrape(ctx context.Context, url string) (EngineMetrics, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return EngineMetrics{}, fmt.Errorf("kvbench: metrics %s: %w", url, err)
	}
	resp, err := t.client.Do(req)
	if err != nil {
		return EngineMetrics{}, fmt.Errorf("kvbench: metrics %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return EngineMetrics{}, fmt.Errorf("kvbench: metrics %s: HTTP %d", url, resp.StatusCode)
	}
	m, err := ParseEngineMetrics(resp.Body)
	if err != nil {
		return m, fmt.Errorf("kvbench: metrics %s: %w", url, err)
	}
	return m, nil
}

// resetAll empties every engine's prefix cache.
func (t *HTTPTarget) resetAll(ctx context.Context) error {
	for _, m := range t.cfg.MetricsURLs {
		url := strings.TrimSuffix(strings.TrimRight(m, "/"), "/metrics") + "/reset_prefix_cache"
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
		if err != nil {
			return fmt.Errorf("kvbench: reset %s: %w", url, err)
		}
		resp, err := t.client.Do(req)
		if err != nil {
			return fmt.Errorf("kvbench: reset %s: %w", url, err)
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			return fmt.Errorf("kvbench: reset %s: HTTP %d (vLLM serves it only with VLLM_SERVER_DEV_MODE=1)", url, resp.StatusCode)
		}
	}
	return nil
}
