package fleet

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"iter"
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
	// metricGenTokens is the histogram of each finished request's output tokens; its
	// _count and _sum lines belong to it.
	metricGenTokens = "vllm:request_generation_tokens"
	labelModelName  = "model_name"

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
//
// Only the families read are parsed in full; the lines of every other family are
// checked for a plain metric name and skipped (a page that is not Prometheus text at
// all still fails as "syntax"; a malformed sample of an unrelated family no longer
// does). A page the skim cannot classify (quoted UTF-8 names) is parsed whole.
func ParseMetrics(r io.Reader, models []string) (scoring.Metrics, error) {
	body, err := io.ReadAll(r)
	if err != nil {
		return scoring.Metrics{}, &ParseError{Reason: "syntax", Err: err}
	}
	return parseMetrics(body, models)
}

// parseMetrics is ParseMetrics on the whole body.
func parseMetrics(body []byte, models []string) (scoring.Metrics, error) {
	text := body
	if kept, ok := readFamilies(body); ok {
		text = kept
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(text))
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
	if f := fams[metricGenTokens]; f != nil {
		m.FinishedRequests, m.OutputTokens = outputTokens(f, models)
	}
	m.Valid = true
	return m, nil
}

// outputTokens sums the histogram's _count and _sum over the given models' samples (all
// samples when none match), as reduce does; a sample with a count or sum that is not a
// finite non-negative number, or a sum without a count, makes both 0: the figure is
// optional, and a bad one must not fail the scrape.
func outputTokens(f *dto.MetricFamily, models []string) (count, sum float64) {
	for s := range modelSamples(f, models) {
		h := s.GetHistogram()
		if h == nil {
			continue
		}
		c, x := float64(h.GetSampleCount()), h.GetSampleSum()
		if math.IsNaN(x) || math.IsInf(x, 0) || x < 0 || (c == 0 && x > 0) {
			return 0, 0
		}
		count += c
		sum += x
	}
	return count, sum
}

// isRead reports whether name is a family ParseMetrics reads.
func isRead(name []byte) bool {
	switch string(name) {
	case metricRunning, metricWaiting, metricKVUsage, metricGPUUsageOld, metricCacheConfig,
		metricGenTokens, metricGenTokens + "_bucket", metricGenTokens + "_count", metricGenTokens + "_sum":
		return true
	}
	return false
}

// readFamilies returns the lines of body that belong to the families ParseMetrics reads
// (their samples and their HELP and TYPE comments), in order: parsing a vLLM page of
// histograms whole cost ~700 allocations per scrape, and a router scrapes every endpoint
// every second. ok is false when a line is neither blank, a comment nor a sample whose
// metric name is plain ([a-zA-Z_:][a-zA-Z0-9_:]*); the caller then parses the whole
// body, so that text which is not Prometheus text fails exactly as before.
func readFamilies(body []byte) (kept []byte, ok bool) {
	kept = make([]byte, 0, min(len(body), 2048))
	for len(body) > 0 {
		line := body
		if i := bytes.IndexByte(body, '\n'); i >= 0 {
			line, body = body[:i], body[i+1:]
		} else {
			body = nil
		}
		t := bytes.TrimLeft(line, " \t")
		if len(t) == 0 {
			continue
		}
		if t[0] == '#' {
			// "# HELP name ..." and "# TYPE name ...": keep those of a family read; any
			// other comment is dropped, as the parser ignores it.
			c := bytes.TrimLeft(t[1:], " \t")
			if bytes.HasPrefix(c, []byte("HELP")) || bytes.HasPrefix(c, []byte("TYPE")) {
				c = c[4:]
				if len(c) > 0 && (c[0] == ' ' || c[0] == '\t') {
					c = bytes.TrimLeft(c, " \t")
					if n := bytes.IndexAny(c, " \t"); n >= 0 {
						c = c[:n]
					}
					if isRead(c) {
						kept = append(append(kept, line...), '\n')
					}
				}
			}
			continue
		}
		n := 0
		for n < len(t) && isNameByte(t[n], n == 0) {
			n++
		}
		if n == 0 || (n < len(t) && t[n] != '{' && t[n] != ' ' && t[n] != '\t') {
			return nil, false
		}
		if isRead(t[:n]) {
			kept = append(append(kept, line...), '\n')
		}
	}
	return kept, true
}

// isNameByte reports whether c may appear in a plain metric name (first: at its start).
func isNameByte(c byte, first bool) bool {
	return c == '_' || c == ':' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (!first && c >= '0' && c <= '9')
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
	for s := range modelSamples(f, models) {
		x := sampleValue(s)
		if math.IsNaN(x) || math.IsInf(x, 0) || x < 0 {
			return 0, false, &ParseError{Reason: "value", Err: fmt.Errorf("%s has value %v", f.GetName(), x)}
		}
		sum += x
		n++
	}
	if mean && n > 0 {
		sum /= float64(n)
	}
	return sum, n > 0, nil
}

// modelSamples yields the family's samples for the given models or, when none is for
// them, all of its samples (an engine that labels no model_name, or names its model
// otherwise).
func modelSamples(f *dto.MetricFamily, models []string) iter.Seq[*dto.Metric] {
	forModels := func(s *dto.Metric) bool {
		name, has := modelOf(s)
		return has && slices.Contains(models, name)
	}
	return func(yield func(*dto.Metric) bool) {
		some := slices.ContainsFunc(f.GetMetric(), forModels)
		for _, s := range f.GetMetric() {
			if some && !forModels(s) {
				continue
			}
			if !yield(s) {
				return
			}
		}
	}
}
