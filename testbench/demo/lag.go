package demo

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
)

// lagMetric is kvrouter's histogram of KV-event lag: receive time minus the batch's
// timestamp.
const lagMetric = "kvrouter_kv_events_lag_seconds"

// LagHistogram is kvrouter's KV-event lag histogram as its /metrics page shows it.
type LagHistogram struct {
	// Count is the batches observed and SumSeconds their total lag.
	Count      uint64
	SumSeconds float64
	// Buckets are cumulative counts by upper bound, ascending (+Inf last).
	Buckets []LagBucket
}

// LagBucket is one cumulative histogram bucket.
type LagBucket struct {
	LE    float64
	Count uint64
}

// MeanMs is the mean lag in milliseconds (NaN with no batches).
func (h *LagHistogram) MeanMs() float64 {
	if h.Count == 0 {
		return math.NaN()
	}
	return 1000 * h.SumSeconds / float64(h.Count)
}

// QuantileBoundMs is the upper bound, in milliseconds, of the bucket holding quantile q:
// at least q of the batches arrived within it (+Inf when only the last bucket does, NaN
// with no batches).
func (h *LagHistogram) QuantileBoundMs(q float64) float64 {
	if h.Count == 0 {
		return math.NaN()
	}
	need := q * float64(h.Count)
	for _, b := range h.Buckets {
		if float64(b.Count) >= need {
			return 1000 * b.LE
		}
	}
	return math.Inf(1)
}

// ParseLagHistogram reads the lag histogram from a Prometheus text exposition page.
func ParseLagHistogram(r io.Reader) (*LagHistogram, error) { return parseHistogram(r, lagMetric) }

// parseHistogram reads the unlabelled histogram named lagMetric from a Prometheus text
// exposition page (LagHistogram holds any such histogram in seconds).
func parseHistogram(r io.Reader, lagMetric string) (*LagHistogram, error) {
	h := &LagHistogram{}
	found := false
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, lagMetric) {
			continue
		}
		name, rest, _ := strings.Cut(line, " ")
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			return nil, fmt.Errorf("demo: %s: no value in %q", lagMetric, line)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return nil, fmt.Errorf("demo: %s: %w", lagMetric, err)
		}
		switch {
		case name == lagMetric+"_sum":
			h.SumSeconds, found = v, true
		case name == lagMetric+"_count":
			h.Count, found = uint64(v), true
		case strings.HasPrefix(name, lagMetric+`_bucket{le="`) && strings.HasSuffix(name, `"}`):
			le, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimPrefix(name, lagMetric+`_bucket{le="`), `"}`), 64)
			if err != nil {
				return nil, fmt.Errorf("demo: %s bucket: %w", lagMetric, err)
			}
			h.Buckets, found = append(h.Buckets, LagBucket{LE: le, Count: uint64(v)}), true
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("demo: reading metrics: %w", err)
	}
	if !found {
		return nil, fmt.Errorf("demo: no %s on the metrics page", lagMetric)
	}
	sort.Slice(h.Buckets, func(i, j int) bool { return h.Buckets[i].LE < h.Buckets[j].LE })
	return h, nil
}
