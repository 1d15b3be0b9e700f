package extproc_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvrouter/kvrouter/epp"
	"github.com/kvrouter/kvrouter/extproc"
	"github.com/kvrouter/kvrouter/scoring"
	"github.com/kvrouter/kvrouter/testbench/fakeenvoy"
)

// rawStream opens an ext_proc stream driven message by message (FULL_DUPLEX_STREAMED),
// for states fakeenvoy.Exchange does not stop in: a body half sent, nothing sent.
func rawStream(t *testing.T, h *harness) extprocv3.ExternalProcessor_ProcessClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	st, err := h.conn.Client.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func sendHeaders(t *testing.T, st extprocv3.ExternalProcessor_ProcessClient, extra ...[2]string) {
	t.Helper()
	var hm corev3.HeaderMap
	for _, kv := range append([][2]string{{":method", "POST"}, {":path", "/v1/chat/completions"}, {"content-type", "application/json"}}, extra...) {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: kv[0], RawValue: []byte(kv[1])})
	}
	err := st.Send(&extprocv3.ProcessingRequest{
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
			ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED},
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: &hm}}})
	if err != nil {
		t.Fatal(err)
	}
}

func sendBody(t *testing.T, st extprocv3.ExternalProcessor_ProcessClient, b []byte, eos bool) {
	t.Helper()
	err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos}}})
	if err != nil {
		t.Fatal(err)
	}
}

// waitFor waits until cond holds (a wait for a condition, not a timing assertion).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestBodyBudget checks that bodies held for parsing by all streams stay within the
// budget, each charged ParseCost times its bytes: a body that would pass it is routed by load, streamed through whole, and
// counted; once the holder's decision is made the budget is free again.
func TestBodyBudget(t *testing.T) {
	body := chatBody("only-b") // parsed: only B serves the model; by load: A
	h := newHarness(t, func(o *extproc.Options) { o.BodyBudgetBytes = extproc.ParseCost*int64(len(body)) + 100 })

	holder := rawStream(t, h)
	sendHeaders(t, holder)
	sendBody(t, holder, body[:len(body)-10], false)
	waitFor(t, "the first body to be held", func() bool {
		return h.counter("kvrouter_extproc_body_bytes_held") == extproc.ParseCost*float64(len(body)-10)
	})

	x := h.start(fakeenvoy.FullDuplex())
	res, err := x.Request(fakeenvoy.Request{Headers: postHeaders(), Body: split(body, 3)})
	if err != nil {
		t.Fatal(err)
	}
	checkDecision(t, res, epA)
	if string(res.Body) != string(body) {
		t.Fatalf("body over budget differs: %d vs %d bytes", len(res.Body), len(body))
	}
	if got := h.counter("kvrouter_request_parse_errors_total", "reason", extproc.ReasonBodyBudget); got != 1 {
		t.Fatalf("body_budget parse errors = %v, want 1", got)
	}
	_ = x.Close()

	// The holder's body completes: it is parsed (routed to B) and the budget is released.
	sendBody(t, holder, body[len(body)-10:], true)
	r, err := holder.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if got := headerOf(r, epp.HeaderDestination); got != epB {
		t.Fatalf("holder routed to %q, want %q", got, epB)
	}
	waitFor(t, "the budget to be released", func() bool { return h.counter("kvrouter_extproc_body_bytes_held") == 0 })
	x = h.start(fakeenvoy.FullDuplex())
	if res, err = x.Request(fakeenvoy.Request{Headers: postHeaders(), Body: split(body, 2)}); err != nil {
		t.Fatal(err)
	}
	checkDecision(t, res, epB)
	_ = x.Close()
	_ = holder.CloseSend()
}

func headerOf(r *extprocv3.ProcessingResponse, key string) string {
	for _, o := range r.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if strings.EqualFold(o.GetHeader().GetKey(), key) {
			return string(o.GetHeader().GetRawValue()) + o.GetHeader().GetValue()
		}
	}
	return ""
}

// TestMaxStreams checks that the stream past MaxStreams is refused with
// RESOURCE_EXHAUSTED and counted, and that a slot freed is usable again.
func TestMaxStreams(t *testing.T) {
	h := newHarness(t, func(o *extproc.Options) { o.MaxStreams = 1 })
	open := rawStream(t, h)
	sendHeaders(t, open)
	waitFor(t, "the first stream", func() bool { return h.srv.Active() == 1 })

	x := h.start(fakeenvoy.FullDuplex())
	_, err := x.Request(fakeenvoy.Request{Headers: postHeaders(), Body: [][]byte{chatBody("m")}})
	if c := status.Code(unwrapAll(err)); c != codes.ResourceExhausted {
		t.Fatalf("second stream: %v (code %v), want ResourceExhausted", err, c)
	}
	x.Cancel()
	if got := h.counter("kvrouter_extproc_streams_refused_total", "reason", "max_streams"); got != 1 {
		t.Fatalf("refused max_streams = %v", got)
	}
	_ = open.CloseSend()
	h.waitIdle()
	x = h.start(fakeenvoy.FullDuplex())
	if _, err := x.Request(fakeenvoy.Request{Headers: postHeaders(), Body: [][]byte{chatBody("m")}}); err != nil {
		t.Fatalf("stream after a slot was freed: %v", err)
	}
	_ = x.Close()
}

func unwrapAll(err error) error {
	for {
		u, ok := err.(interface{ Unwrap() error })
		if !ok || u.Unwrap() == nil {
			return err
		}
		err = u.Unwrap()
	}
}

// TestIdleStream checks that a stream that sends nothing is ended by the idle timeout,
// and by Drain at once, so that neither holds a slot or the drain.
func TestIdleStream(t *testing.T) {
	t.Run("idle timeout", func(t *testing.T) {
		h := newHarness(t, func(o *extproc.Options) { o.StreamIdleTimeout = 20 * time.Millisecond })
		st := rawStream(t, h)
		_, err := st.Recv()
		if s, _ := status.FromError(err); s.Code() != codes.DeadlineExceeded || !strings.Contains(s.Message(), "idle timeout") {
			t.Fatalf("idle stream ended with %v, want the server's idle timeout", err)
		}
		h.waitIdle()
		if got := h.counter("kvrouter_extproc_stream_errors_total", "reason", "idle"); got != 1 {
			t.Fatalf("idle stream errors = %v", got)
		}
	})
	t.Run("drain", func(t *testing.T) {
		h := newHarness(t, func(o *extproc.Options) { o.StreamIdleTimeout = time.Hour })
		st := rawStream(t, h)
		waitFor(t, "the stream to open", func() bool { return h.srv.Active() == 1 })
		h.srv.Drain()
		_, err := st.Recv()
		if s, _ := status.FromError(err); s.Code() != codes.Unavailable || !strings.Contains(s.Message(), "draining") {
			t.Fatalf("idle stream at drain ended with %v, want the server's draining status", err)
		}
		h.waitIdle()
	})
	t.Run("a stream that sends is not idle", func(t *testing.T) {
		h := newHarness(t, func(o *extproc.Options) { o.StreamIdleTimeout = time.Hour })
		x := h.start(fakeenvoy.FullDuplex())
		res, err := x.Request(fakeenvoy.Request{Headers: postHeaders(), Body: [][]byte{chatBody("only-b")}})
		if err != nil {
			t.Fatal(err)
		}
		checkDecision(t, res, epB)
		_ = x.Close()
	})
}

// TestPromptTokenLimit checks that the tokenizer is asked for no more tokens than the
// largest KV cache among the candidates holds (num_gpu_blocks x block_size), and for
// Options.MaxPromptTokens while no capacity is scraped.
func TestPromptTokenLimit(t *testing.T) {
	tests := []struct {
		name    string
		metrics map[string]scoring.Metrics
		want    int
	}{
		{"no capacity scraped", nil, 1000},
		{"largest cache among the candidates", map[string]scoring.Metrics{
			epA: {Valid: true, NumGPUBlocks: 4, BlockSize: 16},
			epB: {Valid: true, NumGPUBlocks: 8, BlockSize: 16},
			epC: {Valid: false, NumGPUBlocks: 1 << 20, BlockSize: 16}, // stale: not used
		}, 128},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tok := &appendingTokenizer{}
			h := newHarness(t, func(o *extproc.Options) { o.Tokenizer = tok; o.MaxPromptTokens = 1000 })
			h.fleet.metrics = tc.metrics
			x := h.start(fakeenvoy.FullDuplex())
			if _, err := x.Request(fakeenvoy.Request{Headers: postHeaders(), Body: [][]byte{chatBody("m")}}); err != nil {
				t.Fatal(err)
			}
			_ = x.Close()
			picks, _, _, _ := h.policy.snapshot()
			if len(tok.maxTokens) != 1 || tok.maxTokens[0] != tc.want {
				t.Fatalf("tokenizer limits %v, want [%d]", tok.maxTokens, tc.want)
			}
			if n := len(picks[0].TokenIDs); n > tc.want {
				t.Fatalf("policy saw %d token ids, want at most %d", n, tc.want)
			}
		})
	}
}

// TestBodyBudgetDeclaredLength checks that a content-length header reserves the whole
// body at its first chunk, so that a body that cannot fit is routed by load before any
// more of it is held.
func TestBodyBudgetDeclaredLength(t *testing.T) {
	body := chatBody("only-b")
	h := newHarness(t, func(o *extproc.Options) { o.BodyBudgetBytes = extproc.ParseCost*int64(len(body)) + 100 })
	holder := rawStream(t, h)
	sendHeaders(t, holder, [2]string{"content-length", strconv.Itoa(len(body))})
	sendBody(t, holder, body[:10], false)
	waitFor(t, "the declared length to be held", func() bool {
		return h.counter("kvrouter_extproc_body_bytes_held") == extproc.ParseCost*float64(len(body))
	})
	// A second body's first chunk already does not fit.
	x := h.start(fakeenvoy.FullDuplex())
	res, err := x.Request(fakeenvoy.Request{Headers: postHeaders(fakeenvoy.Header{Key: "content-length", Value: strconv.Itoa(len(body))}),
		Body: split(body, 4)})
	if err != nil {
		t.Fatal(err)
	}
	checkDecision(t, res, epA)
	if got := h.counter("kvrouter_request_parse_errors_total", "reason", extproc.ReasonBodyBudget); got != 1 {
		t.Fatalf("body_budget parse errors = %v, want 1", got)
	}
	_ = x.Close()
	sendBody(t, holder, body[10:], true)
	r, err := holder.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if got := headerOf(r, epp.HeaderDestination); got != epB {
		t.Fatalf("holder routed to %q, want %q", got, epB)
	}
	_ = holder.CloseSend()
}

// TestBodyBudgetRewriteCopy checks that the copy of a body whose model is rewritten is
// charged in the body budget (RewriteCost x its bytes) beside the body's parse: when it
// would pass the budget the request is routed by load as the client sent it and
// counted, when it fits the request is rewritten, and either way the whole charge is
// returned once the body is passed on.
func TestBodyBudgetRewriteCopy(t *testing.T) {
	body := chatBody("m-alias")                           // the rule rewrites it to only-b, which B serves; by load: A
	copyLen := len(body) - len("m-alias") + len("only-b") // the rewritten body's bytes
	parse := extproc.ParseCost * int64(len(body))
	modes := map[string]fakeenvoy.Config{
		"full duplex":           fakeenvoy.FullDuplex(),
		"full duplex, trailers": mode(filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, true),
		"buffered":              mode(filterv3.ProcessingMode_BUFFERED, false),
	}
	for name, cfg := range modes {
		for _, tc := range []struct {
			name      string
			budget    int64
			rewritten bool
		}{
			{"the copy does not fit", parse + extproc.RewriteCost*int64(copyLen) - 1, false},
			{"the copy fits", parse + extproc.RewriteCost*int64(copyLen), true},
		} {
			t.Run(name+"/"+tc.name, func(t *testing.T) {
				h := newHarness(t, func(o *extproc.Options) {
					o.BodyBudgetBytes = tc.budget
					o.Rewrites = testRewrites(t, false)
				})
				x := h.start(cfg)
				defer x.Cancel()
				req := fakeenvoy.Request{Headers: postHeaders(fakeenvoy.Header{Key: "content-length", Value: strconv.Itoa(len(body))}),
					Body: split(body, 3)}
				if cfg.SendRequestTrailers {
					req.Trailers = fakeenvoy.Headers{{Key: "x-t", Value: "1"}}
				}
				res, err := x.Request(req)
				if err != nil {
					t.Fatal(err)
				}
				budgetErrs := h.counter("kvrouter_request_parse_errors_total", "reason", extproc.ReasonBodyBudget)
				if tc.rewritten {
					checkDecision(t, res, epB)
					if want := strings.Replace(string(body), "m-alias", "only-b", 1); string(res.Body) != want {
						t.Fatalf("upstream body %s, want %s", res.Body, want)
					}
					if budgetErrs != 0 {
						t.Fatalf("body_budget parse errors = %v, want 0", budgetErrs)
					}
				} else {
					checkDecision(t, res, epA)
					if string(res.Body) != string(body) {
						t.Fatalf("upstream body %s, want the client's %s", res.Body, body)
					}
					if budgetErrs != 1 {
						t.Fatalf("body_budget parse errors = %v, want 1", budgetErrs)
					}
				}
				_ = x.Close()
				waitFor(t, "the budget to be returned", func() bool { return h.counter("kvrouter_extproc_body_bytes_held") == 0 })
			})
		}
	}
}

// TestBodyBudgetRewriteCopyOn503 checks that the reserved copy of a rewritten body is
// returned when the request is answered 503 instead (the subset hint names only an
// endpoint that does not serve the rewrite's target), in every body mode that rewrites.
func TestBodyBudgetRewriteCopyOn503(t *testing.T) {
	body := chatBody("m-alias") // rewritten to only-b, which only B serves
	modes := map[string]fakeenvoy.Config{
		"full duplex":           fakeenvoy.FullDuplex(),
		"full duplex, trailers": mode(filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, true),
		"buffered":              mode(filterv3.ProcessingMode_BUFFERED, false),
	}
	for name, cfg := range modes {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, func(o *extproc.Options) {
				o.BodyBudgetBytes = 1 << 20
				o.Rewrites = testRewrites(t, false)
			})
			x := h.start(cfg)
			defer x.Cancel()
			req := fakeenvoy.Request{Headers: postHeaders(fakeenvoy.Header{Key: "content-length", Value: strconv.Itoa(len(body))}),
				Body: split(body, 3), Metadata: fakeenvoy.SubsetHint(epA)}
			if cfg.SendRequestTrailers {
				req.Trailers = fakeenvoy.Headers{{Key: "x-t", Value: "1"}}
			}
			res, err := x.Request(req)
			if err != nil {
				t.Fatal(err)
			}
			if res.Immediate == nil || res.Immediate.GetStatus().GetCode() != 503 {
				t.Fatalf("reply %+v, want a 503 (no endpoint of the subset serves only-b)", res)
			}
			_ = x.Close()
			waitFor(t, "the budget to be returned", func() bool { return h.counter("kvrouter_extproc_body_bytes_held") == 0 })
		})
	}
}
