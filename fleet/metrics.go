package fleet

import (
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvrouter/kvrouter/scoring"
)

// The vLLM metric families the fleet reads.
const (
	metricRunning     = "vllm:num_requests_running"
	metricWaiting     = "vllm:num_requests_waiting"
	metricKVUsage     = "vllm:kv_cache_usage_perc"
	metricGPUUsageOld = "vllm:gpu_cache_usage_perc" // the name before vLLM 0.10
	metricCacheConfig = "vllm:cache_config_info"
	labelModelName    = "model_name"

	// maxCount bounds a believable request count.
	maxCount = 1 << 30
)

// ParseError is returned by ParseMetrics for a body that is not usable; Reason is a
// short label value for metrics ("syntax", "missing", "value").
type ParseError struct {
	Reason string
	Err    error
}

// Error describes the problem with the metrics text.
func (e *ParseError) Error() string { return "fleet: vllm metrics: " + e.Err.Error() }

// Unwrap returns the underlying error.
func (e *ParseError) Unwrap() error { return e.Err }

// ParseMetrics reads vLLM's /metrics in the Prometheus text format and returns the load
// figures. Where a family has samples for several model_name values, only those of the
// given models count (summed for request counts, averaged for cache usage, as one server
// reports one sample per data-parallel engine); when none of them match, all count.
// The result has Valid set. It returns a *ParseError when the text does not parse or
// lacks vllm:num_requests_running or vllm:num_requests_waiting.
func ParseMetrics(r io.Reader, models []string) (scoring.Metrics, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return scoring.Metrics{}, &ParseError{Reason: "syntax", Err: err}
	}
	var m scoring.Metrics
	running, ok, err := reduce(fams[metricRunning], models, false)
	if err != nil || !ok {
		return m, missingOr(metricRunning, err)
	}
	waiting, ok, err := reduce(fams[metricWaiting], models, false)
	if err != nil || !ok {
		return m, missingOr(metricWaiting, err)
	}
	usageFam := fams[metricKVUsage]
	if usageFam == nil {
		usageFam = fams[metricGPUUsageOld]
	}
	usage, _, err := reduce(usageFam, models, true)
	if err != nil {
		return m, err
	}
	if running > maxCount || waiting > maxCount {
		return m, &ParseError{Reason: "value", Err: fmt.Errorf("request count %v/%v out of range", running, waiting)}
	}
	m.Running = int(math.Round(running))
	m.Waiting = int(math.Round(waiting))
	m.KVCacheUsage = min(max(usage, 0), 1)
	if f := fams[metricCacheConfig]; f != nil {
		for _, s := range f.GetMetric() {
			blocks, errB := labelInt(s, "num_gpu_blocks")
			size, errS := labelInt(s, "block_size")
			if errB == nil && errS == nil {
				m.NumGPUBlocks, m.BlockSize = blocks, size
				break
			}
		}
	}
	m.Valid = true
	return m, nil
}

func missingOr(name string, err error) error {
	if err != nil {
		return err
	}
	return &ParseError{Reason: "missing", Err: fmt.Errorf("no %s sample", name)}
}

func labelInt(s *dto.Metric, name string) (int, error) {
	for _, l := range s.GetLabel() {
		if l.GetName() == name {
			v, err := strconv.Atoi(l.GetValue())
			if err != nil || v < 0 {
				return 0, errors.New("bad label")
			}
			return v, nil
		}
	}
	return 0, errors.New("no label")
}

func sampleValue(s *dto.Metric) float64 {
	switch {
	case s.Gauge != nil:
		return s.Gauge.GetValue()
	case s.Untyped != nil:
		return s.Untyped.GetValue()
	case s.Counter != nil:
		return s.Counter.GetValue()
	}
	return math.NaN()
}

func modelOf(s *dto.Metric) (string, bool) {
	for _, l := range s.GetLabel() {
		if l.GetName() == labelModelName {
			return l.GetValue(), true
		}
	}
	return "", false
}

// reduce sums (or averages) the family's samples for the given models; ok is false when
// the family has no sample.
func reduce(f *dto.MetricFamily, models []string, mean bool) (v float64, ok bool, err error) {
	if f == nil || len(f.GetMetric()) == 0 {
		return 0, false, nil
	}
	var sum float64
	var n int
	for pass := range 2 {
		for _, s := range f.GetMetric() {
			if pass == 0 {
				name, has := modelOf(s)
				if !has || !slices.Contains(models, name) {
					continue
				}
			}
			x := sampleValue(s)
			if math.IsNaN(x) || math.IsInf(x, 0) || x < 0 {
				return 0, false, &ParseError{Reason: "value", Err: fmt.Errorf("%s has value %v", f.GetName(), x)}
			}
			sum += x
			n++
		}
		if n > 0 {
			break
		}
	}
	if mean && n > 0 {
		sum /= float64(n)
	}
	return sum, n > 0, nil
}
