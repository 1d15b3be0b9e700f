package envoytest_test

import (
	"context"
	"errors"
	"io"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"

	"github.com/kvrouter/kvrouter/extproc/envoytest"
)

// scripted is a misbehaving processor: after reading `after` messages it sends its
// replies, then drains the stream.
type scripted struct {
	after   int
	replies []*extprocv3.ProcessingResponse
}

func (s *scripted) Process(st extprocv3.ExternalProcessor_ProcessServer) error {
	for range s.after {
		if _, err := st.Recv(); err != nil {
			return err
		}
	}
	for _, r := range s.replies {
		if err := st.Send(r); err != nil {
			return err
		}
	}
	for {
		if _, err := st.Recv(); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

func headersReply(m *extprocv3.HeaderMutation) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
		RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{HeaderMutation: m}}}}
}

func streamed(body []byte, eos bool) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
		Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
			StreamedResponse: &extprocv3.StreamedBodyResponse{Body: body, EndOfStream: eos}}}}}}}
}

func set(key, val string, action corev3.HeaderValueOption_HeaderAppendAction) *extprocv3.HeaderMutation {
	return &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{
		Header: &corev3.HeaderValue{Key: key, RawValue: []byte(val)}, AppendAction: action}}}
}

func TestFullDuplexStrictness(t *testing.T) {
	body := []byte(`{"a":1}`)
	emptyBody := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
		RequestBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{}}}}
	tests := []struct {
		name     string
		trailers bool
		replies  []*extprocv3.ProcessingResponse
		wantErr  bool
		wantHdr  []string
	}{
		{"correct", false, []*extprocv3.ProcessingResponse{headersReply(nil), streamed(body, true)}, false, nil},
		{"body before headers", false, []*extprocv3.ProcessingResponse{streamed(body, true), headersReply(nil)}, true, nil},
		{"empty body reply", false, []*extprocv3.ProcessingResponse{headersReply(nil), emptyBody}, true, nil},
		{"chunk too large", false, []*extprocv3.ProcessingResponse{headersReply(nil), streamed(make([]byte, 62001), true)}, true, nil},
		{"eos although trailers follow", true, []*extprocv3.ProcessingResponse{headersReply(nil), streamed(body, true),
			{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}}}, true, nil},
		{"protected header", false, []*extprocv3.ProcessingResponse{headersReply(set(":authority", "evil",
			corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD)), streamed(body, true)}, true, nil},
		{"append adds a second value", false, []*extprocv3.ProcessingResponse{headersReply(set("x-a", "2",
			corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD)), streamed(body, true)}, false, []string{"1", "2"}},
		{"overwrite keeps one value", false, []*extprocv3.ProcessingResponse{headersReply(set("x-a", "2",
			corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD)), streamed(body, true)}, false, []string{"2"}},
		{"add-if-absent keeps the client's", false, []*extprocv3.ProcessingResponse{headersReply(set("x-a", "2",
			corev3.HeaderValueOption_ADD_IF_ABSENT)), streamed(body, true)}, false, []string{"1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			after := 2
			if tc.trailers {
				after = 3
			}
			conn, err := envoytest.Bufconn(func(g *grpc.Server) {
				extprocv3.RegisterExternalProcessorServer(g, &scripted{after: after, replies: tc.replies})
			})
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			x, err := envoytest.Start(context.Background(), conn.Client, envoytest.FullDuplex())
			if err != nil {
				t.Fatal(err)
			}
			defer x.Cancel()
			req := envoytest.Request{Headers: envoytest.Headers{{Key: ":path", Value: "/"}, {Key: "x-a", Value: "1"}},
				Body: [][]byte{body}}
			if tc.trailers {
				req.Trailers = envoytest.Headers{}
			}
			res, err := x.Request(req)
			var oe *envoytest.OrderError
			if tc.wantErr {
				if !errors.As(err, &oe) {
					t.Fatalf("err = %v, want *OrderError", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(res.Body) != string(body) {
				t.Fatalf("body %q", res.Body)
			}
			if tc.wantHdr != nil {
				got := res.Headers.Values("x-a")
				if len(got) != len(tc.wantHdr) || got[0] != tc.wantHdr[0] {
					t.Fatalf("x-a = %v, want %v", got, tc.wantHdr)
				}
			}
		})
	}
}
