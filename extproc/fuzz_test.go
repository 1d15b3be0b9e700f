package extproc_test

import (
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvrouter/kvrouter/extproc"
	"github.com/kvrouter/kvrouter/rewrite"
)

// FuzzProcess feeds the server arbitrary message sequences in arbitrary modes: it must
// never panic, must end every stream either cleanly or with FailedPrecondition, and must
// balance every Fleet.Begin with one End.
func FuzzProcess(f *testing.F) {
	f.Add([]byte{0x01, 0x00, 0x12, 0x05}, []byte(`{"model":"m","messages":[]}`))
	f.Add([]byte{0x02, 0x00, 0x02, 0x22, 0x03, 0x15}, []byte(`{"model":"only-b"`))
	f.Add([]byte{0x00, 0x08, 0x03}, []byte{})
	f.Add([]byte{0x03, 0x00, 0x02, 0x12, 0x04, 0x05, 0x15}, []byte("data: {\"usage\":{\"prompt_tokens\":1}}\n\n"))
	modes := []filterv3.ProcessingMode_BodySendMode{filterv3.ProcessingMode_NONE, filterv3.ProcessingMode_STREAMED,
		filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_BUFFERED_PARTIAL}
	// Rewrites on: "m" split between two served models, every other model to "m".
	rewrites, err := rewrite.NewTable([]rewrite.Rewrite{{Name: "r", Rules: []rewrite.Rule{
		{Matches: []rewrite.Match{{Model: rewrite.ModelMatch{Value: "m"}}},
			Targets: []rewrite.Target{{ModelRewrite: "only-b", Weight: 1}, {ModelRewrite: "m", Weight: 1}}},
		{Targets: []rewrite.Target{{ModelRewrite: "m"}}}}}})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, script []byte, payload []byte) {
		if len(script) == 0 || len(script) > 64 {
			return
		}
		fl := newFleet(epA, epB).serve("m", epA, epB).serve("only-b", epB)
		draw := 0
		srv := extproc.New(extproc.Options{Policy: &recordingPolicy{}, Fleet: fl, MaxBodyBytes: 64, Rewrites: rewrites,
			IntN: func(n int) int { draw++; return draw % n }})
		pc := &extprocv3.ProtocolConfiguration{RequestBodyMode: modes[int(script[0])%len(modes)],
			ResponseBodyMode: modes[int(script[0]>>4)%len(modes)]}
		var msgs []*extprocv3.ProcessingRequest
		for i, b := range script[1:] {
			eos := b&0x10 != 0
			chunk := payload
			if n := int(b >> 5); n < len(payload) {
				chunk = payload[:n*len(payload)/8]
			}
			hdrs := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":path", RawValue: []byte("/v1/chat/completions")},
				{Key: ":status", RawValue: []byte("200")}, {Key: "x-gateway-destination-endpoint", RawValue: payload},
				{Key: "x-gateway-model-name-rewrite", RawValue: payload}, {Key: "x-llm-d-model-name-rewrite", RawValue: chunk}}}
			var m *extprocv3.ProcessingRequest
			switch b & 0x0f % 7 {
			case 0:
				m = &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hdrs, EndOfStream: eos}}}
			case 1:
				m = &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: chunk, EndOfStream: eos}}}
			case 2:
				m = &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}}
			case 3:
				m = &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: hdrs, EndOfStream: eos}}}
			case 4:
				m = &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: chunk, EndOfStream: eos}}}
			case 5:
				m = &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{}}}
			default:
				m = &extprocv3.ProcessingRequest{}
			}
			if i == 0 {
				m.ProtocolConfig = pc
			}
			msgs = append(msgs, m)
		}
		st := &memStream{msgs: msgs}
		err := srv.Process(st)
		if err != nil && status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("Process: %v", err)
		}
		if b, e := fl.counts(); b != e || b > 1 {
			t.Fatalf("begins/ends %d/%d", b, e)
		}
		for a, n := range fl.inflight {
			if n != 0 {
				t.Fatalf("in-flight %s = %d", a, n)
			}
		}
	})
}
