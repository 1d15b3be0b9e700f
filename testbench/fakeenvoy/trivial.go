package fakeenvoy

import (
	"errors"
	"io"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvrouter/kvrouter/epp"
)

// Trivial is the least an ext_proc endpoint picker can do in FULL_DUPLEX_STREAMED mode:
// it reassembles the request body, names one fixed endpoint (in the
// x-gateway-destination-endpoint header and the envoy.lb metadata, with
// clear_route_cache), echoes the body back in chunks of at most MaxChunkBytes, and passes
// the response through. It parses nothing and scores nothing. It is the baseline of a
// side-by-side latency comparison: the same message sequence and the same replies as a
// real router, so the difference is the router's own work. Safe for concurrent use.
type Trivial struct {
	decision *extprocv3.ProcessingResponse
	respHdrs *extprocv3.ProcessingResponse
	trailers map[bool]*extprocv3.ProcessingResponse
}

// NewTrivial returns a Trivial that routes every request to endpoint ("ip:port").
func NewTrivial(endpoint string) *Trivial {
	set := func(k, v string) *corev3.HeaderValueOption {
		return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, RawValue: []byte(v)},
			AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD}
	}
	md, _ := structpb.NewStruct(map[string]any{epp.NamespaceLB: map[string]any{epp.HeaderDestination: endpoint}})
	return &Trivial{
		decision: &extprocv3.ProcessingResponse{DynamicMetadata: md, Response: &extprocv3.ProcessingResponse_RequestHeaders{
			RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{ClearRouteCache: true,
				HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
					set(epp.HeaderDestination, endpoint)}}}}}},
		respHdrs: &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
			ResponseHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{
				HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
					set(epp.HeaderServed, endpoint)}}}}}},
		trailers: map[bool]*extprocv3.ProcessingResponse{
			true: {Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}},
			false: {Response: &extprocv3.ProcessingResponse_ResponseTrailers{
				ResponseTrailers: &extprocv3.TrailersResponse{}}},
		},
	}
}

// Register adds the ExternalProcessor service to g.
func (t *Trivial) Register(g *grpc.Server) { extprocv3.RegisterExternalProcessorServer(g, t) }

// Process serves one stream. Only FULL_DUPLEX_STREAMED request and response bodies are
// supported (any other body mode gets no correct replies).
func (t *Trivial) Process(st extprocv3.ExternalProcessor_ProcessServer) error {
	var body []byte
	decided := false
	decide := func() error {
		decided = true
		return st.Send(t.decision)
	}
	for {
		msg, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		switch r := msg.Request.(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			if r.RequestHeaders.GetEndOfStream() {
				err = decide()
			}
		case *extprocv3.ProcessingRequest_RequestBody:
			b := r.RequestBody
			if b.GetEndOfStream() && body == nil {
				body = b.GetBody()
			} else {
				body = append(body, b.GetBody()...)
			}
			if b.GetEndOfStream() {
				if err = decide(); err == nil {
					err = sendChunks(st, body, true, true)
				}
				body = nil
			}
		case *extprocv3.ProcessingRequest_RequestTrailers:
			if !decided {
				if err = decide(); err == nil && len(body) > 0 {
					err = sendChunks(st, body, false, true)
				}
				body = nil
			}
			if err == nil {
				err = st.Send(t.trailers[true])
			}
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			err = st.Send(t.respHdrs)
		case *extprocv3.ProcessingRequest_ResponseBody:
			err = sendChunks(st, r.ResponseBody.GetBody(), r.ResponseBody.GetEndOfStream(), false)
		case *extprocv3.ProcessingRequest_ResponseTrailers:
			err = st.Send(t.trailers[false])
		default:
			return status.Errorf(codes.FailedPrecondition, "fakeenvoy: unexpected %T", msg.Request)
		}
		if err != nil {
			return err
		}
	}
}

func sendChunks(st extprocv3.ExternalProcessor_ProcessServer, body []byte, eos, request bool) error {
	for {
		n := min(len(body), MaxChunkBytes)
		last := n == len(body)
		br := &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
			Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{
				Body: body[:n], EndOfStream: eos && last}}}}}
		r := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: br}}
		if request {
			r.Response = &extprocv3.ProcessingResponse_RequestBody{RequestBody: br}
		}
		if err := st.Send(r); err != nil {
			return err
		}
		if last {
			return nil
		}
		body = body[n:]
	}
}
