package envoytest_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
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

// TestTrivial drives the trivial processor through the fake filter in
// FULL_DUPLEX_STREAMED with bodies in 0, 1, 2 and many chunks (one over MaxChunkBytes),
// with and without trailers, and through Compare next to itself.
func TestTrivial(t *testing.T) {
	const ep = "10.9.9.9:8000"
	conn, err := envoytest.Bufconn(envoytest.NewTrivial(ep).Register)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	big := bytes.Repeat([]byte("x"), 2*envoytest.MaxChunkBytes+5)
	for _, tc := range []struct {
		name     string
		body     [][]byte
		trailers envoytest.Headers
	}{
		{"no body", nil, nil},
		{"one chunk", [][]byte{[]byte("abc")}, nil},
		{"two chunks", [][]byte{[]byte("ab"), []byte("c")}, nil},
		{"many chunks, large", [][]byte{big[:10], big[10:70000], big[70000:]}, nil},
		{"trailers", [][]byte{[]byte("ab"), []byte("c")}, envoytest.Headers{{Key: "x-t", Value: "1"}}},
		{"trailers only", nil, envoytest.Headers{{Key: "x-t", Value: "1"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x, err := envoytest.Start(context.Background(), conn.Client, envoytest.FullDuplex())
			if err != nil {
				t.Fatal(err)
			}
			res, err := x.Request(envoytest.Request{Headers: envoytest.Headers{{Key: ":path", Value: "/"}},
				Body: tc.body, Trailers: tc.trailers})
			if err != nil {
				t.Fatal(err)
			}
			if got, _ := res.Headers.Get("x-gateway-destination-endpoint"); got != ep {
				t.Fatalf("destination %q", got)
			}
			if got := envoytest.MetadataString(res.DynamicMetadata, "envoy.lb", "x-gateway-destination-endpoint"); got != ep {
				t.Fatalf("metadata %q", got)
			}
			if want := bytes.Join(tc.body, nil); !bytes.Equal(res.Body, want) {
				t.Fatalf("body %d bytes, want %d", len(res.Body), len(want))
			}
			resp, err := x.Response(200, nil, [][]byte{[]byte("data: a\n\n"), []byte("data: [DONE]\n\n")}, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got, _ := resp.Headers.Get("x-gateway-destination-endpoint-served"); got != ep || string(resp.Body) != "data: a\n\ndata: [DONE]\n\n" {
				t.Fatalf("response %v %q", resp.Headers, resp.Body)
			}
			if err := x.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
	t.Run("compare", func(t *testing.T) {
		rs := envoytest.Compare(context.Background(), []extprocv3.ExternalProcessorClient{conn.Client, conn.Client},
			envoytest.LoadConfig{Rate: 2000, Requests: 20, Config: envoytest.FullDuplex(),
				Next: func(i int) envoytest.Request {
					return envoytest.Request{Headers: envoytest.Headers{{Key: ":path", Value: "/"}}, Body: [][]byte{[]byte(fmt.Sprint(i))}}
				}})
		for i, r := range rs {
			if r.Sent != 20 || r.Errors != 0 || r.Destinations[ep] != 20 || r.P50 <= 0 || len(r.Latencies) != 20 || slices.Contains(r.Latencies, 0) {
				t.Fatalf("client %d: %v %v", i, r, r.FirstError)
			}
		}
		if p50, p99, _, _ := rs[0].Added(rs[0]); p50 != 0 || p99 != 0 {
			t.Fatalf("a run adds %v/%v to itself", p50, p99)
		}
	})
}

// late is a processor that reads the request headers, then sends its replies only once
// release is closed (or never, when release is nil), and drains the stream.
type late struct {
	release chan struct{}
	replies []*extprocv3.ProcessingResponse
}

func (l *late) Process(st extprocv3.ExternalProcessor_ProcessServer) error {
	if _, err := st.Recv(); err != nil {
		return err
	}
	select {
	case <-l.release:
	case <-st.Context().Done():
		return st.Context().Err()
	}
	for _, r := range l.replies {
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

// A processor that does not answer within message_timeout fails the exchange, as Envoy
// fails the request with 504, in BUFFERED mode; in FULL_DUPLEX_STREAMED Envoy runs no
// message timer, so a late answer is still taken.
func TestMessageTimeout(t *testing.T) {
	const timeout = 20 * time.Millisecond
	body := []byte(`{"a":1}`)
	t.Run("buffered: no reply within the timeout", func(t *testing.T) {
		conn, err := envoytest.Bufconn(func(g *grpc.Server) {
			extprocv3.RegisterExternalProcessorServer(g, &late{})
		})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		cfg := envoytest.Config{RequestBodyMode: filterv3.ProcessingMode_BUFFERED, MessageTimeout: timeout}
		x, err := envoytest.Start(context.Background(), conn.Client, cfg)
		if err != nil {
			t.Fatal(err)
		}
		_, err = x.Request(envoytest.Request{Headers: envoytest.Headers{{Key: ":path", Value: "/"}}, Body: [][]byte{body}})
		var te *envoytest.TimeoutError
		if !errors.As(err, &te) || te.Message != "request_headers" || te.Timeout != timeout {
			t.Fatalf("got %v, want a *TimeoutError for request_headers after %v", err, timeout)
		}
		x.Cancel()
	})
	t.Run("full duplex: no timer", func(t *testing.T) {
		l := &late{release: make(chan struct{}), replies: []*extprocv3.ProcessingResponse{headersReply(nil), streamed(body, true)}}
		conn, err := envoytest.Bufconn(func(g *grpc.Server) { extprocv3.RegisterExternalProcessorServer(g, l) })
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		cfg := envoytest.FullDuplex()
		cfg.MessageTimeout = timeout
		x, err := envoytest.Start(context.Background(), conn.Client, cfg)
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			time.Sleep(5 * timeout) // well past the timeout: the answer is late
			close(l.release)
		}()
		res, err := x.Request(envoytest.Request{Headers: envoytest.Headers{{Key: ":path", Value: "/"}}, Body: [][]byte{body}})
		if err != nil {
			t.Fatalf("FULL_DUPLEX_STREAMED request failed: %v (Envoy arms no message timer in this mode)", err)
		}
		if !bytes.Equal(res.Body, body) {
			t.Fatalf("body %q, want %q", res.Body, body)
		}
		x.Cancel()
	})
}
