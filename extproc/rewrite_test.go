package extproc_test

import (
	"bytes"
	"context"
	"os"
	"strconv"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvrouter/kvrouter/epp"
	"github.com/kvrouter/kvrouter/extproc"
	"github.com/kvrouter/kvrouter/internal/testmetrics"
	"github.com/kvrouter/kvrouter/openai"
	"github.com/kvrouter/kvrouter/rewrite"
	"github.com/kvrouter/kvrouter/testbench/fakeenvoy"
)

// testRewrites are the rules of the rewrite tests; the harness's fleet serves "m" (on
// A, B, C), "only-b" (B) and "lora-x" (C).
func testRewrites(t *testing.T, generic bool) *rewrite.Table {
	t.Helper()
	rws := []rewrite.Rewrite{
		{Name: "alias", Rules: []rewrite.Rule{
			{Matches: exactModels("m-alias"), Targets: []rewrite.Target{{ModelRewrite: "only-b"}}},
			{Matches: exactModels("m-to-ghost"), Targets: []rewrite.Target{{ModelRewrite: "ghost"}}},
			{Matches: exactModels("m"), Targets: []rewrite.Target{{ModelRewrite: "ghost"}}},
			{Matches: exactModels("canary"), Targets: []rewrite.Target{{ModelRewrite: "ghost", Weight: 50}, {ModelRewrite: "lora-x", Weight: 50}}},
		}},
		{Name: "fallback", Rules: []rewrite.Rule{{Targets: []rewrite.Target{{ModelRewrite: "only-b"}}}}},
	}
	if !generic {
		rws = rws[:1]
	}
	tab, err := rewrite.NewTable(rws)
	if err != nil {
		t.Fatal(err)
	}
	return tab
}

func exactModels(models ...string) []rewrite.Match {
	var ms []rewrite.Match
	for _, m := range models {
		ms = append(ms, rewrite.Match{Model: rewrite.ModelMatch{Value: m}})
	}
	return ms
}

// A rewrite is decided before scoring: the endpoint picked serves the target, the body
// the upstream gets names the target with a content-length that fits it, and the
// decision is counted with the picker's labels. A rewrite that no endpoint could serve
// is not applied when the fleet serves the request's own model.
func TestModelRewrite(t *testing.T) {
	fds := fakeenvoy.FullDuplex()
	buffered := mode(filterv3.ProcessingMode_BUFFERED, false)
	tests := []struct {
		name       string
		cfg        fakeenvoy.Config
		model      string // the body's
		noGeneric  bool   // without the generic rule, which matches every model
		header     string // x-gateway-model-name-rewrite
		byLoad     bool   // routed by the fallback policy: the fleet serves no target
		trailers   bool   // the request has trailers (they end the body)
		chunked    bool   // the request has no content-length
		wantModel  string // the model the upstream gets
		wantDest   string
		wantRule   string // the model_rewrite_name counted; "": none
		wantLabel  string // the GIE series' model_name
		wantKept   string // kvrouter_model_rewrites_kept_total's source; "": none
		wantTarget string // target_model_name
	}{
		{name: "alias", cfg: fds, model: "m-alias", wantModel: "only-b", wantDest: epB,
			wantRule: "alias", wantLabel: "m-alias", wantTarget: "only-b"},
		{name: "alias, buffered", cfg: buffered, model: "m-alias", wantModel: "only-b", wantDest: epB,
			wantRule: "alias", wantLabel: "m-alias", wantTarget: "only-b"},
		{name: "alias, trailers end the body", cfg: mode(filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, true), trailers: true,
			model: "m-alias", wantModel: "only-b", wantDest: epB, wantRule: "alias", wantLabel: "m-alias", wantTarget: "only-b"},
		{name: "alias, chunked: no content-length added", cfg: fds, chunked: true,
			model: "m-alias", wantModel: "only-b", wantDest: epB, wantRule: "alias", wantLabel: "m-alias", wantTarget: "only-b"},
		{name: "alias, buffered, chunked", cfg: buffered, chunked: true,
			model: "m-alias", wantModel: "only-b", wantDest: epB, wantRule: "alias", wantLabel: "m-alias", wantTarget: "only-b"},
		{name: "generic rule", cfg: fds, model: "made-up", wantModel: "only-b", wantDest: epB,
			wantRule: "fallback", wantLabel: "", wantTarget: "only-b"},
		{name: "a weighted target no endpoint serves is not chosen", cfg: fds, model: "canary", wantModel: "lora-x", wantDest: epC,
			wantRule: "alias", wantLabel: "canary", wantTarget: "lora-x"},
		{name: "target not served, model served: kept", cfg: fds, model: "m", wantModel: "m", wantDest: epA,
			wantLabel: "m", wantTarget: "m", wantKept: "rule"},
		{name: "neither served: rewritten as written", cfg: fds, model: "m-to-ghost", wantModel: "ghost", wantDest: epA, byLoad: true,
			wantRule: "alias", wantLabel: "m-to-ghost", wantTarget: "ghost"},
		{name: "header", cfg: fds, model: "lora-x", noGeneric: true, header: "only-b", wantModel: "only-b", wantDest: epB,
			wantLabel: "lora-x", wantTarget: "only-b"},
		{name: "header, buffered", cfg: buffered, model: "lora-x", noGeneric: true, header: "only-b", wantModel: "only-b", wantDest: epB,
			wantLabel: "lora-x", wantTarget: "only-b"},
		{name: "a rule wins over the header", cfg: fds, model: "m-alias", header: "lora-x", wantModel: "only-b", wantDest: epB,
			wantRule: "alias", wantLabel: "m-alias", wantTarget: "only-b"},
		{name: "header target not served: kept", cfg: fds, model: "only-b", noGeneric: true, header: "ghost", wantModel: "only-b", wantDest: epB,
			wantLabel: "only-b", wantTarget: "only-b", wantKept: "header"},
		{name: "a client's header naming an endpoint names no model: kept", cfg: fds, model: "only-b", noGeneric: true, header: epC,
			wantModel: "only-b", wantDest: epB, wantLabel: "only-b", wantTarget: "only-b", wantKept: "header"},
		{name: "no rule, no header", cfg: fds, model: "only-b", noGeneric: true, wantModel: "only-b", wantDest: epB,
			wantLabel: "only-b", wantTarget: "only-b"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(o *extproc.Options) {
				o.Rewrites = testRewrites(t, !tc.noGeneric)
				o.IntN = func(int) int { return 0 }
			})
			x := h.start(tc.cfg)
			defer x.Cancel()
			var hs fakeenvoy.Headers
			if tc.header != "" {
				hs = append(hs, fakeenvoy.Header{Key: epp.HeaderModelRewrite, Value: tc.header})
			}
			body := chatBody(tc.model)
			if !tc.chunked {
				hs = append(hs, fakeenvoy.Header{Key: "content-length", Value: strconv.Itoa(len(body))})
			}
			req := fakeenvoy.Request{Headers: postHeaders(hs...), Body: split(body, 3)}
			if tc.trailers {
				req.Trailers = fakeenvoy.Headers{{Key: "x-t", Value: "1"}}
			}
			res, err := x.Request(req)
			if err != nil {
				t.Fatal(err)
			}
			checkDecision(t, res, tc.wantDest)
			checkUpstreamModel(t, res.Body, tc.wantModel)
			if tc.wantModel == tc.model && !bytes.Equal(res.Body, body) {
				t.Errorf("body changed without a rewrite:\n%s", res.Body)
			}
			switch cl, ok := res.Headers.Get("content-length"); {
			case tc.chunked && ok:
				t.Errorf("content-length %s added to a request without one", cl)
			case !tc.chunked && cl != strconv.Itoa(len(res.Body)):
				t.Errorf("content-length %s, body %d bytes", cl, len(res.Body))
			}
			picks, _, _, _ := h.policy.snapshot()
			if !tc.byLoad && (len(picks) != 1 || picks[0].Model != tc.wantModel) {
				t.Errorf("policy asked for %+v, want model %q", picks, tc.wantModel)
			}
			rules := h.counter("inference_extension_model_rewrite_decisions_total")
			if tc.wantRule == "" && rules != 0 {
				t.Errorf("%v rewrite decisions counted, want none", rules)
			}
			if tc.wantRule != "" {
				if n := testmetrics.Value(t, h.reg, "inference_extension_model_rewrite_decisions_total",
					"model_rewrite_name", tc.wantRule, "model_name", tc.wantLabel, "target_model", tc.wantModel); n != 1 {
					t.Errorf("rewrite decision %s/%q->%s counted %v times, want 1", tc.wantRule, tc.wantLabel, tc.wantModel, n)
				}
			}
			if n := testmetrics.Value(t, h.reg, "inference_objective_request_total",
				"model_name", tc.wantLabel, "target_model_name", tc.wantTarget); n != 1 {
				t.Errorf("inference_objective_request_total{model_name=%q, target_model_name=%q} = %v, want 1", tc.wantLabel, tc.wantTarget, n)
			}
			kept := h.counter("kvrouter_model_rewrites_kept_total")
			switch {
			case tc.wantKept == "" && kept != 0:
				t.Errorf("%v rewrites kept, want none", kept)
			case tc.wantKept != "" && testmetrics.Value(t, h.reg, "kvrouter_model_rewrites_kept_total", "source", tc.wantKept) != 1:
				t.Errorf("kept rewrites: source %q not counted once", tc.wantKept)
			}
		})
	}
}

// The weighted choice draws from Options.IntN: with draws cycling through [0, total),
// the targets get their exact shares.
func TestModelRewriteWeights(t *testing.T) {
	tab, err := rewrite.NewTable([]rewrite.Rewrite{{Name: "split", Rules: []rewrite.Rule{{
		Matches: exactModels("m"),
		Targets: []rewrite.Target{{ModelRewrite: "only-b", Weight: 3}, {ModelRewrite: "lora-x", Weight: 1}}}}}})
	if err != nil {
		t.Fatal(err)
	}
	draw := 0
	h := newHarness(t, func(o *extproc.Options) {
		o.Rewrites = tab
		o.IntN = func(n int) int { draw++; return (draw - 1) % n }
	})
	got := map[string]int{}
	for range 8 {
		x := h.start(fakeenvoy.FullDuplex())
		res, err := x.Request(fakeenvoy.Request{Headers: postHeaders(), Body: [][]byte{chatBody("m")}})
		if err != nil {
			t.Fatal(err)
		}
		req, err := openai.Parse("/v1/chat/completions", res.Body)
		if err != nil {
			t.Fatal(err)
		}
		got[req.Model]++
		x.Cancel()
	}
	if got["only-b"] != 6 || got["lora-x"] != 2 || len(got) != 2 {
		t.Errorf("targets chosen %v, want only-b 6, lora-x 2", got)
	}
	f, err := os.Open("testdata/rewrite_metrics.golden")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := testutil.GatherAndCompare(h.reg, f, "inference_extension_model_rewrite_decisions_total"); err != nil {
		t.Fatal(err)
	}
}

// Without a parsed body there is nothing to rewrite: in STREAMED mode the decision is
// made at the headers, and the request is routed and passed on as it came.
func TestModelRewriteNeedsTheBody(t *testing.T) {
	h := newHarness(t, func(o *extproc.Options) { o.Rewrites = testRewrites(t, true) })
	x := h.start(mode(filterv3.ProcessingMode_STREAMED, false))
	defer x.Cancel()
	body := chatBody("m-alias")
	res, err := x.Request(fakeenvoy.Request{Headers: postHeaders(), Body: [][]byte{body}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Immediate != nil || !bytes.Equal(res.Body, body) {
		t.Fatalf("immediate %v, body %s", res.Immediate, res.Body)
	}
	if n := h.counter("inference_extension_model_rewrite_decisions_total"); n != 0 {
		t.Errorf("%v rewrite decisions counted without a body", n)
	}
}

// In BUFFERED_PARTIAL, a body message without end_of_stream may be only the start of the
// body (Envoy's buffer limit was reached; the rest goes upstream without the server
// seeing it). Even when that start parses, it is not rewritten: a new body with a
// content-length of its own would leave the unseen rest to be read upstream as another
// request. A body whose content-length says it is whole is rewritten.
func TestModelRewritePartialBody(t *testing.T) {
	for _, tc := range []struct {
		name        string
		declared    int // the content-length header; 0 for none
		eos         bool
		wantRewrite bool
	}{
		{name: "prefix of a longer body", declared: 4096, wantRewrite: false},
		{name: "chunked, no end of stream", wantRewrite: false},
		{name: "end of stream", declared: -1, eos: true, wantRewrite: true},
		{name: "content-length says whole", declared: -1, wantRewrite: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(o *extproc.Options) { o.Rewrites = testRewrites(t, false) })
			st, err := h.conn.Client.Process(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			body := chatBody("m-alias")
			hs := []*corev3.HeaderValue{{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")}}
			switch {
			case tc.declared > 0:
				hs = append(hs, &corev3.HeaderValue{Key: "content-length", RawValue: []byte(strconv.Itoa(tc.declared))})
			case tc.declared < 0:
				hs = append(hs, &corev3.HeaderValue{Key: "content-length", RawValue: []byte(strconv.Itoa(len(body)))})
			}
			if err := st.Send(&extprocv3.ProcessingRequest{
				ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_BUFFERED_PARTIAL},
				Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
					Headers: &corev3.HeaderMap{Headers: hs}}}}); err != nil {
				t.Fatal(err)
			}
			if _, err := st.Recv(); err != nil {
				t.Fatal(err)
			}
			if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
				RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: tc.eos}}}); err != nil {
				t.Fatal(err)
			}
			r, err := st.Recv()
			if err != nil {
				t.Fatal(err)
			}
			common := r.GetRequestBody().GetResponse()
			newBody := common.GetBodyMutation().GetBody()
			length := ""
			for _, h := range common.GetHeaderMutation().GetSetHeaders() {
				if h.GetHeader().GetKey() == "content-length" {
					length = string(h.GetHeader().GetRawValue())
				}
			}
			if !tc.wantRewrite {
				if newBody != nil || length != "" {
					t.Fatalf("a body that may be partial was rewritten: body %q, content-length %q", newBody, length)
				}
				return
			}
			req, err := openai.Parse("/v1/chat/completions", newBody)
			if err != nil || req.Model != "only-b" {
				t.Fatalf("rewritten body %q: %v", newBody, err)
			}
			if tc.declared != 0 && length != strconv.Itoa(len(newBody)) {
				t.Fatalf("content-length %q for %d bytes", length, len(newBody))
			}
		})
	}
}

// The response of a rewritten request names the model the client asked for, as the
// Inference Extension's picker writes it back, wherever the stream's chunks cut the
// name (FULL_DUPLEX_STREAMED); what the response's trailers end is flushed before
// them. A request whose model was not rewritten gets its response byte for byte.
func TestModelRewriteResponseNamesTheRequestedModel(t *testing.T) {
	const sse = `data: {"id":"c","model":"only-b","choices":[{"delta":{"content":"hi"}}]}` + "\n\n" +
		`data: {"id":"c", "model": "only-b", "choices":[]}` + "\n\n" + `data: [DONE]` + "\n\n"
	const want = `data: {"id":"c","model":"m-alias","choices":[{"delta":{"content":"hi"}}]}` + "\n\n" +
		`data: {"id":"c", "model": "m-alias", "choices":[]}` + "\n\n" + `data: [DONE]` + "\n\n"
	tests := []struct {
		name     string
		model    string // the request's
		cuts     []int  // where the response body is cut into chunks
		trailers bool   // trailers end the response body
		tail     string // appended to the response body and to want
		want     string
	}{
		{"one chunk", "m-alias", nil, false, "", want},
		{"cut inside both names", "m-alias", []int{18, 30, 90, 100}, false, "", want},
		{"cut at every byte of the first name", "m-alias", []int{12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27}, false, "", want},
		{"cut inside a name, trailers end it", "m-alias", []int{20}, true, "", want},
		{"a name last, trailers end it", "m-alias", []int{len(sse) - 3}, true, "", want},
		{"not rewritten", "only-b", []int{18, 30}, false, "", sse},
		// A body ending in what could begin a name: held, then flushed before the trailers.
		{"held at the end, trailers end it", "m-alias", nil, true, `"model":"only`, want},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(o *extproc.Options) { o.Rewrites = testRewrites(t, false) })
			cfg := fakeenvoy.FullDuplex()
			x := h.start(cfg)
			defer x.Cancel()
			if _, err := x.Request(fakeenvoy.Request{Headers: postHeaders(), Body: [][]byte{chatBody(tc.model)}}); err != nil {
				t.Fatal(err)
			}
			if _, err := x.ResponseHeaders(fakeenvoy.Headers{{Key: ":status", Value: "200"}}, false, nil); err != nil {
				t.Fatal(err)
			}
			body := sse + tc.tail
			var chunks []string
			prev := 0
			for _, c := range tc.cuts {
				chunks = append(chunks, body[prev:c])
				prev = c
			}
			chunks = append(chunks, body[prev:])
			var got []byte
			for i, c := range chunks {
				eos := i == len(chunks)-1 && !tc.trailers
				if err := x.ResponseBody([]byte(c), eos); err != nil {
					t.Fatal(err)
				}
				b, _, err := x.ReadResponseBody()
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, b...)
			}
			if tc.trailers {
				if err := x.ResponseTrailers(fakeenvoy.Headers{{Key: "x-t", Value: "1"}}); err != nil {
					t.Fatal(err)
				}
				for {
					b, eos, err := x.ReadResponseBody()
					if err != nil {
						t.Fatal(err)
					}
					got = append(got, b...)
					if eos {
						break
					}
				}
				if _, err := x.ReadResponseTrailers(); err != nil {
					t.Fatal(err)
				}
			}
			if string(got) != tc.want+tc.tail {
				t.Errorf("the client reads\n%s\nwant\n%s", got, tc.want+tc.tail)
			}
		})
	}
}

// checkUpstreamModel wants body, as the upstream receives it, to parse as a chat
// request naming model.
func checkUpstreamModel(t *testing.T, body []byte, model string) {
	t.Helper()
	got, err := openai.Parse("/v1/chat/completions", body)
	if err != nil {
		t.Fatalf("the upstream's body does not parse: %v", err)
	}
	if got.Model != model {
		t.Errorf("upstream model %q, want %q", got.Model, model)
	}
}
