package extproc_test

import (
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/config"
	"github.com/kvrouter/kvrouter/extproc"
	"github.com/kvrouter/kvrouter/index"
	"github.com/kvrouter/kvrouter/internal/testindex"
	"github.com/kvrouter/kvrouter/openai"
	"github.com/kvrouter/kvrouter/placement"
	"github.com/kvrouter/kvrouter/scoring"
	"github.com/kvrouter/kvrouter/testbench/fakeenvoy"
)

// prefixTokenizer reads a completions prompt "p<P> t<T>" as 64 blocks of 16 tokens of
// prefix P followed by 8 blocks of tail T, so that requests share prefixes by name.
type prefixTokenizer struct{}

func (prefixTokenizer) PromptTokens(req *openai.Request, _ string) ([]uint32, error) {
	var s string
	if err := json.Unmarshal(req.Prompt, &s); err != nil {
		return nil, err
	}
	var p, tail int
	if _, err := fmt.Sscanf(s, "p%d t%d", &p, &tail); err != nil {
		return nil, err
	}
	return prefixTokens(p, tail), nil
}

func prefixTokens(p, tail int) []uint32 {
	out := make([]uint32, 0, 72*16)
	for i := range 64 * 16 {
		out = append(out, uint32(1_000_000*(p+1)+i))
	}
	for i := range 8 * 16 {
		out = append(out, uint32(500_000_000+10_000*tail+i))
	}
	return out
}

func completion(p, tail int) fakeenvoy.Request {
	return fakeenvoy.Request{Headers: fakeenvoy.Headers{{Key: ":method", Value: "POST"},
		{Key: ":path", Value: "/v1/completions"}, {Key: "content-type", Value: "application/json"}},
		Body: [][]byte{fmt.Appendf(nil, `{"model":"m","prompt":"p%d t%d","max_tokens":8}`, p, tail)}}
}

// The placement policy holds a hit behind a miss in prefill on its endpoint, for up to
// its hold_max (here above limits.max_hold, as an operator may set it). Under Envoy's
// default 200 ms message_timeout (BUFFERED request body) and the default limits, none of
// those held requests times out.
func TestPlacementHoldsWithinEnvoyMessageTimeout(t *testing.T) {
	untilNoTimeout(t, placementHoldsWithinEnvoyMessageTimeout)
}

func placementHoldsWithinEnvoyMessageTimeout(t *testing.T) (int, string) {
	cfg := placement.DefaultConfig()
	cfg.HoldMax = 400 * time.Millisecond
	ix := testindex.New()
	// The policy's clock runs ahead by skew: once the miss is routed it jumps two hold
	// steps, so the hits find a miss routed earlier than one step before them (a hit
	// arriving within a step joins the miss instead of being held).
	var skew atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	pol, err := placement.New(cfg, ix, now, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	fleet := newFleet(epA).serve("m", epA)
	fleet.metrics = map[string]scoring.Metrics{epA: {Valid: true, NumGPUBlocks: 1000, BlockSize: 16}}
	h := newHarness(t, func(o *extproc.Options) {
		o.Policy, o.Tokenizer, o.Fleet, o.MaxHold = pol, prefixTokenizer{}, fleet, config.DefaultLimitsConfig().MaxHold
	})
	envoy := mode(filterv3.ProcessingMode_BUFFERED, false)
	envoy.MessageTimeout = 200 * time.Millisecond // Envoy's default

	// Prefix 0 finds its home and is cached there.
	x := h.start(envoy)
	if _, err := x.Request(completion(0, 0)); err != nil {
		t.Fatal(err)
	}
	if _, err := x.Response(200, nil, [][]byte{[]byte(`{}`)}, nil, nil); err != nil {
		t.Fatal(err)
	}
	x.Close()
	ix.Hold(epA, index.Keys(index.Root("m", "", ""), prefixTokens(0, 0), 16, nil)[:64])

	// A miss (prefix 1, 1,152 uncached tokens) is prefilling there: no first token yet.
	miss := h.start(envoy)
	defer miss.Cancel()
	if _, err := miss.Request(completion(1, 1)); err != nil {
		t.Fatal(err)
	}
	skew.Store(int64(2 * cfg.HoldStep))

	// Hits on prefix 0 arrive: placement holds each behind the miss.
	const hits = 6
	errs := make(chan error, hits)
	for i := range hits {
		go func() {
			x := h.start(envoy)
			defer x.Cancel()
			res, err := x.Request(completion(0, 2+i))
			if err == nil && res.Immediate != nil {
				err = fmt.Errorf("immediate response %v", res.Immediate)
			}
			errs <- err
		}()
	}
	timeouts := countTimeouts(t, errs, hits)
	if timeouts != 0 {
		return timeouts, fmt.Sprintf("%d of %d requests held by placement timed out under Envoy's default message_timeout", timeouts, hits)
	}
	if h.counter("kvrouter_routing_holds_total") == 0 {
		t.Fatal("placement held no request: the workload shows nothing")
	}
	return 0, ""
}
