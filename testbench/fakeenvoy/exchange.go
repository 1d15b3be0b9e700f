package fakeenvoy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvrouter/kvrouter/epp"
)

// MaxChunkBytes is the largest streamed_response chunk the fake accepts: the protocol's
// one copy, epp.MaxChunkBytes.
const MaxChunkBytes = epp.MaxChunkBytes

// Config is the ext_proc filter configuration the fake Envoy applies.
type Config struct {
	// RequestBodyMode and ResponseBodyMode are the processing_mode body modes. The zero
	// value is NONE.
	RequestBodyMode  filterv3.ProcessingMode_BodySendMode
	ResponseBodyMode filterv3.ProcessingMode_BodySendMode
	// SendRequestTrailers and SendResponseTrailers are the trailer modes (SEND when true);
	// FULL_DUPLEX_STREAMED forces SEND, as Envoy requires it.
	SendRequestTrailers  bool
	SendResponseTrailers bool
	// SkipResponseHeaders is response_header_mode SKIP.
	SkipResponseHeaders bool
	// SendProtocolConfig puts protocol_config in the first message, as Envoy 1.33+ does.
	SendProtocolConfig bool
	// MessageTimeout is the filter's message_timeout. When > 0, a message that needs a
	// reply and gets none within it fails the exchange with a *TimeoutError and resets
	// the stream, as Envoy does (a 504 to the client, or the request going on unprocessed
	// with failure_mode_allow). As in Envoy, no timer runs in a direction whose body mode
	// is FULL_DUPLEX_STREAMED. Zero runs no timer (Envoy's own default is 200 ms).
	MessageTimeout time.Duration
}

// FullDuplex is the configuration kvrouter's envoy.yaml uses: FULL_DUPLEX_STREAMED both
// ways, trailers and response headers sent, protocol_config sent.
func FullDuplex() Config {
	return Config{
		RequestBodyMode:    filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		ResponseBodyMode:   filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		SendProtocolConfig: true,
	}
}

func (c Config) reqTrailers() bool {
	return c.SendRequestTrailers || c.RequestBodyMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
}

func (c Config) respTrailers() bool {
	return c.SendResponseTrailers || c.ResponseBodyMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
}

// OrderError is a reply Envoy would reject (it fails the request with 500).
type OrderError struct{ Msg string }

// Error describes the rejected reply.
func (e *OrderError) Error() string { return "fakeenvoy: envoy would reject: " + e.Msg }

func orderErrorf(format string, a ...any) error { return &OrderError{Msg: fmt.Sprintf(format, a...)} }

// TimeoutError is a reply that did not come within Config.MessageTimeout: Envoy resets
// the stream and answers 504 (or lets the request go on unprocessed with
// failure_mode_allow).
type TimeoutError struct {
	Message string        // the message left without a reply, e.g. "request_body"
	Timeout time.Duration // the message_timeout that passed
}

// Error describes the timeout.
func (e *TimeoutError) Error() string {
	return fmt.Sprintf("fakeenvoy: envoy would answer 504: no reply to %s within message_timeout %v", e.Message, e.Timeout)
}

// Request is one HTTP request as it reaches the filter.
type Request struct {
	// Headers include the pseudo-headers :method and :path.
	Headers Headers
	// Body holds the body in the chunks Envoy receives it in; empty means no body (the
	// headers end the stream unless there are trailers).
	Body [][]byte
	// Trailers, when non-nil, follow the body.
	Trailers Headers
	// Metadata is sent as metadata_context with the request headers (the subset hint).
	Metadata *corev3.Metadata
}

// RequestResult is the request as Envoy would send it upstream, or the immediate response.
type RequestResult struct {
	// Immediate is set when the processor answered the client directly; the other fields
	// are then zero.
	Immediate       *extprocv3.ImmediateResponse
	Headers         Headers
	Body            []byte
	Trailers        Headers
	ClearRouteCache bool
	// DynamicMetadata merges the dynamic_metadata of every reply so far.
	DynamicMetadata *structpb.Struct
}

// Exchange is one HTTP request and its response through the fake filter.
type Exchange struct {
	cfg    Config
	stream grpc.BidiStreamingClient[extprocv3.ProcessingRequest, extprocv3.ProcessingResponse]
	cancel context.CancelFunc

	replies  chan *extprocv3.ProcessingResponse
	recvDone chan struct{}
	recvErr  error

	first bool

	mu        sync.Mutex
	log       []string
	dynMeta   *structpb.Struct
	respTrail Headers // response trailers sent, guarded by mu
	lastSent  time.Time
	decided   time.Time

	sent        chan sentItem // response items sent, for ReadResponseBody (non-FDS modes)
	stashed     bool          // ReadResponseBody saw the end of the body and trailers follow
	stashReply  *extprocv3.ProcessingResponse
	stashAt     time.Time // when the stashed trailers were sent
	stashTrails Headers
	respBuf     []byte // BUFFERED response body being collected
}

type sentItem struct {
	chunk    []byte
	eos      bool
	trailers Headers
	isTrail  bool
	at       time.Time // when the message was sent to the processor (zero: none was)
}

// Start opens the ext_proc stream for one HTTP request.
func Start(ctx context.Context, c extprocv3.ExternalProcessorClient, cfg Config) (*Exchange, error) {
	ctx, cancel := context.WithCancel(ctx)
	st, err := c.Process(ctx)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("fakeenvoy: open stream: %w", err)
	}
	x := &Exchange{
		cfg: cfg, stream: st, cancel: cancel,
		replies:  make(chan *extprocv3.ProcessingResponse, 16),
		recvDone: make(chan struct{}),
		sent:     make(chan sentItem, 64),
	}
	go x.receive()
	return x, nil
}

func (x *Exchange) receive() {
	defer close(x.recvDone)
	defer close(x.replies)
	for {
		r, err := x.stream.Recv()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				x.recvErr = err
			}
			return
		}
		x.replies <- r
	}
}

// Replies lists the kinds of the replies received so far, in order, for instance
// "request_headers", "request_body/streamed", "request_body/streamed+eos",
// "request_trailers", "response_headers", "immediate_response".
func (x *Exchange) Replies() []string {
	x.mu.Lock()
	defer x.mu.Unlock()
	return append([]string(nil), x.log...)
}

// DecisionLatency is, in FULL_DUPLEX_STREAMED, the time from sending the last request
// message to receiving the reply that carries the decision: the wait the router adds to a
// request as Envoy sees it. It is 0 before Request returns, or when the reply came first
// (a body over the router's limit is routed before it ends).
func (x *Exchange) DecisionLatency() time.Duration {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.lastSent.IsZero() || x.decided.Before(x.lastSent) {
		return 0
	}
	return x.decided.Sub(x.lastSent)
}

// DynamicMetadata returns the merged dynamic_metadata of every reply so far.
func (x *Exchange) DynamicMetadata() *structpb.Struct {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.dynMeta
}

func replyKind(r *extprocv3.ProcessingResponse) string {
	body := func(b *extprocv3.BodyResponse) string {
		if s := b.GetResponse().GetBodyMutation().GetStreamedResponse(); s != nil {
			if s.GetEndOfStream() {
				return "/streamed+eos"
			}
			return "/streamed"
		}
		return ""
	}
	switch v := r.Response.(type) {
	case *extprocv3.ProcessingResponse_RequestHeaders:
		return "request_headers"
	case *extprocv3.ProcessingResponse_RequestBody:
		return "request_body" + body(v.RequestBody)
	case *extprocv3.ProcessingResponse_RequestTrailers:
		return "request_trailers"
	case *extprocv3.ProcessingResponse_ResponseHeaders:
		return "response_headers"
	case *extprocv3.ProcessingResponse_ResponseBody:
		return "response_body" + body(v.ResponseBody)
	case *extprocv3.ProcessingResponse_ResponseTrailers:
		return "response_trailers"
	case *extprocv3.ProcessingResponse_ImmediateResponse:
		return "immediate_response"
	}
	return fmt.Sprintf("unknown(%T)", r.Response)
}

// next returns the next reply. An ImmediateResponse is returned as a reply; a closed
// stream is an error.
func (x *Exchange) next() (*extprocv3.ProcessingResponse, error) {
	return x.nextBy(time.Time{}, "")
}

// timed reports whether Envoy runs the message timer in the direction whose body mode
// is m: always, but in FULL_DUPLEX_STREAMED (processor_state.cc skips the timer there).
func (x *Exchange) timed(m filterv3.ProcessingMode_BodySendMode) bool {
	return x.cfg.MessageTimeout > 0 && m != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
}

// nextBy is next for a reply to msg, sent at sent, that Envoy times: it fails with a
// *TimeoutError and resets the stream once MessageTimeout has passed since sent. A
// zero sent waits without a timer.
func (x *Exchange) nextBy(sent time.Time, msg string) (*extprocv3.ProcessingResponse, error) {
	var r *extprocv3.ProcessingResponse
	var ok bool
	if sent.IsZero() {
		r, ok = <-x.replies
	} else {
		t := time.NewTimer(time.Until(sent.Add(x.cfg.MessageTimeout)))
		defer t.Stop()
		select {
		case r, ok = <-x.replies:
		case <-t.C:
			x.cancel() // Envoy closes the stream on a message timeout
			return nil, &TimeoutError{Message: msg, Timeout: x.cfg.MessageTimeout}
		}
	}
	if !ok {
		<-x.recvDone
		if x.recvErr != nil {
			return nil, fmt.Errorf("fakeenvoy: stream failed: %w", x.recvErr)
		}
		return nil, orderErrorf("processor closed the stream while a reply was due")
	}
	x.mu.Lock()
	x.log = append(x.log, replyKind(r))
	if md := r.GetDynamicMetadata(); md != nil {
		if x.dynMeta == nil {
			x.dynMeta = &structpb.Struct{Fields: map[string]*structpb.Value{}}
		}
		for k, v := range md.GetFields() {
			x.dynMeta.Fields[k] = v
		}
	}
	x.mu.Unlock()
	return r, nil
}

func (x *Exchange) send(r *extprocv3.ProcessingRequest) error {
	if !x.first {
		x.first = true
		if x.cfg.SendProtocolConfig {
			r.ProtocolConfig = &extprocv3.ProtocolConfiguration{
				RequestBodyMode: x.cfg.RequestBodyMode, ResponseBodyMode: x.cfg.ResponseBodyMode}
		}
	}
	if err := x.stream.Send(r); err != nil {
		return fmt.Errorf("fakeenvoy: send: %w", err)
	}
	return nil
}

func reqHeaders(h Headers, eos bool, md *corev3.Metadata) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{MetadataContext: md, Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: h.toProto(), EndOfStream: eos}}}
}

func reqBody(b []byte, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos}}}
}

func reqTrailers(h Headers) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{
		RequestTrailers: &extprocv3.HttpTrailers{Trailers: h.toProto()}}}
}

func (x *Exchange) immediate(r *extprocv3.ProcessingResponse) *RequestResult {
	return &RequestResult{Immediate: r.GetImmediateResponse(), DynamicMetadata: x.DynamicMetadata()}
}

// applyCommon applies a CommonResponse to the request being built.
func applyCommon(res *RequestResult, c *extprocv3.CommonResponse, headersAllowed bool) error {
	if c.GetHeaderMutation() != nil {
		if !headersAllowed {
			return orderErrorf("header mutation in a body reply outside BUFFERED mode (Envoy ignores it)")
		}
		h, err := res.Headers.apply(c.GetHeaderMutation())
		if err != nil {
			return err
		}
		res.Headers = h
	}
	if c.GetClearRouteCache() {
		res.ClearRouteCache = true
	}
	return nil
}

// roundTrip sends m and returns kvrouter's reply to it, as Envoy does for each message
// outside FULL_DUPLEX_STREAMED, within MessageTimeout when the direction is timed.
func (x *Exchange) roundTrip(m *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error) {
	mode := x.cfg.RequestBodyMode
	if m.GetResponseHeaders() != nil {
		mode = x.cfg.ResponseBodyMode
	}
	sent := time.Now()
	if err := x.send(m); err != nil {
		return nil, err
	}
	if !x.timed(mode) {
		return x.next()
	}
	return x.nextBy(sent, messageKind(m))
}

func messageKind(m *extprocv3.ProcessingRequest) string {
	switch m.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return "request_headers"
	case *extprocv3.ProcessingRequest_RequestBody:
		return "request_body"
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return "request_trailers"
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return "response_headers"
	case *extprocv3.ProcessingRequest_ResponseBody:
		return "response_body"
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		return "response_trailers"
	}
	return fmt.Sprintf("unknown(%T)", m.Request)
}

// applyRequestHeadersReply applies r, the reply to the request headers, to res. A
// non-nil result is an immediate response, which ends the request.
func (x *Exchange) applyRequestHeadersReply(r *extprocv3.ProcessingResponse, res *RequestResult) (*RequestResult, error) {
	if r.GetImmediateResponse() != nil {
		return x.immediate(r), nil
	}
	if r.GetRequestHeaders() == nil {
		return nil, orderErrorf("first reply is %s, want request_headers", replyKind(r))
	}
	return nil, applyCommon(res, r.GetRequestHeaders().GetResponse(), true)
}

// requestBodyRoundTrip sends one request body message outside FULL_DUPLEX_STREAMED and
// applies the common part of the reply to res (header mutations only where
// headersAllowed, as in BUFFERED mode). It returns the reply's body mutation, or an
// immediate response, which ends the request.
func (x *Exchange) requestBodyRoundTrip(chunk []byte, eos, headersAllowed bool, res *RequestResult) (*extprocv3.BodyMutation, *RequestResult, error) {
	r, err := x.roundTrip(reqBody(chunk, eos))
	if err != nil {
		return nil, nil, err
	}
	if r.GetImmediateResponse() != nil {
		return nil, x.immediate(r), nil
	}
	b := r.GetRequestBody()
	if b == nil {
		return nil, nil, orderErrorf("got %s, want request_body", replyKind(r))
	}
	mut := b.GetResponse().GetBodyMutation()
	if mut.GetStreamedResponse() != nil {
		return nil, nil, orderErrorf("streamed_response outside FULL_DUPLEX_STREAMED")
	}
	if err := applyCommon(res, b.GetResponse(), headersAllowed); err != nil {
		return nil, nil, err
	}
	return mut, nil, nil
}

// Request sends the request through the filter as Envoy does in the configured mode and
// returns what Envoy would send upstream.
func (x *Exchange) Request(req Request) (*RequestResult, error) {
	res := &RequestResult{Headers: req.Headers.Clone(), Trailers: req.Trailers.Clone()}
	hasBody := len(req.Body) > 0
	hasTrailers := req.Trailers != nil
	switch x.cfg.RequestBodyMode {
	case filterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
		return x.requestFDS(req, res, hasBody, hasTrailers)
	case filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_BUFFERED_PARTIAL:
		return x.requestBuffered(req, res, hasBody, hasTrailers)
	default:
		return x.requestStreamed(req, res, hasBody, hasTrailers)
	}
}

func (x *Exchange) requestFDS(req Request, res *RequestResult, hasBody, hasTrailers bool) (*RequestResult, error) {
	sendErr := make(chan error, 1)
	go func() {
		err := x.send(reqHeaders(req.Headers, !hasBody && !hasTrailers, req.Metadata))
		for i, c := range req.Body {
			if err != nil {
				break
			}
			err = x.send(reqBody(c, i == len(req.Body)-1 && !hasTrailers))
		}
		if err == nil && hasTrailers {
			err = x.send(reqTrailers(req.Trailers))
		}
		x.mu.Lock()
		x.lastSent = time.Now()
		x.mu.Unlock()
		sendErr <- err
	}()
	finish := func(res *RequestResult, err error) (*RequestResult, error) {
		serr := <-sendErr
		if err != nil {
			return nil, err
		}
		if res.Immediate == nil && serr != nil {
			return nil, serr
		}
		return res, nil
	}

	r, err := x.next()
	if err != nil {
		return finish(nil, err)
	}
	x.mu.Lock()
	x.decided = time.Now()
	x.mu.Unlock()
	if imm, err := x.applyRequestHeadersReply(r, res); imm != nil || err != nil {
		return finish(imm, err)
	}
	if hasBody || hasTrailers {
		res.Body = []byte{}
		bodyDone := !hasBody
		for !bodyDone || hasTrailers {
			r, err := x.next()
			if err != nil {
				return finish(nil, err)
			}
			if r.GetImmediateResponse() != nil {
				return finish(x.immediate(r), nil)
			}
			if t := r.GetRequestTrailers(); t != nil {
				if !hasTrailers {
					return finish(nil, orderErrorf("request_trailers reply without trailers"))
				}
				h, err := res.Trailers.apply(t.GetHeaderMutation())
				if err != nil {
					return finish(nil, err)
				}
				res.Trailers = h
				break
			}
			b := r.GetRequestBody()
			if b == nil {
				return finish(nil, orderErrorf("got %s while the request body was due", replyKind(r)))
			}
			if bodyDone {
				return finish(nil, orderErrorf("request body reply after end_of_stream"))
			}
			s := b.GetResponse().GetBodyMutation().GetStreamedResponse()
			if s == nil {
				return finish(nil, orderErrorf("request body reply without streamed_response in FULL_DUPLEX_STREAMED"))
			}
			if err := applyCommon(res, b.GetResponse(), false); err != nil {
				return finish(nil, err)
			}
			if len(s.GetBody()) > MaxChunkBytes {
				return finish(nil, orderErrorf("streamed chunk of %d bytes", len(s.GetBody())))
			}
			res.Body = append(res.Body, s.GetBody()...)
			if s.GetEndOfStream() {
				if hasTrailers {
					return finish(nil, orderErrorf("end_of_stream on the request body although trailers follow"))
				}
				bodyDone = true
			}
		}
	}
	res.DynamicMetadata = x.DynamicMetadata()
	return finish(res, nil)
}

func (x *Exchange) requestBuffered(req Request, res *RequestResult, hasBody, hasTrailers bool) (*RequestResult, error) {
	r, err := x.roundTrip(reqHeaders(req.Headers, !hasBody && !hasTrailers, req.Metadata))
	if err != nil {
		return nil, err
	}
	if imm, err := x.applyRequestHeadersReply(r, res); imm != nil || err != nil {
		return imm, err
	}
	var body []byte
	for _, c := range req.Body {
		body = append(body, c...)
	}
	res.Body = body
	if hasBody {
		// Envoy sends the buffered body once it is complete; an empty body sends no message.
		mut, imm, err := x.requestBodyRoundTrip(body, !hasTrailers, true, res)
		if imm != nil || err != nil {
			return imm, err
		}
		switch m := mut.GetMutation().(type) {
		case *extprocv3.BodyMutation_Body:
			res.Body = m.Body
		case *extprocv3.BodyMutation_ClearBody:
			res.Body = nil
		}
	}
	if hasTrailers && x.cfg.reqTrailers() {
		if err := x.sendTrailersAndApply(req.Trailers, res); err != nil {
			return nil, err
		}
	}
	res.DynamicMetadata = x.DynamicMetadata()
	return res, nil
}

func (x *Exchange) sendTrailersAndApply(t Headers, res *RequestResult) error {
	r, err := x.roundTrip(reqTrailers(t))
	if err != nil {
		return err
	}
	if r.GetRequestTrailers() == nil {
		return orderErrorf("got %s, want request_trailers", replyKind(r))
	}
	h, err := res.Trailers.apply(r.GetRequestTrailers().GetHeaderMutation())
	res.Trailers = h
	return err
}

func (x *Exchange) requestStreamed(req Request, res *RequestResult, hasBody, hasTrailers bool) (*RequestResult, error) {
	streamed := x.cfg.RequestBodyMode == filterv3.ProcessingMode_STREAMED
	trailersToProc := hasTrailers && x.cfg.reqTrailers()
	eosOnHeaders := !hasBody && !hasTrailers
	r, err := x.roundTrip(reqHeaders(req.Headers, eosOnHeaders, req.Metadata))
	if err != nil {
		return nil, err
	}
	if imm, err := x.applyRequestHeadersReply(r, res); imm != nil || err != nil {
		return imm, err
	}
	res.Body = nil
	for i, c := range req.Body {
		if !streamed {
			res.Body = append(res.Body, c...)
			continue
		}
		mut, imm, err := x.requestBodyRoundTrip(c, i == len(req.Body)-1 && !hasTrailers, false, res)
		if imm != nil || err != nil {
			return imm, err
		}
		if m, ok := mut.GetMutation().(*extprocv3.BodyMutation_Body); ok {
			c = m.Body
		}
		res.Body = append(res.Body, c...)
	}
	if trailersToProc {
		if err := x.sendTrailersAndApply(req.Trailers, res); err != nil {
			return nil, err
		}
	}
	res.DynamicMetadata = x.DynamicMetadata()
	return res, nil
}

// ResponseHeaders sends the upstream response headers (":status" included) with
// metadata_context md and returns them as Envoy would pass them to the client. eos marks
// a response without body.
func (x *Exchange) ResponseHeaders(h Headers, eos bool, md *corev3.Metadata) (Headers, error) {
	if x.cfg.SkipResponseHeaders {
		return h, nil
	}
	r, err := x.roundTrip(&extprocv3.ProcessingRequest{MetadataContext: md, Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{Headers: h.toProto(), EndOfStream: eos}}})
	if err != nil {
		return nil, err
	}
	if r.GetResponseHeaders() == nil {
		return nil, orderErrorf("got %s, want response_headers", replyKind(r))
	}
	return h.Clone().apply(r.GetResponseHeaders().GetResponse().GetHeaderMutation())
}

// ResponseBody sends one upstream response body chunk; read what reaches the client with
// ReadResponseBody (possibly from another goroutine).
func (x *Exchange) ResponseBody(chunk []byte, eos bool) error {
	at := time.Now()
	switch x.cfg.ResponseBodyMode {
	case filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_STREAMED:
		if err := x.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
			ResponseBody: &extprocv3.HttpBody{Body: chunk, EndOfStream: eos}}}); err != nil {
			return err
		}
	case filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_BUFFERED_PARTIAL:
		x.respBuf = append(x.respBuf, chunk...)
		if !eos {
			return nil
		}
		chunk, x.respBuf = x.respBuf, nil
		if err := x.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
			ResponseBody: &extprocv3.HttpBody{Body: chunk, EndOfStream: true}}}); err != nil {
			return err
		}
	}
	if x.cfg.ResponseBodyMode != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		x.sent <- sentItem{chunk: chunk, eos: eos, at: at}
	}
	return nil
}

// ResponseTrailers sends the upstream response trailers, ending the response.
func (x *Exchange) ResponseTrailers(t Headers) error {
	x.mu.Lock()
	x.respTrail = t.Clone()
	x.mu.Unlock()
	if x.cfg.respTrailers() {
		if bufferedMode(x.cfg.ResponseBodyMode) && len(x.respBuf) > 0 {
			chunk := x.respBuf
			x.respBuf = nil
			if err := x.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
				ResponseBody: &extprocv3.HttpBody{Body: chunk}}}); err != nil {
				return err
			}
			x.sent <- sentItem{chunk: chunk}
		}
		at := time.Now()
		if err := x.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{
			ResponseTrailers: &extprocv3.HttpTrailers{Trailers: t.toProto()}}}); err != nil {
			return err
		}
		if x.cfg.ResponseBodyMode != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
			x.sent <- sentItem{isTrail: true, trailers: t, at: at}
		}
		return nil
	}
	if x.cfg.ResponseBodyMode != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		x.sent <- sentItem{isTrail: true, trailers: t}
	}
	return nil
}

func bufferedMode(m filterv3.ProcessingMode_BodySendMode) bool {
	return m == filterv3.ProcessingMode_BUFFERED || m == filterv3.ProcessingMode_BUFFERED_PARTIAL
}

// nextResponse is next for the reply to a response body or trailers message sent at
// at, timed outside FULL_DUPLEX_STREAMED.
func (x *Exchange) nextResponse(at time.Time, msg string) (*extprocv3.ProcessingResponse, error) {
	if !x.timed(x.cfg.ResponseBodyMode) {
		return x.next()
	}
	return x.nextBy(at, msg)
}

// ReadResponseBody returns the next response body bytes that reach the client. eos is
// true once the body is over (trailers, if any, are then read with ReadResponseTrailers).
func (x *Exchange) ReadResponseBody() (chunk []byte, eos bool, err error) {
	if x.cfg.ResponseBodyMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		r, err := x.next()
		if err != nil {
			return nil, false, err
		}
		if r.GetResponseTrailers() != nil {
			x.stashed, x.stashReply = true, r
			return nil, true, nil
		}
		b := r.GetResponseBody()
		if b == nil {
			return nil, false, orderErrorf("got %s, want response_body", replyKind(r))
		}
		s := b.GetResponse().GetBodyMutation().GetStreamedResponse()
		if s == nil {
			return nil, false, orderErrorf("response body reply without streamed_response in FULL_DUPLEX_STREAMED")
		}
		if b.GetResponse().GetHeaderMutation() != nil {
			return nil, false, orderErrorf("header mutation in a response body reply outside BUFFERED mode")
		}
		if len(s.GetBody()) > MaxChunkBytes {
			return nil, false, orderErrorf("streamed chunk of %d bytes", len(s.GetBody()))
		}
		return s.GetBody(), s.GetEndOfStream(), nil
	}
	it := <-x.sent
	if it.isTrail {
		x.stashed, x.stashTrails, x.stashAt = true, it.trailers, it.at
		return nil, true, nil
	}
	if x.cfg.ResponseBodyMode == filterv3.ProcessingMode_NONE {
		return it.chunk, it.eos, nil
	}
	r, err := x.nextResponse(it.at, "response_body")
	if err != nil {
		return nil, false, err
	}
	b := r.GetResponseBody()
	if b == nil {
		return nil, false, orderErrorf("got %s, want response_body", replyKind(r))
	}
	if b.GetResponse().GetBodyMutation().GetStreamedResponse() != nil {
		return nil, false, orderErrorf("streamed_response outside FULL_DUPLEX_STREAMED")
	}
	switch m := b.GetResponse().GetBodyMutation().GetMutation().(type) {
	case *extprocv3.BodyMutation_Body:
		it.chunk = m.Body
	case *extprocv3.BodyMutation_ClearBody:
		it.chunk = nil
	}
	return it.chunk, it.eos, nil
}

// ReadResponseTrailers returns the response trailers as they reach the client, once
// ReadResponseBody reported the end of a body that trailers follow.
func (x *Exchange) ReadResponseTrailers() (Headers, error) {
	if !x.stashed {
		return nil, errors.New("fakeenvoy: no response trailers pending")
	}
	x.stashed = false
	if x.cfg.ResponseBodyMode != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		t := x.stashTrails
		if !x.cfg.respTrailers() {
			return t, nil
		}
		r, err := x.nextResponse(x.stashAt, "response_trailers")
		if err != nil {
			return nil, err
		}
		x.stashReply = r
	}
	r := x.stashReply
	tr := r.GetResponseTrailers()
	if tr == nil {
		return nil, orderErrorf("got %s, want response_trailers", replyKind(r))
	}
	x.mu.Lock()
	t := x.respTrail.Clone()
	x.mu.Unlock()
	return t.apply(tr.GetHeaderMutation())
}

// Close ends the stream as Envoy does once the response is complete (half-close), then
// waits for the processor to end it. A reply arriving after the exchange is an
// *OrderError; a processor failure is returned as is.
func (x *Exchange) Close() error {
	defer x.cancel()
	if err := x.stream.CloseSend(); err != nil {
		return fmt.Errorf("fakeenvoy: close: %w", err)
	}
	var extra []string
	for r := range x.replies {
		extra = append(extra, replyKind(r))
	}
	<-x.recvDone
	if len(extra) > 0 {
		return orderErrorf("replies after the exchange ended: %v", extra)
	}
	return x.recvErr
}

// Cancel aborts the stream, as when the client disconnects mid-request, and waits for
// the receive side to stop.
func (x *Exchange) Cancel() {
	x.cancel()
	for range x.replies {
	}
	<-x.recvDone
}

// ResponseResult is the response as it reaches the client.
type ResponseResult struct {
	Headers  Headers
	Body     []byte
	Trailers Headers
}

// Response sends a whole upstream response (status, headers, body in chunks, optional
// trailers) and collects what reaches the client. md is sent with the response headers.
func (x *Exchange) Response(status int, h Headers, chunks [][]byte, trailers Headers, md *corev3.Metadata) (*ResponseResult, error) {
	h = append(Headers{{":status", fmt.Sprint(status)}}, h...)
	eosHeaders := len(chunks) == 0 && trailers == nil
	out, err := x.ResponseHeaders(h, eosHeaders, md)
	if err != nil {
		return nil, err
	}
	res := &ResponseResult{Headers: out}
	if eosHeaders {
		return res, nil
	}
	sendErr := make(chan error, 1)
	go func() {
		var err error
		for i, c := range chunks {
			if err = x.ResponseBody(c, i == len(chunks)-1 && trailers == nil); err != nil {
				break
			}
		}
		if err == nil && len(chunks) == 0 && trailers == nil {
			err = x.ResponseBody(nil, true)
		}
		if err == nil && trailers != nil {
			err = x.ResponseTrailers(trailers)
		}
		sendErr <- err
	}()
	res.Body = []byte{}
	for {
		c, eos, err := x.ReadResponseBody()
		if err != nil {
			<-sendErr
			return nil, err
		}
		res.Body = append(res.Body, c...)
		if eos {
			break
		}
	}
	if trailers != nil {
		t, err := x.ReadResponseTrailers()
		if err != nil {
			<-sendErr
			return nil, err
		}
		res.Trailers = t
	}
	if err := <-sendErr; err != nil {
		return nil, err
	}
	return res, nil
}

// MetadataString returns dynamic_metadata[ns][key] as a string.
func MetadataString(md *structpb.Struct, ns, key string) string {
	return md.GetFields()[ns].GetStructValue().GetFields()[key].GetStringValue()
}

// SubsetHint builds the metadata_context Envoy sends with a subset hint.
func SubsetHint(addrs ...string) *corev3.Metadata {
	vals := make([]any, len(addrs))
	for i, a := range addrs {
		vals[i] = a
	}
	s, _ := structpb.NewStruct(map[string]any{epp.KeySubset: vals})
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{epp.NamespaceSubsetHint: s}}
}

// ServedMetadata builds the response-path metadata_context naming the endpoint that
// served (envoy.lb / x-gateway-destination-endpoint-served); "" gives nil.
func ServedMetadata(addr string) *corev3.Metadata {
	if addr == "" {
		return nil
	}
	s, _ := structpb.NewStruct(map[string]any{epp.HeaderServed: addr})
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{epp.NamespaceLB: s}}
}
