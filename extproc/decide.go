package extproc

import (
	"errors"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvrouter/kvrouter/epp"
	"github.com/kvrouter/kvrouter/index"
	"github.com/kvrouter/kvrouter/openai"
	"github.com/kvrouter/kvrouter/scoring"
	"github.com/kvrouter/kvrouter/tokenizer"
)

// Reasons a request is routed by the Fallback policy; they label
// kvrouter_routing_fallbacks_total.
const (
	fallbackNoBody       = "no_body"       // no body reached the router before it had to answer
	fallbackParseError   = "parse_error"   // body not parsed (see kvrouter_request_parse_errors_total)
	fallbackUnknownModel = "unknown_model" // no endpoint serves the model
	fallbackPolicyError  = "policy_error"  // Policy failed or named an endpoint it was not offered
)

// Reasons for a 503; they label kvrouter_no_endpoint_total.
const (
	noEndpointNone   = "no_healthy_endpoint"
	noEndpointSubset = "subset_excludes_all"
	noEndpointPolicy = "fallback_failed"
)

// shedOverloaded is the no-endpoint reason of a 429: the request is sheddable (its
// priority is negative) and every eligible endpoint's queue is over Options.ShedWaiting
// (counted in kvrouter_requests_shed_total).
const shedOverloaded = "overloaded"

type decideInput struct {
	body     []byte
	hasBody  bool
	parseErr string // a parse-error reason known before parsing (too large, unsupported path)
	fallback string // a fallback reason known before parsing (no body)
	// partial: body may be only the start of the request's (BUFFERED_PARTIAL past Envoy's
	// buffer limit, the rest going upstream unseen): it is routed by, never rewritten, as
	// a new body would stand for the whole and its content-length leave the rest to be
	// read upstream as another request.
	partial bool
}

type replyKind int

const (
	replyHeaders replyKind = iota // decision in the request-headers reply
	replyBody                     // decision in the request-body reply (BUFFERED)
)

// choice is a decision not yet committed: nothing is begun in the Fleet until commit.
type choice struct {
	dest     string // header value: endpoint, then any fallbacks
	endpoint string
	policy   string
	why      string // the decision's kind (scoring.Decision.Kind; scoring.KindFallback when fallback is set), "" when the policy does not say
	fallback string // fallback reason, "" when the configured policy chose
	req      scoring.Request
	ids      *promptBuf       // pooled buffer behind req.TokenIDs and req.Prefix, returned once the choice is committed
	observer scoring.Observer // the configured policy's Observer when the choice was made, if any
	priority int              // the priority of the request's InferenceObjective
	rewrite  modelRewrite     // the request's model rewrite, if any
	body     []byte           // the request body with the rewritten model; nil when the model is not rewritten
}

// decideAndReply picks the endpoint, commits it and sends the reply that carries the
// decision, or an ImmediateResponse 503 when no endpoint is eligible (done is then true).
func (st *stream) decideAndReply(in decideInput, kind replyKind) (done bool, err error) {
	s := st.s
	start := s.now()
	c, reason, err := st.choose(in, start)
	if err != nil {
		st.unholdCopy()
		return true, err
	}
	s.m.decisionLatency.Observe(s.now().Sub(start).Seconds() - c.req.Held.Seconds())
	if reason != "" {
		st.unholdCopy()
		return true, st.reply503(reason)
	}
	st.commit(c)
	if c.body != nil {
		st.respModel = newResponseModel(c.rewrite.target, c.rewrite.from)
		if kind == replyHeaders {
			// FULL_DUPLEX_STREAMED: the caller streams st.body on, then returns its copy's
			// reservation.
			st.body = c.body
			return false, st.send(st.rewriteReply(c.dest, c.why, kind, c.body))
		}
		defer st.unholdCopy() // the body reply carries the copy: passed on once sent
		return false, st.send(st.rewriteReply(c.dest, c.why, kind, c.body))
	}
	return false, st.send(st.decisionReply(c.dest, c.why, kind))
}

// decisionReply is the reply naming dest, chosen by a decision of kind why; without
// client-sent x-gateway-destination-* headers to remove (the usual case) it comes from
// the server's reply cache.
func (st *stream) decisionReply(dest, why string, kind replyKind) *extprocv3.ProcessingResponse {
	for _, h := range st.spoofed {
		if h != epp.HeaderDestination {
			return decisionReply(dest, why, st.spoofed, kind)
		}
	}
	cache := &st.s.headerReplies
	if kind == replyBody {
		cache = &st.s.bodyReplies
	}
	return cache.get(replyKey{dest, why}, func() *extprocv3.ProcessingResponse { return decisionReply(dest, why, nil, kind) })
}

// reply503 answers the client directly: 429 when the request is shed, 503 otherwise.
func (st *stream) reply503(reason string) error {
	m := st.s.m
	if reason == shedOverloaded {
		// Only a known objective has a negative priority: the label is one of the
		// configured or watched objectives, never a name a client made up.
		m.shed.WithLabelValues(st.objective).Inc()
		m.gie.errors.WithLabelValues(st.model, st.target, gieErrResourceExhausted).Inc()
	} else {
		m.noEndpoint.WithLabelValues(reason).Inc()
		m.gie.errors.WithLabelValues(st.model, st.target, gieErrServiceUnavailable).Inc()
	}
	st.phase = phaseDone
	return st.send(immediateError(reason, st.s.retry))
}

// decisionReply is the request-headers or request-body reply naming dest, chosen by a
// decision of kind why. A body reply names the kind even when it is "": it overrides the
// tentative headers reply's (BUFFERED), whose load-based pick is the fallback's.
func decisionReply(dest, why string, spoofed []string, kind replyKind) *extprocv3.ProcessingResponse {
	common := &extprocv3.CommonResponse{HeaderMutation: decisionMutation(dest, spoofed), ClearRouteCache: true}
	r := &extprocv3.ProcessingResponse{DynamicMetadata: decisionMetadata(dest, why, kind == replyBody)}
	if kind == replyHeaders {
		r.Response = &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: common}}
	} else {
		r.Response = &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: common}}
	}
	return r
}

// commit makes c the stream's decision: the Fleet and the Observer are told, and the
// decision is counted.
func (st *stream) commit(c choice) {
	s := st.s
	if c.fallback != "" {
		s.m.fallbacks.WithLabelValues(c.fallback).Inc()
	}
	s.m.decisions.WithLabelValues(c.endpoint, c.policy).Inc()
	s.m.decisionKinds.WithLabelValues(c.policy, c.why).Inc()
	st.routed, st.endpoint, st.dest, st.reqID = true, c.endpoint, c.dest, c.req.ID
	st.tentative = nil
	s.fleet.Begin(c.endpoint)
	st.gie = s.m.gie.forModel(st.model, st.target)
	if c.priority == 0 {
		st.gie.requests0.Inc()
	} else {
		s.m.gie.requests.WithLabelValues(st.model, st.target, strconv.Itoa(c.priority)).Inc()
	}
	switch {
	case c.rewrite.rule != "":
		s.m.rewrites.WithLabelValues(c.rewrite.rule, st.model, c.rewrite.target).Inc()
	case c.rewrite.kept != "":
		s.m.rewritesKept.WithLabelValues(c.rewrite.kept).Inc()
	}
	st.gie.requestSize.Observe(float64(st.reqBytes))
	st.gie.running.Inc()
	st.observer = c.observer
	if st.observer != nil {
		st.observer.Routed(&c.req, c.endpoint)
	}
	s.putIDs(c.ids) // policies keep no token ids past Pick and Routed
}

// errHoldCancelled ends a stream whose context ended while its request was held.
var errHoldCancelled = errors.New("extproc: stream ended while the request was held")

// choose picks the endpoint for the request, or returns a no-endpoint reason. It has no
// effect beyond counting parse and tokenizer errors and holds, and noting the request's
// model and target model for the Inference Extension series (st.model, st.target). The
// model is rewritten (rewriteModel) before the candidates are asked for: they serve the
// target, and the choice carries the rewritten body. It holds the request
// (blocking the stream) while the policy asks and holdBound allows, start being when the
// decision began; err is errHoldCancelled when the stream's context ends meanwhile.
func (st *stream) choose(in decideInput, start time.Time) (c choice, noEndpointReason string, err error) {
	s := st.s
	fallback := in.fallback
	var parsed *openai.Request
	switch {
	case in.parseErr != "":
		s.m.parseErrors.WithLabelValues(in.parseErr).Inc()
		fallback = fallbackParseError
	case in.hasBody:
		var err error
		parsed, err = openai.Parse(st.path, in.body)
		if err != nil {
			reason := openai.ReasonMalformedJSON
			var pe *openai.ParseError
			if errors.As(err, &pe) {
				reason = pe.Reason
			}
			s.m.parseErrors.WithLabelValues(reason).Inc()
			fallback = fallbackParseError
		}
	}
	model := ""
	if parsed != nil {
		model = parsed.Model
	}
	rt := s.routing.Load() // this request's routing, even if SetRouting runs meanwhile
	rw := modelRewrite{target: model}
	if !in.partial {
		rw = s.rewriteModel(rt, model, st.rewriteTo)
	}
	if rw.target != model && !st.holdCopy(parsed.WithModelLen(len(in.body), rw.target)) {
		// The rewritten copy would pass the body budget: the request is routed by load as
		// the client sent it, as a body over the budget is.
		s.m.parseErrors.WithLabelValues(ReasonBodyBudget).Inc()
		fallback, rw = fallbackParseError, modelRewrite{target: model}
	}
	eps, base, lora, ok, buf := s.candidates(rw.target)
	defer func() { s.putCandidates(buf) }()
	var ids *promptBuf // pooled token ids; the returned choice owns them
	defer func() {
		if ids != c.ids {
			s.putIDs(ids)
		}
	}()
	if parsed != nil && !ok {
		fallback = fallbackUnknownModel
	}
	st.model, st.target, st.reqBytes = "", "", max(len(in.body), len(st.body))
	if parsed != nil {
		// Bounded label values: models the fleet serves or a rewrite rule names.
		servesModel := ok
		if rw.target != model {
			servesModel = s.serves(model)
		}
		if servesModel || rw.exact {
			st.model = model
		}
		if ok || rw.rule != "" {
			st.target = rw.target
		}
	}
	if rw.target != model {
		parsed.Model = rw.target
	}
	if reason := st.usable(&eps); reason != "" {
		return c, reason, nil
	}
	priority := rt.priority(st.objective)
	if shed(rt, in, priority, eps) {
		return c, shedOverloaded, nil
	}

	req := scoring.Request{ID: s.nextID(), Model: rw.target, BaseModel: base, LoRA: lora}
	if parsed != nil {
		req.CacheSalt, req.MaxTokens = parsed.CacheSalt, parsed.MaxTokens
	}
	if fallback == "" && s.tok != nil {
		var toks []uint32
		var prefix index.PrefixKeys
		var err error
		toks, prefix, ids, err = s.promptTokens(parsed, base, s.maxPromptTokens(eps))
		if err != nil {
			s.m.tokenizeErrors.Inc()
		} else {
			req.TokenIDs, req.Prefix = toks, prefix
		}
	}

	policy := rt.policy
	if fallback != "" {
		policy = rt.fallback
	}
	d, err := policy.Pick(&req, eps)
	for err == nil && d.Hold > 0 {
		if bound := st.holdBound(start, req.Held, d.Hold, rt.maxHold); bound != "" {
			s.m.holdsCut.WithLabelValues(bound).Inc()
			break
		}
		// The policy asks to wait: hold the stream (Envoy waits for this reply), then pick
		// again among the candidates as they are then.
		select {
		case <-st.srv.Context().Done():
			return c, "", errHoldCancelled
		case <-s.after(d.Hold):
		}
		req.Held += d.Hold
		s.m.holds.Inc()
		s.m.holdSeconds.Add(d.Hold.Seconds())
		s.putCandidates(buf)
		eps, _, _, _, buf = s.candidates(rw.target)
		if reason := st.usable(&eps); reason != "" {
			return c, reason, nil
		}
		d, err = policy.Pick(&req, eps)
	}
	if fallback == "" && (err != nil || !contains(eps, d.Endpoint)) {
		fallback, policy = fallbackPolicyError, rt.fallback
		d, err = policy.Pick(&req, eps)
	}
	if err != nil || !contains(eps, d.Endpoint) {
		return c, noEndpointPolicy, nil
	}
	dest := d.Endpoint
	if rt.maxFalls > 0 && len(d.Fallbacks) > 0 {
		var b strings.Builder
		b.WriteString(d.Endpoint)
		n := 0
		for _, f := range d.Fallbacks {
			if n == rt.maxFalls {
				break
			}
			if f != d.Endpoint && contains(eps, f) {
				b.WriteByte(',')
				b.WriteString(f)
				n++
			}
		}
		dest = b.String()
	}
	var body []byte // the body with the rewritten model, made once the request is known to be routed
	if rw.target != model {
		body = parsed.WithModel(in.body, rw.target)
	}
	why := d.Kind
	if fallback != "" {
		why = scoring.KindFallback // the fallback's own kind (load-only: none) would hide that the router could not score it
	}
	c = choice{dest: dest, endpoint: d.Endpoint, policy: policy.Name(), why: why, fallback: fallback, req: req, ids: ids, priority: priority,
		rewrite: rw, body: body}
	c.observer = rt.observer // told of every request routed under rt, as the fallback's too
	return c, "", nil
}

// Bounds that cut a hold short; they label kvrouter_routing_holds_cut_total.
const (
	holdBoundMax      = "max_hold" // Options.MaxHold
	holdBoundDeadline = "deadline" // the stream's deadline
)

// holdBound returns "" when a hold of d may begin now, in a decision begun at start that
// has held the request for held so far, or else the bound it would pass: it must end
// within MaxHold of start (on the server's clock, or by the holds' sum where that is
// larger, as under a test's timer) and deadlineReserve before the stream's deadline, if
// it has one.
func (st *stream) holdBound(start time.Time, held, d, maxHold time.Duration) string {
	s := st.s
	if max(s.now().Sub(start), held)+d > maxHold {
		return holdBoundMax
	}
	if dl, ok := st.srv.Context().Deadline(); ok && time.Until(dl) < d+deadlineReserve {
		return holdBoundDeadline
	}
	return ""
}

// shed reports whether the request is to be answered 429, as the Inference Extension's
// picker sheds: it is sheddable (its objective's priority is negative) and the endpoints
// that could serve it are saturated. A request of priority 0 or more is always routed; a
// request without body (a GET) queues nothing and is never shed.
func shed(rt *routing, in decideInput, priority int, eps []scoring.Endpoint) bool {
	return rt.shed > 0 && in.fallback != fallbackNoBody && priority < 0 && saturated(eps, rt.shed)
}

// saturated reports whether every endpoint in eps has valid metrics and more than
// waiting requests in its queue. An endpoint whose figures are unknown or stale is not
// saturated: the router sheds only on what it sees.
func saturated(eps []scoring.Endpoint, waiting int) bool {
	for i := range eps {
		if !eps[i].Metrics.Valid || eps[i].Metrics.Waiting <= waiting {
			return false
		}
	}
	return len(eps) > 0
}

// usable narrows eps to the proxy's subset hint, or returns why no endpoint is left.
func (st *stream) usable(eps *[]scoring.Endpoint) (noEndpointReason string) {
	if len(*eps) == 0 {
		return noEndpointNone
	}
	if st.hasSubset {
		*eps = inSubset(*eps, st.subset)
		if len(*eps) == 0 {
			return noEndpointSubset
		}
	}
	return ""
}

// candidateAppender is implemented by fleets that can write the candidates into a
// caller's buffer (fleet.Fleet does), so that a decision allocates no candidate slice.
type candidateAppender interface {
	AppendCandidates(dst []scoring.Endpoint, model string) (eps []scoring.Endpoint, base, lora string, ok bool)
}

// maxPooledCandidates bounds the candidate buffers kept for reuse.
const maxPooledCandidates = 4096

// candidates asks the Fleet for model's candidates, into a pooled buffer when the Fleet
// supports it; buf (maybe nil) goes back with putCandidates once the decision no longer
// reads eps. Policies do not keep the candidate slice past Pick.
func (s *Server) candidates(model string) (eps []scoring.Endpoint, base, lora string, ok bool, buf *[]scoring.Endpoint) {
	if s.appender == nil {
		eps, base, lora, ok = s.fleet.Candidates(model)
		return eps, base, lora, ok, nil
	}
	buf, _ = s.candidateBufs.Get().(*[]scoring.Endpoint)
	if buf == nil {
		buf = new([]scoring.Endpoint)
	}
	eps, base, lora, ok = s.appender.AppendCandidates(*buf, model)
	*buf = eps
	return eps, base, lora, ok, buf
}

func (s *Server) putCandidates(buf *[]scoring.Endpoint) {
	if buf == nil || cap(*buf) > maxPooledCandidates {
		return
	}
	clear(*buf) // drop the address strings while pooled (entries past len were cleared before)
	*buf = (*buf)[:0]
	s.candidateBufs.Put(buf)
}

// tokenAppender is implemented by tokenizers that can append the ids to a caller's
// buffer (prompt.Registry does), so that a decision allocates no id slice, and stop at
// maxTokens ids (0: all).
type tokenAppender interface {
	AppendPromptTokens(dst []uint32, req *openai.Request, baseModel string, maxTokens int) ([]uint32, error)
}

// maxPromptTokens is how many prompt tokens can matter for routing among eps: the most
// any of them can hold in its KV cache (scraped num_gpu_blocks x block_size); a longer
// prompt's tail is in no cache and cannot change which prefix matches. Before any
// capacity is scraped it is Options.MaxPromptTokens.
func (s *Server) maxPromptTokens(eps []scoring.Endpoint) int {
	most := 0
	for i := range eps {
		if m := eps[i].Metrics; m.Valid && m.NumGPUBlocks > 0 && m.BlockSize > 0 {
			most = max(most, m.NumGPUBlocks*m.BlockSize)
		}
	}
	if most == 0 {
		return s.maxTokens
	}
	return most
}

// prefixAppender is implemented by tokenAppenders that also describe the cached
// prefix the ids start with (prompt.Registry does): the policies then take the block
// keys of a conversation's history from the tokenizer's prefix cache
// (scoring.Request.Prefix) instead of hashing it again each turn.
type prefixAppender interface {
	AppendPromptTokensPrefix(dst []uint32, req *openai.Request, baseModel string, maxTokens int, p *tokenizer.Prefix) ([]uint32, error)
}

// promptBuf is the pooled memory behind a request's token ids and their Prefix.
type promptBuf struct {
	ids    []uint32
	prefix tokenizer.Prefix
}

// maxPooledIDs bounds the token-id buffers kept for reuse (1 MiB each).
const maxPooledIDs = 1 << 18

// promptTokens asks the Tokenizer for req's token ids, into a pooled buffer when it
// supports it, with the Prefix when it has one; buf (maybe nil) goes back with putIDs
// once no policy reads the ids.
func (s *Server) promptTokens(req *openai.Request, base string, maxTokens int) (ids []uint32, prefix index.PrefixKeys, buf *promptBuf, err error) {
	if s.tokApp == nil {
		ids, err = s.tok.PromptTokens(req, base)
		return ids, nil, nil, err
	}
	buf, _ = s.idBufs.Get().(*promptBuf)
	if buf == nil {
		buf = new(promptBuf)
	}
	if s.prefixApp != nil {
		ids, err = s.prefixApp.AppendPromptTokensPrefix(buf.ids[:0], req, base, maxTokens, &buf.prefix)
		prefix = &buf.prefix
	} else {
		ids, err = s.tokApp.AppendPromptTokens(buf.ids[:0], req, base, maxTokens)
	}
	if cap(ids) > cap(buf.ids) {
		buf.ids = ids[:0]
	}
	return ids, prefix, buf, err
}

func (s *Server) putIDs(buf *promptBuf) {
	if buf == nil || cap(buf.ids) > maxPooledIDs {
		return
	}
	buf.prefix.Reset() // no reference to the tokenizer's cache kept while pooled
	s.idBufs.Put(buf)
}

func contains(eps []scoring.Endpoint, addr string) bool {
	if addr == "" {
		return false
	}
	for i := range eps {
		if eps[i].Address == addr {
			return true
		}
	}
	return false
}

// inSubset keeps the endpoints the proxy's subset hint names. The protocol's entries are
// ip:port and must match an endpoint's address exactly; an entry without a port (which
// the Inference Extension's reference picker also accepts, matching by IP) names every
// endpoint at that IP. A hint only narrows the candidates: nothing outside eps is named.
func inSubset(eps []scoring.Endpoint, subset []string) []scoring.Endpoint {
	var hosts []string // the entries without a port, parsed once
	for _, h := range subset {
		if ip := hostOnly(h); ip != "" {
			hosts = append(hosts, ip)
		}
	}
	out := make([]scoring.Endpoint, 0, len(subset))
	for _, e := range eps {
		if slices.Contains(subset, e.Address) {
			out = append(out, e)
		} else if len(hosts) > 0 && hasHost(e.Address, hosts) {
			out = append(out, e)
		}
	}
	return out
}

// hasHost reports whether addr's host is one of hosts.
func hasHost(addr string, hosts []string) bool {
	host, _, err := net.SplitHostPort(addr)
	return err == nil && slices.Contains(hosts, host)
}

// hostOnly returns a hint entry's IP when the entry has no port ("10.0.0.1", "::1",
// "[::1]"), and "" when it has one.
func hostOnly(h string) string {
	if _, _, err := net.SplitHostPort(h); err == nil {
		return ""
	}
	if strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") {
		h = h[1 : len(h)-1]
	}
	if net.ParseIP(h) == nil {
		return ""
	}
	return h
}

func setHeader(key, value string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: key, RawValue: []byte(value)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

// decisionMutation sets the destination header and removes every other client-sent
// x-gateway-destination-* header (the destination itself is overwritten).
func decisionMutation(dest string, spoofed []string) *extprocv3.HeaderMutation {
	m := &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader(epp.HeaderDestination, dest)}}
	for _, h := range spoofed {
		if h != epp.HeaderDestination {
			m.RemoveHeaders = append(m.RemoveHeaders, h)
		}
	}
	return m
}

// decisionMetadata is the decision's dynamic metadata: dest under envoy.lb (the
// protocol's), and the decision's kind why, when the policy says (or always, to override
// an earlier reply's), under kvrouter's own namespace for the proxy's access log.
func decisionMetadata(dest, why string, always bool) *structpb.Struct {
	md := &structpb.Struct{Fields: map[string]*structpb.Value{
		epp.NamespaceLB: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			epp.HeaderDestination: structpb.NewStringValue(dest),
		}}),
	}}
	if why != "" || always {
		md.Fields[epp.NamespaceKVRouter] = structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			epp.KeyDecision: structpb.NewStringValue(why),
		}})
	}
	return md
}

var errorBodies = map[string][]byte{
	noEndpointNone:   errorBody("no healthy endpoint can serve this request", "service_unavailable", 503),
	noEndpointSubset: errorBody("no endpoint in the proxy's subset hint can serve this request", "service_unavailable", 503),
	noEndpointPolicy: errorBody("the router could not choose an endpoint", "service_unavailable", 503),
	shedOverloaded:   errorBody("every endpoint that can serve this request is saturated and its objective is sheddable (priority < 0); retry later", "rate_limit_exceeded", 429),
}

func errorBody(msg, typ string, code int) []byte {
	return []byte(`{"error":{"message":"kvrouter: ` + msg + `","type":"` + typ + `","param":null,"code":` + strconv.Itoa(code) + `}}`)
}

// immediateError is the OpenAI-style error Envoy returns to the client when no endpoint
// is eligible (503) or the request is shed (429), with Retry-After retry seconds.
func immediateError(reason, retry string) *extprocv3.ProcessingResponse {
	code := typev3.StatusCode_ServiceUnavailable
	if reason == shedOverloaded {
		code = typev3.StatusCode_TooManyRequests
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{
			Status: &typev3.HttpStatus{Code: code},
			Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
				setHeader("content-type", "application/json"),
				setHeader("retry-after", retry),
			}},
			Body:    errorBodies[reason],
			Details: "kvrouter_" + reason,
		}}}
}
