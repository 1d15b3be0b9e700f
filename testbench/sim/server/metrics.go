package server

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// vLLM's histogram buckets (vllm/v1/metrics/loggers.py).
var (
	ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
		1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	e2eBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
		50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
)

// metrics are vLLM's own series, one child per engine (data-parallel rank). Gauges and
// counters read the engines' statistics at scrape time.
type metrics struct {
	ttft *prometheus.HistogramVec
	e2e  *prometheus.HistogramVec
	// gen is vllm:request_generation_tokens: each finished request's output tokens,
	// in vLLM's 1-2-5 buckets up to max_model_len.
	gen *prometheus.HistogramVec
}

// buckets125 is vLLM's build_1_2_5_buckets: 1, 2, 5, 10, 20, 50, ... up to max.
func buckets125(max int) []float64 {
	var out []float64
	for e := 1; ; e *= 10 {
		for _, m := range []int{1, 2, 5} {
			if m*e > max {
				return out
			}
			out = append(out, float64(m*e))
		}
	}
}

// statsCollector exposes every rank's engine statistics under vLLM's names.
type statsCollector struct {
	s                                      *Server
	running, waiting, usage, cacheInfo     *prometheus.Desc
	queries, hits, prompt, gen, preemption *prometheus.Desc
}

func newMetrics(s *Server, reg prometheus.Registerer) (*metrics, error) {
	labels := []string{"model_name", "engine"}
	m := &metrics{
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "vllm:time_to_first_token_seconds",
			Help: "Histogram of time to first token in seconds.", Buckets: ttftBuckets}, labels),
		e2e: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "vllm:e2e_request_latency_seconds",
			Help: "Histogram of e2e request latency in seconds.", Buckets: e2eBuckets}, labels),
		gen: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "vllm:request_generation_tokens",
			Help: "Number of generation tokens processed.", Buckets: buckets125(s.cfg.Engine.MaxModelLen)}, labels),
	}
	d := func(name, help string, extra ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, append(append([]string{}, labels...), extra...), nil)
	}
	c := &statsCollector{s: s,
		running:    d("vllm:num_requests_running", "Number of requests in model execution batches."),
		waiting:    d("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
		usage:      d("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
		queries:    d("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens."),
		hits:       d("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens."),
		prompt:     d("vllm:prompt_tokens_total", "Number of prefill tokens processed."),
		gen:        d("vllm:generation_tokens_total", "Number of generation tokens processed."),
		preemption: d("vllm:num_preemptions_total", "Cumulative number of preemption from the engine."),
		cacheInfo: d("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
			"block_size", "cache_dtype", "enable_prefix_caching", "gpu_memory_utilization", "num_gpu_blocks"),
	}
	if reg == nil {
		return m, nil
	}
	for _, col := range []prometheus.Collector{m.ttft, m.e2e, m.gen, c} {
		if err := reg.Register(col); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.running, c.waiting, c.usage, c.queries, c.hits, c.prompt, c.gen, c.preemption, c.cacheInfo} {
		ch <- d
	}
}

func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	model := c.s.cfg.servedName()
	for i, r := range c.s.ranks {
		st := r.stats()
		eng := strconv.Itoa(i)
		g := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, model, eng)
		}
		k := func(d *prometheus.Desc, v int64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), model, eng)
		}
		g(c.running, float64(st.Running))
		g(c.waiting, float64(st.Waiting))
		g(c.usage, st.KVCacheUsage)
		k(c.queries, st.PrefixCacheQueries)
		k(c.hits, st.PrefixCacheHits)
		k(c.prompt, st.PromptTokens)
		k(c.gen, st.GenerationTokens)
		k(c.preemption, st.Preemptions)
		ch <- prometheus.MustNewConstMetric(c.cacheInfo, prometheus.GaugeValue, 1, model, eng,
			strconv.Itoa(st.BlockSize), "auto", "True",
			strconv.FormatFloat(c.s.cfg.GPUMemoryUtilization, 'g', -1, 64), strconv.Itoa(st.NumGPUBlocks))
	}
}
