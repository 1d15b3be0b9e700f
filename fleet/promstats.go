package fleet

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics is the fleet's typed set of Prometheus metrics. Per-endpoint gauges are read
// from the registry at collection time, so removed endpoints vanish without bookkeeping.
type metrics struct {
	f            *Fleet
	scrapeErrors *prometheus.CounterVec
	duration     prometheus.Histogram
	changes      *prometheus.CounterVec
	passive      *prometheus.CounterVec

	endpoints  *prometheus.Desc
	inFlight   *prometheus.Desc
	running    *prometheus.Desc
	waiting    *prometheus.Desc
	kvUsage    *prometheus.Desc
	eligible   *prometheus.Desc
	metricsAge *prometheus.Desc

	// The Inference Extension picker's pool series (its pkg/epp/metrics, v1.x), derived
	// from the same figures at collection time; pool is their name label.
	pool        string
	poolReady   *prometheus.Desc
	poolKVUsage *prometheus.Desc
	poolQueue   *prometheus.Desc
	poolRunning *prometheus.Desc
	podQueue    *prometheus.Desc
}

func newMetrics(f *Fleet, reg prometheus.Registerer, pool string) *metrics {
	m := &metrics{
		f:    f,
		pool: pool,
		scrapeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_fleet_scrape_errors_total",
			Help: "Failed scrapes of endpoints' vLLM /metrics, by endpoint and reason.",
		}, []string{"endpoint", "reason"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvrouter_fleet_scrape_duration_seconds",
			Help:    "Time taken by one scrape of an endpoint's vLLM /metrics.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}),
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_fleet_changes_total",
			Help: "Endpoints added, updated and removed.",
		}, []string{"kind"}),
		passive: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_fleet_passive_signals_total",
			Help: "Passive failure signals (kv_events, upstream, scrape) by result: ejected (the endpoint became suspect), kept_last (the last eligible endpoint of a model), ignored.",
		}, []string{"signal", "result"}),
		endpoints: prometheus.NewDesc("kvrouter_fleet_endpoints",
			"Endpoints by state (pending, healthy, unhealthy, unscraped, suspect).", []string{"state"}, nil),
		inFlight: prometheus.NewDesc("kvrouter_endpoint_in_flight_requests",
			"Requests the router sent to the endpoint that have not finished.", []string{"endpoint"}, nil),
		running: prometheus.NewDesc("kvrouter_endpoint_running_requests",
			"The endpoint's vllm:num_requests_running at the last good scrape.", []string{"endpoint"}, nil),
		waiting: prometheus.NewDesc("kvrouter_endpoint_waiting_requests",
			"The endpoint's vllm:num_requests_waiting at the last good scrape.", []string{"endpoint"}, nil),
		kvUsage: prometheus.NewDesc("kvrouter_endpoint_kv_cache_usage_ratio",
			"The endpoint's vllm:kv_cache_usage_perc (0..1) at the last good scrape.", []string{"endpoint"}, nil),
		eligible: prometheus.NewDesc("kvrouter_endpoint_eligible",
			"1 when the endpoint may receive requests, else 0.", []string{"endpoint"}, nil),
		metricsAge: prometheus.NewDesc("kvrouter_endpoint_metrics_age_seconds",
			"Age of the endpoint's last good scrape.", []string{"endpoint"}, nil),
		poolReady: prometheus.NewDesc("inference_pool_ready_pods",
			"Inference Extension series: eligible endpoints whose last scrape is within the staleness limit (limits.metrics_staleness_limit).", []string{"name"}, nil),
		poolKVUsage: prometheus.NewDesc("inference_pool_average_kv_cache_utilization",
			"Inference Extension series: mean vllm:kv_cache_usage_perc (0..1) of the endpoints counted in inference_pool_ready_pods.", []string{"name"}, nil),
		poolQueue: prometheus.NewDesc("inference_pool_average_queue_size",
			"Inference Extension series: mean vllm:num_requests_waiting of the endpoints counted in inference_pool_ready_pods.", []string{"name"}, nil),
		podQueue: prometheus.NewDesc("inference_pool_per_pod_queue_size",
			"Inference Extension series: the endpoint's vllm:num_requests_waiting at the last good scrape; model_server_pod is its address.", []string{"name", "model_server_pod"}, nil),
		poolRunning: prometheus.NewDesc("inference_pool_average_running_requests",
			"Inference Extension series: mean vllm:num_requests_running of the endpoints counted in inference_pool_ready_pods.", []string{"name"}, nil),
	}
	if reg != nil {
		reg.MustRegister(m.scrapeErrors, m.duration, m.changes, m.passive, m)
	}
	return m
}

func (m *metrics) forget(addr string) {
	m.scrapeErrors.DeletePartialMatch(prometheus.Labels{"endpoint": addr})
}

// Describe implements prometheus.Collector for the per-endpoint gauges.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.endpoints, m.inFlight, m.running, m.waiting, m.kvUsage, m.eligible, m.metricsAge,
		m.poolReady, m.poolKVUsage, m.poolQueue, m.poolRunning, m.podQueue} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	counts := make([]int, len(stateNames))
	now := m.f.now()
	var ready int
	var kv, waiting, running float64
	for _, ep := range m.f.table.Load().all {
		st := State(ep.state.Load())
		counts[st]++
		a := ep.addr
		ch <- prometheus.MustNewConstMetric(m.inFlight, prometheus.GaugeValue, float64(ep.inFlight.Load()), a)
		el := 0.0
		if ep.eligible() {
			el = 1
			// The picker averages over its ready pods with fresh metrics; here, the
			// endpoints that may be routed to whose figures the policies would trust.
			if fm := m.f.fresh(ep, now); fm.Valid {
				ready++
				kv += fm.KVCacheUsage
				waiting += float64(fm.Waiting)
				running += float64(fm.Running)
			}
		}
		ch <- prometheus.MustNewConstMetric(m.eligible, prometheus.GaugeValue, el, a)
		if s := ep.last.Load(); s != nil {
			ch <- prometheus.MustNewConstMetric(m.running, prometheus.GaugeValue, float64(s.m.Running), a)
			ch <- prometheus.MustNewConstMetric(m.waiting, prometheus.GaugeValue, float64(s.m.Waiting), a)
			ch <- prometheus.MustNewConstMetric(m.podQueue, prometheus.GaugeValue, float64(s.m.Waiting), m.pool, a)
			ch <- prometheus.MustNewConstMetric(m.kvUsage, prometheus.GaugeValue, s.m.KVCacheUsage, a)
			ch <- prometheus.MustNewConstMetric(m.metricsAge, prometheus.GaugeValue, now.Sub(s.at).Seconds(), a)
		}
	}
	for i, n := range counts {
		ch <- prometheus.MustNewConstMetric(m.endpoints, prometheus.GaugeValue, float64(n), stateNames[i])
	}
	ch <- prometheus.MustNewConstMetric(m.poolReady, prometheus.GaugeValue, float64(ready), m.pool)
	if ready == 0 {
		return // no mean of nothing (the picker, too, leaves the averages out then)
	}
	n := float64(ready)
	ch <- prometheus.MustNewConstMetric(m.poolKVUsage, prometheus.GaugeValue, kv/n, m.pool)
	ch <- prometheus.MustNewConstMetric(m.poolQueue, prometheus.GaugeValue, waiting/n, m.pool)
	ch <- prometheus.MustNewConstMetric(m.poolRunning, prometheus.GaugeValue, running/n, m.pool)
}
