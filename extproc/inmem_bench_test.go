package extproc_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/metadata"

	"github.com/kvrouter/kvrouter/epp"
	"github.com/kvrouter/kvrouter/extproc"
	"github.com/kvrouter/kvrouter/internal/cputime"
	"github.com/kvrouter/kvrouter/rewrite"
	"github.com/kvrouter/kvrouter/scoring"
	"github.com/kvrouter/kvrouter/testbench/fakeenvoy"
)

// memStream is an in-memory ExternalProcessor_ProcessServer: it hands Process a fixed
// message sequence and counts the replies, so the server's own cost is measured without
// gRPC.
type memStream struct {
	msgs    []*extprocv3.ProcessingRequest
	i       int
	replies int
}

func (m *memStream) Recv() (*extprocv3.ProcessingRequest, error) {
	if m.i == len(m.msgs) {
		return nil, io.EOF
	}
	m.i++
	return m.msgs[m.i-1], nil
}
func (m *memStream) Send(*extprocv3.ProcessingResponse) error { m.replies++; return nil }
func (m *memStream) SetHeader(metadata.MD) error              { return nil }
func (m *memStream) SendHeader(metadata.MD) error             { return nil }
func (m *memStream) SetTrailer(metadata.MD)                   {}
func (m *memStream) Context() context.Context                 { return context.Background() }
func (m *memStream) SendMsg(any) error                        { return nil }
func (m *memStream) RecvMsg(any) error                        { return nil }

// BenchmarkServerExchange is the server's work for one FULL_DUPLEX_STREAMED exchange
// (2,400-token chat body, least-load over the real endpoint registry) without any
// transport: the router's own overhead.
func BenchmarkServerExchange(b *testing.B) {
	benchExchange(b, extproc.Options{}, postHeaders())
}

// BenchmarkServerExchangeSheddable is BenchmarkServerExchange for a request naming a
// sheddable InferenceObjective with shedding on (limits.shed_queue_depth's default) and
// the pool not saturated: what the priority lookup and the saturation check add.
func BenchmarkServerExchangeSheddable(b *testing.B) {
	benchExchange(b, extproc.Options{ShedWaiting: extproc.DefaultShedWaiting, Objectives: testObjectives},
		postHeaders(fakeenvoy.Header{Key: epp.HeaderObjective, Value: "batch"}))
}

// BenchmarkServerExchangeRewrite is BenchmarkServerExchange for a request whose model an
// InferenceModelRewrite rule aliases to the served one: what the rule lookup, the check
// that the fleet serves the target, the body's copy with the new model and the reply
// that carries it add.
func BenchmarkServerExchangeRewrite(b *testing.B) {
	tab, err := rewrite.NewTable([]rewrite.Rewrite{{Name: "alias", Rules: []rewrite.Rule{{
		Matches: []rewrite.Match{{Model: rewrite.ModelMatch{Value: "alias"}}},
		Targets: []rewrite.Target{{ModelRewrite: "model"}}}}}})
	if err != nil {
		b.Fatal(err)
	}
	body := bytes.Replace(chat2400(), []byte(`"model":"model"`), []byte(`"model":"alias"`), 1)
	benchExchangeBody(b, extproc.Options{Rewrites: tab}, postHeaders(), body)
}

// benchExchange runs one exchange of hs and a 2,400-token chat body per iteration
// against a least-load server over n endpoints, with o's other options.
func benchExchange(b *testing.B, o extproc.Options, hs fakeenvoy.Headers) {
	benchExchangeBody(b, o, hs, chat2400())
}

// benchExchangeBody is benchExchange with the request body given.
func benchExchangeBody(b *testing.B, o extproc.Options, hs fakeenvoy.Headers, body []byte) {
	hdrs := &corev3.HeaderMap{}
	for _, h := range hs {
		hdrs.Headers = append(hdrs.Headers, &corev3.HeaderValue{Key: h.Key, RawValue: []byte(h.Value)})
	}
	msgs := []*extprocv3.ProcessingRequest{
		{ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
			ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED},
			Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hdrs}}},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}},
		{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte("200")}}}, EndOfStream: true}}},
	}
	for _, n := range []int{6, 64, 512} {
		b.Run(fmt.Sprintf("endpoints=%d", n), func(b *testing.B) {
			o.Policy, o.Fleet = scoring.NewLeastLoad(), newRegistryFleet(b, "model", n)
			srv := extproc.New(o)
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			cpu := cputime.Process()
			for b.Loop() {
				st := &memStream{msgs: msgs}
				if err := srv.Process(st); err != nil || st.replies != 3 {
					b.Fatal(err, st.replies)
				}
			}
			b.ReportMetric(float64(cputime.Process()-cpu)/float64(b.N)/1e3, "cpu-us/op")
		})
	}
}
