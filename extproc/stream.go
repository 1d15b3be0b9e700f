package extproc

import (
	"cmp"
	"fmt"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/kvrouter/kvrouter/epp"
	"github.com/kvrouter/kvrouter/openai"
	"github.com/kvrouter/kvrouter/scoring"
)

// phase is where a stream stands; each Envoy message is accepted only in some phases.
type phase int

const (
	// phaseStart expects request headers.
	phaseStart phase = iota
	// phaseRequestBody expects request body chunks or request trailers.
	phaseRequestBody
	// phaseRequestTrailers expects request trailers only (BUFFERED body already answered
	// with end_of_stream unset).
	phaseRequestTrailers
	// phaseResponse expects the response: headers, body chunks, trailers.
	phaseResponse
	// phaseDone accepts nothing more; the stream waits for Envoy to close it.
	phaseDone
)

func (p phase) String() string {
	return [...]string{"start", "request_body", "request_trailers", "response", "done"}[p]
}

// protocolError is a message Envoy would never send in the stream's phase.
type protocolError struct{ msg string }

func (e *protocolError) Error() string { return "extproc: " + e.msg }

func protocolErrorf(format string, a ...any) error {
	return &protocolError{msg: fmt.Sprintf(format, a...)}
}

// stream is the per-stream protocol state. It lives on the stream's goroutine only.
type stream struct {
	s                 *Server
	srv               extprocv3.ExternalProcessor_ProcessServer
	reqMode, respMode filterv3.ProcessingMode_BodySendMode
	phase             phase
	first             bool // the first message was seen

	// request
	path      string
	spoofed   []string // client-sent x-gateway-destination-* header names
	subset    []string
	hasSubset bool
	objective string // the objective header (llm-d-router's name, else the Inference Extension's): its first non-empty value of at most maxObjectiveName bytes
	rewriteTo string // the model rewrite header (llm-d-router's name, else the Inference Extension's): its first non-empty value of at most maxModelName bytes
	// respModel names the request's own model again in a rewritten request's response
	// (FULL_DUPLEX_STREAMED); nil when the model was not rewritten.
	respModel *responseModel
	body      []byte
	bodyBuf   *[]byte   // the pooled buffer body was reassembled into, if any; returned once body is passed on
	declared  int       // the content-length header, when it is at most maxBody (else 0)
	hasLength bool      // the request has a content-length header (a rewritten body's replaces it)
	held      int       // bytes of body reserved for parsing in the server's body budget
	copyHeld  int       // bytes of a rewritten body's copy reserved in the server's body budget
	through   bool      // FDS: decided already; body chunks pass straight through
	start     time.Time // when the request headers came (inference_objective_request_duration_seconds)
	model     string    // the model_name of the Inference Extension series: the request's model when the fleet serves it or a rewrite rule names it, else ""
	target    string    // their target_model_name: the model routed for and forwarded, bounded as model is
	reqBytes  int       // the body bytes read when the decision was made (inference_objective_request_sizes)
	gie       *gieModel // the series of (st.model, st.target), once routed

	// decision
	routed    bool
	endpoint  string           // the chosen endpoint; the listed fallback that served it, once known
	dest      string           // the endpoints listed to the proxy: the chosen one, then any fallbacks
	observer  scoring.Observer // told of this request's progress: the one in force when it was routed
	reqID     string
	tentative *choice // BUFFERED: named in the headers reply, committed if no body comes

	// response
	respHeaders bool
	respDone    bool // the response ended; only request-side messages may still come
	firstToken  bool
	released    bool
	usage       openai.UsageReader
	respBytes   int // the response body's bytes so far (inference_objective_response_sizes)
}

// handle processes one message; done means the stream is over (an immediate response
// was sent) and Process should return.
func (st *stream) handle(msg *extprocv3.ProcessingRequest) (done bool, err error) {
	if !st.first {
		st.first = true
		if pc := msg.GetProtocolConfig(); pc != nil {
			st.reqMode, st.respMode = pc.GetRequestBodyMode(), pc.GetResponseBodyMode()
		}
	}
	switch r := msg.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return st.onRequestHeaders(msg, r.RequestHeaders)
	case *extprocv3.ProcessingRequest_RequestBody:
		return st.onRequestBody(r.RequestBody)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return st.onRequestTrailers()
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return false, st.onResponseHeaders(msg, r.ResponseHeaders)
	case *extprocv3.ProcessingRequest_ResponseBody:
		return false, st.onResponseBody(r.ResponseBody)
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		return false, st.onResponseTrailers()
	default:
		return false, protocolErrorf("unexpected message %T in phase %s", msg.Request, st.phase)
	}
}

func (st *stream) onRequestHeaders(msg *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) (bool, error) {
	if st.phase != phaseStart {
		return false, protocolErrorf("request_headers in phase %s", st.phase)
	}
	st.start = st.s.now()
	// Each of the two headers llm-d-router renamed is read under both names; its name
	// there (the second of each pair) wins over the Inference Extension's.
	var objective, rewriteTo [2]string
	for _, hv := range h.GetHeaders().GetHeaders() {
		key := strings.ToLower(hv.GetKey())
		switch {
		case key == ":path":
			st.path = headerValue(hv)
		case key == "content-length":
			st.hasLength = true
			if n, err := strconv.Atoi(headerValue(hv)); err == nil && n > 0 && n <= st.s.maxBody {
				st.declared = n
			}
		case key == epp.HeaderObjective:
			firstValue(&objective[0], hv, maxObjectiveName)
		case key == epp.HeaderObjectiveLLMD:
			firstValue(&objective[1], hv, maxObjectiveName)
		case key == epp.HeaderModelRewrite:
			firstValue(&rewriteTo[0], hv, maxModelName)
		case key == epp.HeaderModelRewriteLLMD:
			firstValue(&rewriteTo[1], hv, maxModelName)
		case strings.HasPrefix(key, epp.HeaderPrefix):
			st.spoofed = append(st.spoofed, key)
		}
	}
	st.objective = cmp.Or(objective[1], objective[0])
	st.rewriteTo = cmp.Or(rewriteTo[1], rewriteTo[0])
	st.subset, st.hasSubset = subsetHint(msg.GetMetadataContext())
	st.phase = phaseRequestBody

	if h.GetEndOfStream() { // no body: GET /v1/models and the like
		st.phase = phaseResponse
		return st.decideAndReply(decideInput{fallback: fallbackNoBody}, replyHeaders)
	}
	switch st.reqMode {
	case filterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
		if openai.KindOf(st.path) == openai.KindUnknown {
			// Nothing to parse: decide now and let the body stream through.
			st.through = true
			return st.decideAndReply(decideInput{parseErr: openai.ReasonUnsupportedPath}, replyHeaders)
		}
		return false, nil // wait for the body
	case filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_BUFFERED_PARTIAL:
		// The decision goes in the body reply. Envoy sends no body message when the body is
		// empty (only trailers, or nothing at all with trailer mode SKIP), so this reply
		// already names a load-based endpoint; the body reply overrides it, and it is
		// committed only if no body comes.
		c, reason, err := st.choose(decideInput{fallback: fallbackNoBody}, st.s.now())
		if err != nil {
			return true, err
		}
		if reason != "" {
			return true, st.reply503(reason)
		}
		st.tentative = &c
		return false, st.send(st.decisionReply(c.dest, c.why, replyHeaders))
	default: // STREAMED, NONE, GRPC: Envoy waits for this reply before any body.
		return st.decideAndReply(decideInput{fallback: fallbackNoBody}, replyHeaders)
	}
}

func (st *stream) onRequestBody(b *extprocv3.HttpBody) (bool, error) {
	if st.phase != phaseRequestBody {
		return false, protocolErrorf("request_body in phase %s", st.phase)
	}
	eos := b.GetEndOfStream()
	switch st.reqMode {
	case filterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
		if eos {
			st.phase = phaseResponse
		}
		if st.through {
			return false, st.sendBody(b.GetBody(), eos)
		}
		chunk := b.GetBody()
		need := len(st.body) + len(chunk)
		reason := ""
		switch {
		case need > st.s.maxBody:
			reason = openai.ReasonTooLarge
		case need > st.held && !st.hold(max(need, st.declared)-st.held):
			// The declared length is reserved at the first chunk, so that a body that
			// cannot be parsed is known before any of it is held.
			reason = ReasonBodyBudget
		}
		switch {
		case st.body == nil && !eos && reason == "" && st.declared > len(chunk):
			// One buffer of the declared size instead of a chain of grown copies,
			// from the server's pool.
			st.bodyBuf = st.s.bodies.get(st.declared)
			st.body = append(*st.bodyBuf, chunk...)
		case st.body == nil:
			// The first chunk is kept as it is, not copied: its bytes were decoded into a
			// buffer of their own that only this message holds, and they are often the
			// whole body (Envoy ends a body with trailers or an empty last chunk).
			st.body = chunk
		default:
			st.body = append(st.body, chunk...)
		}
		if reason != "" {
			// Not parsed: route by load now and stream the rest through.
			st.through = true
			st.unhold()
			if done, err := st.decideAndReply(decideInput{parseErr: reason}, replyHeaders); done || err != nil {
				return done, err
			}
			body := st.body
			st.body = nil
			defer st.putBody()
			return false, st.sendBody(body, eos)
		}
		if !eos {
			return false, nil
		}
		done, err := st.decideAndReply(decideInput{body: st.body, hasBody: true}, replyHeaders)
		st.unhold() // parsed and tokenized: what is left is passing the bytes on
		if done || err != nil {
			return done, err
		}
		body := st.body
		st.body = nil
		defer st.unholdCopy() // a rewritten body is held until passed on
		defer st.putBody()
		return false, st.sendBody(body, true)
	case filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_BUFFERED_PARTIAL:
		if st.routed {
			return false, protocolErrorf("second request_body in %s mode", st.reqMode)
		}
		if eos {
			st.phase = phaseResponse
		} else {
			st.phase = phaseRequestTrailers
		}
		// BUFFERED sends the whole body (or answers 413); BUFFERED_PARTIAL sends a start
		// of it without end_of_stream when its buffer is full.
		whole := eos || st.reqMode == filterv3.ProcessingMode_BUFFERED || (st.declared > 0 && st.declared == len(b.GetBody()))
		in := decideInput{body: b.GetBody(), hasBody: true, partial: !whole}
		switch {
		case len(in.body) > st.s.maxBody:
			in = decideInput{parseErr: openai.ReasonTooLarge}
		case !st.hold(len(in.body)):
			// gRPC has read the body already; not parsing it still spares the parse's and
			// the tokenizer's memory, a multiple of the body's.
			in = decideInput{parseErr: ReasonBodyBudget}
		}
		defer st.unhold()
		return st.decideAndReply(in, replyBody)
	default: // STREAMED (and NONE, leniently): decided at the headers; pass each chunk on.
		if eos {
			st.phase = phaseResponse
		}
		return false, st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
			RequestBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{}}}})
	}
}

func (st *stream) onRequestTrailers() (bool, error) {
	if st.phase != phaseRequestBody && st.phase != phaseRequestTrailers {
		return false, protocolErrorf("request_trailers in phase %s", st.phase)
	}
	st.phase = phaseResponse
	if st.reqMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED && !st.through {
		// Trailers end the body: decide, reply headers, the body without end_of_stream, then
		// the trailers.
		done, err := st.decideAndReply(decideInput{body: st.body, hasBody: true}, replyHeaders)
		st.unhold()
		if done || err != nil {
			return done, err
		}
		body := st.body
		st.body = nil
		if len(body) > 0 {
			err := st.sendBody(body, false)
			st.unholdCopy() // a rewritten body is held until passed on
			st.putBody()
			if err != nil {
				return false, err
			}
		}
	}
	if !st.routed {
		if st.tentative == nil {
			return false, protocolErrorf("request_trailers before a routing decision in %s mode", st.reqMode)
		}
		st.commit(*st.tentative) // BUFFERED with an empty body: Envoy sends no body message
	}
	return false, st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{
		RequestTrailers: &extprocv3.TrailersResponse{}}})
}

// responseAllowed reports whether the response may start: the request was routed. Envoy
// can start the response before the request body ends (an upstream answering early), so
// the request phase is not required to be over.
func (st *stream) responseAllowed(what string) error {
	if !st.routed && st.tentative != nil && st.phase != phaseDone {
		st.commit(*st.tentative) // BUFFERED, empty body, trailers not sent: the request went on
	}
	if !st.routed || st.phase == phaseDone {
		return protocolErrorf("%s before the request was routed (phase %s)", what, st.phase)
	}
	if st.respDone {
		return protocolErrorf("%s after the end of the response", what)
	}
	return nil
}

func (st *stream) onResponseHeaders(msg *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) error {
	if err := st.responseAllowed("response_headers"); err != nil {
		return err
	}
	if st.respHeaders {
		return protocolErrorf("second response_headers")
	}
	st.respHeaders = true
	code, upstreamTime := 0, false
	for _, hv := range h.GetHeaders().GetHeaders() {
		switch hv.GetKey() {
		case ":status":
			code, _ = strconv.Atoi(headerValue(hv))
		case epp.HeaderUpstreamServiceTime:
			upstreamTime = true
		}
	}
	served := st.endpoint
	if v := metadataString(msg.GetMetadataContext(), epp.NamespaceLB, epp.HeaderServed); v != "" {
		served = v
	}
	if st.routed {
		// Passive health: the proxy could not get an answer from the chosen endpoint.
		switch {
		case code == 503 && !upstreamTime:
			st.upstreamFailed("local_reply")
		case served != st.endpoint:
			st.upstreamFailed("fallback_served")
			if listed(st.dest, served) {
				st.moveTo(served)
			}
		}
	}
	st.s.m.responses.WithLabelValues(st.endpoint, statusClass(code)).Inc()
	if st.routed && code != 200 {
		st.s.m.gie.errors.WithLabelValues(st.model, st.target, gieErrModelServer).Inc()
	}
	// Bookkeeping first, so that it is done by the time Envoy has the reply.
	if h.GetEndOfStream() {
		st.markFirstToken()
		st.endResponse()
	}
	return st.send(st.s.servedReplies.get(replyKey{addr: served}, func() *extprocv3.ProcessingResponse { return servedReply(served) }))
}

// upstreamFailed counts a response showing that the chosen endpoint did not answer and
// tells the fleet, which may take the endpoint out before its scrapes fail.
func (st *stream) upstreamFailed(kind string) {
	st.s.m.upstreamFailed.WithLabelValues(kind).Inc()
	if st.s.reporter != nil {
		st.s.reporter.UpstreamFailed(st.endpoint)
	}
}

// moveTo makes served, a listed fallback the proxy retried on, the request's endpoint:
// the fleet counts it in flight there until it ends, its response and token usage are
// counted under it, and the policy's Observer is told (Moved).
func (st *stream) moveTo(served string) {
	if st.released {
		return
	}
	st.s.fleet.End(st.endpoint)
	st.s.fleet.Begin(served)
	st.endpoint = served
	if st.observer != nil {
		st.observer.Moved(st.reqID, served)
	}
}

// listed reports whether addr is one of dest's comma-separated endpoints.
func listed(dest, addr string) bool {
	for dest != "" {
		var e string
		e, dest, _ = strings.Cut(dest, ",")
		if e == addr {
			return true
		}
	}
	return false
}

// servedReply is the response-headers reply adding epp.HeaderServed.
func servedReply(served string) *extprocv3.ProcessingResponse {
	mut := &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader(epp.HeaderServed, served)}}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
		ResponseHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{HeaderMutation: mut}}}}
}

func (st *stream) onResponseBody(b *extprocv3.HttpBody) error {
	if err := st.responseAllowed("response_body"); err != nil {
		return err
	}
	st.markFirstToken()
	st.respBytes += len(b.GetBody())
	st.usage.Write(b.GetBody())
	if b.GetEndOfStream() {
		st.endResponse()
	}
	if st.respMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		body := b.GetBody()
		if st.respModel != nil {
			body = st.respModel.edit(body, b.GetEndOfStream())
		}
		return st.sendChunks(body, b.GetEndOfStream(), false)
	}
	return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{
		ResponseBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{}}}})
}

func (st *stream) onResponseTrailers() error {
	if err := st.responseAllowed("response_trailers"); err != nil {
		return err
	}
	st.endResponse()
	if st.respModel != nil && st.respMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		if held := st.respModel.flush(); len(held) > 0 { // the trailers end the body
			if err := st.sendChunks(held, false, false); err != nil {
				return err
			}
		}
	}
	return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{
		ResponseTrailers: &extprocv3.TrailersResponse{}}})
}

func (st *stream) markFirstToken() {
	if st.firstToken {
		return
	}
	st.firstToken = true
	if st.observer != nil {
		st.observer.FirstToken(st.reqID)
	}
}

// endResponse counts usage and releases the endpoint; further response messages are
// refused. Request messages may still come when the upstream answered before the
// request body ended (FULL_DUPLEX_STREAMED passes such a body through).
func (st *stream) endResponse() {
	m := st.s.m
	u, ok := st.usage.Finish()
	if ok {
		m.promptTokens.WithLabelValues(st.endpoint).Add(float64(u.PromptTokens))
		if u.HasCached {
			m.cachedTokens.WithLabelValues(st.endpoint).Add(float64(u.CachedTokens))
		}
	}
	if st.routed && !st.released {
		// The picker's series of a finished request, recorded where it records them.
		gie := st.gie
		if d := st.s.now().Sub(st.start); d > 0 {
			gie.duration.Observe(d.Seconds())
		}
		gie.responseSize.Observe(float64(st.respBytes))
		if ok {
			if u.PromptTokens > 0 {
				gie.inputTokens.Observe(float64(u.PromptTokens))
			}
			if u.CompletionTokens > 0 {
				gie.outputTokens.Observe(float64(u.CompletionTokens))
			}
			if u.HasCached {
				gie.cachedTokens.Observe(float64(u.CachedTokens))
			}
		}
	}
	st.release()
	st.respDone = true
}

// release ends the routed request exactly once: at the end of the response, or when the
// stream ends early (client disconnect, stream error, Envoy closing without a response).
func (st *stream) release() {
	if !st.routed || st.released {
		return
	}
	st.released = true
	st.s.fleet.End(st.endpoint)
	st.gie.running.Dec()
	if st.observer != nil {
		st.observer.Finished(st.reqID)
	}
}

// putBody returns the pooled buffer the body was reassembled into, once the body was
// passed on (the replies that carried it are encoded when Send returns) or the stream
// ended.
func (st *stream) putBody() {
	if st.bodyBuf != nil {
		st.s.bodies.put(st.bodyBuf)
		st.bodyBuf, st.body = nil, nil
	}
}

// hold reserves n more body bytes for parsing in the server's budget for this stream.
func (st *stream) hold(n int) bool { return st.reserve(&st.held, n, ParseCost) }

// unhold returns the stream's body bytes to the budget: once its decision is made, or
// when the stream ends.
func (st *stream) unhold() { st.unreserve(&st.held, ParseCost) }

// holdCopy reserves the n bytes of a rewritten body's copy in the server's budget.
func (st *stream) holdCopy(n int) bool { return st.reserve(&st.copyHeld, n, RewriteCost) }

// unholdCopy returns the rewritten body's copy to the budget: once it is passed on, once
// the decision is known not to use it, or when the stream ends.
func (st *stream) unholdCopy() { st.unreserve(&st.copyHeld, RewriteCost) }

// reserve takes n more bytes, charged cost each, in the server's budget and counts
// them in *held.
func (st *stream) reserve(held *int, n int, cost int64) bool {
	if !st.s.reserve(int64(n) * cost) {
		return false
	}
	*held += n
	return true
}

// unreserve returns the *held bytes, charged cost each, to the server's budget.
func (st *stream) unreserve(held *int, cost int64) {
	st.s.unreserve(int64(*held) * cost)
	*held = 0
}

func (st *stream) send(r *extprocv3.ProcessingResponse) error {
	if err := st.srv.Send(r); err != nil {
		return fmt.Errorf("extproc: send: %w", err)
	}
	return nil
}

// sendBody returns request body bytes to Envoy in FULL_DUPLEX_STREAMED mode.
func (st *stream) sendBody(body []byte, eos bool) error {
	return st.sendChunks(body, eos, true)
}

// sendChunks sends body as streamed_response chunks of at most epp.MaxChunkBytes, the last
// carrying eos. An empty body still sends one (empty) chunk, so every body message Envoy
// sent gets a reply and end_of_stream is passed on.
func (st *stream) sendChunks(body []byte, eos, request bool) error {
	for {
		n := min(len(body), epp.MaxChunkBytes)
		last := n == len(body)
		if err := st.send(newChunkReply(body[:n], eos && last, request)); err != nil {
			return err
		}
		if last {
			return nil
		}
		body = body[n:]
	}
}

// chunkReply holds every message of one streamed_response reply, so that a reply costs
// one allocation instead of seven. The messages are never copied, only pointed to.
type chunkReply struct {
	r      extprocv3.ProcessingResponse
	reqB   extprocv3.ProcessingResponse_RequestBody
	respB  extprocv3.ProcessingResponse_ResponseBody
	br     extprocv3.BodyResponse
	common extprocv3.CommonResponse
	bm     extprocv3.BodyMutation
	sr     extprocv3.BodyMutation_StreamedResponse
	sbr    extprocv3.StreamedBodyResponse
}

// newChunkReply is the request-body (request true) or response-body reply carrying one
// streamed_response chunk.
func newChunkReply(chunk []byte, eos, request bool) *extprocv3.ProcessingResponse {
	c := &chunkReply{}
	c.sbr.Body, c.sbr.EndOfStream = chunk, eos
	c.sr.StreamedResponse = &c.sbr
	c.bm.Mutation = &c.sr
	c.common.BodyMutation = &c.bm
	c.br.Response = &c.common
	if request {
		c.reqB.RequestBody = &c.br
		c.r.Response = &c.reqB
	} else {
		c.respB.ResponseBody = &c.br
		c.r.Response = &c.respB
	}
	return &c.r
}

// firstValue keeps in *dst the header's value unless *dst holds one already (a header's
// first non-empty value counts) or the value is over limit bytes.
func firstValue(dst *string, hv *corev3.HeaderValue, limit int) {
	if *dst != "" {
		return
	}
	if v := headerValue(hv); len(v) <= limit {
		*dst = v
	}
}

func headerValue(hv *corev3.HeaderValue) string {
	if len(hv.GetRawValue()) > 0 {
		return string(hv.GetRawValue())
	}
	return hv.GetValue()
}

func statusClass(code int) string {
	if code < 100 || code > 599 {
		return "unknown"
	}
	return [...]string{"1xx", "2xx", "3xx", "4xx", "5xx"}[code/100-1]
}

// subsetHint reads the proxy's subset hint: a list of strings or one comma-separated
// string. present is true whenever the key exists, even if it names nothing.
func subsetHint(md *corev3.Metadata) (addrs []string, present bool) {
	ns := md.GetFilterMetadata()[epp.NamespaceSubsetHint]
	v, ok := ns.GetFields()[epp.KeySubset]
	if !ok {
		return nil, false
	}
	add := func(s string) {
		for _, p := range strings.Split(s, ",") {
			if p = strings.TrimSpace(p); p != "" {
				addrs = append(addrs, p)
			}
		}
	}
	if l := v.GetListValue(); l != nil {
		for _, item := range l.GetValues() {
			add(item.GetStringValue())
		}
	} else {
		add(v.GetStringValue())
	}
	return addrs, true
}

func metadataString(md *corev3.Metadata, ns, key string) string {
	return md.GetFilterMetadata()[ns].GetFields()[key].GetStringValue()
}
