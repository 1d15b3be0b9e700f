package extproc

import (
	"errors"
	"io"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"

	"github.com/kvrouter/kvrouter/openai"
	"github.com/kvrouter/kvrouter/rewrite"
	"github.com/kvrouter/kvrouter/scoring"
)

const (
	// DefaultMaxBodyBytes is the largest request body the router parses.
	DefaultMaxBodyBytes = 16 << 20
	// ParseCost is what a body held for parsing is charged in BodyBudgetBytes, per body
	// byte. Parsing keeps sub-slices of the body and tokenization is bounded by
	// MaxPromptTokens, not by the body; what grows with the body is the body itself (1),
	// its decoded JSON strings (1: unescaping never lengthens a string), the rendered
	// prompt (1: sized once from the messages' JSON) and the strings the chat template
	// builds on the way (up to 3: Llama 3's sets each message's text by concatenation
	// and trim before writing it; 4.9x in all for a 2,000-turn conversation).
	// TestParseCostCoversPromptAllocations measures it for every test model with a
	// tokenizer and fails when a body allocates more.
	ParseCost = 6
	// RewriteCost is what a request whose model is rewritten is charged in
	// BodyBudgetBytes beside its parse, per byte of the rewritten body: the copy that
	// carries the new model name, held from the decision until it is passed on.
	RewriteCost = 1
)

// Reasons a body is not parsed, beside openai's; they label
// kvrouter_request_parse_errors_total.
const (
	// ReasonBodyBudget: the bodies held for parsing by all streams, or the copy of a
	// body whose model is rewritten, would pass Options.BodyBudgetBytes; the request is
	// routed by load and its body streamed through as the client sent it.
	ReasonBodyBudget = "body_budget"
)

// DefaultMaxHold is the default Options.MaxHold (limits.max_hold): the longest hold the
// default policy asks for (placement's hold_max), leaving 80 ms of Envoy's default
// ext_proc message_timeout (200 ms) for what the router's clock does not see: the
// message's way in (a buffered body of megabytes), the reply's way out and a stall of
// the router's process.
const DefaultMaxHold = 120 * time.Millisecond

// deadlineReserve is kept before a deadline the client sends with the stream (gRPC
// grpc-timeout): holds end by then, leaving time for the last pick, the reply's way back
// and a scheduling delay on a busy node.
const deadlineReserve = 25 * time.Millisecond

// Fleet is what the server needs from the endpoint registry.
type Fleet interface {
	// Candidates returns the healthy endpoints serving model, in stable order; base and lora
	// name the base model and adapter; ok=false when no endpoint serves that model (then eps
	// is every healthy endpoint, so the request is still routed by load). model "" = any.
	Candidates(model string) (eps []scoring.Endpoint, base, lora string, ok bool)
	// Begin records that a request was routed to addr.
	Begin(addr string)
	// End records that the request routed to addr ended; called exactly once per Begin.
	End(addr string)
}

// upstreamReporter is implemented by fleets that take passive health signals
// (fleet.Fleet): the server tells it when the proxy's response shows that the chosen
// endpoint did not answer.
type upstreamReporter interface {
	UpstreamFailed(addr string)
}

// Tokenizer turns a parsed request into vLLM's prompt token ids.
type Tokenizer interface {
	PromptTokens(req *openai.Request, baseModel string) ([]uint32, error)
}

// Options configure a Server. Policy and Fleet are required.
type Options struct {
	// Policy picks the endpoint for requests whose body was parsed and whose model is served.
	Policy scoring.Policy
	// Fallback picks by load when Policy cannot be used (no body, parse error, unknown
	// model) or fails. Nil means scoring.NewLeastLoad().
	Fallback scoring.Policy
	// Fleet names the candidate endpoints and counts in-flight requests.
	Fleet Fleet
	// Tokenizer is optional: nil routes without token ids. One that also has
	// AppendPromptTokens(dst, req, baseModel) (as prompt.Registry does) fills pooled
	// buffers, reused once the decision is committed: policies must not keep
	// scoring.Request.TokenIDs past Pick and Routed.
	Tokenizer Tokenizer
	// MaxPromptTokens bounds the prompt tokens a Tokenizer with AppendPromptTokens
	// computes while no candidate's KV capacity (num_gpu_blocks x block_size, the bound
	// used once scraped) is known. 0 means no bound.
	MaxPromptTokens int
	// MaxBodyBytes bounds the request body the router parses; larger bodies are routed by
	// load and streamed through. 0 means DefaultMaxBodyBytes.
	MaxBodyBytes int
	// BodyBudgetBytes bounds the memory all streams together hold for parsing request
	// bodies, charged ParseCost times each body's bytes from its first chunk until the
	// decision is made, and RewriteCost times the bytes of a rewritten body's copy until
	// it is passed on; a body that would pass it is routed by load and streamed through
	// unparsed (unrewritten). 0 means no bound.
	BodyBudgetBytes int64
	// MaxStreams bounds the open ext_proc streams; one more is refused with
	// codes.ResourceExhausted (ErrTooManyStreams). 0 means no bound.
	MaxStreams int
	// StreamIdleTimeout ends a stream that sends no message this long after it opened
	// (Envoy opens a stream with the request headers), and Drain ends such streams at
	// once. 0 waits for ever.
	StreamIdleTimeout time.Duration
	// MaxFallbacks bounds the fallback endpoints appended to the destination after commas.
	// 0 names only the chosen endpoint, which an ORIGINAL_DST cluster requires.
	MaxFallbacks int
	// AssumedModes gives the body modes when Envoy does not send protocol_config (Envoy
	// releases before 1.33). Nil means FULL_DUPLEX_STREAMED for request and response.
	AssumedModes *extprocv3.ProtocolConfiguration
	// Logger receives stream-level failures (never per-request successes). Nil = no logs.
	Logger *zap.Logger
	// Registerer receives the server's metrics. Nil = discard.
	Registerer prometheus.Registerer
	// Now is the clock for latency metrics. Nil = time.Now.
	Now func() time.Time
	// MaxHold bounds how long the router may take to answer a request whose policy asks
	// to hold it (scoring.Decision.Hold), counted from the start of the decision, so that
	// parsing, tokenization and earlier holds count: a hold that would end past MaxHold is
	// not honoured and the request goes to the Decision's Endpoint, the best pick then.
	// When the stream carries a deadline (grpc-timeout), holds also end deadlineReserve
	// before it. Envoy's message_timeout (200 ms unless configured) runs while a request
	// is held in every body mode but FULL_DUPLEX_STREAMED: keep MaxHold well under it
	// (DefaultMaxHold leaves 80 ms of the default). 0 never holds.
	MaxHold time.Duration
	// After is the timer holds wait on. Nil = time.After.
	After func(time.Duration) <-chan time.Time
	// ShedWaiting > 0 sheds sheddable requests, as the Inference Extension's picker does:
	// a request whose priority is negative is answered 429 when every endpoint eligible
	// for it has valid metrics and more than ShedWaiting requests waiting in its queue
	// (vllm:num_requests_waiting), instead of adding to a queue. A request of priority 0
	// or more is always routed. 0 never sheds.
	ShedWaiting int
	// Objectives gives a request's priority from the InferenceObjective it names in the
	// x-gateway-inference-objective (or x-llm-d-inference-objective) header. Nil, no header
	// or an unknown name: priority 0.
	Objectives Objectives
	// Rewrites gives the InferenceModelRewrite rule for a request's model. Nil: no rule
	// (the x-gateway-model-name-rewrite header still rewrites).
	Rewrites Rewrites
	// IntN is the random source of the rewrites' weighted choice: a uniform int in
	// [0, n), safe for concurrent use. Nil = math/rand/v2.IntN.
	IntN func(n int) int
	// RetryAfter is the Retry-After of 429 and 503 answers, rounded up to whole seconds.
	// 0 means DefaultRetryAfter.
	RetryAfter time.Duration
}

// Objectives resolves the InferenceObjective a request names (epp.HeaderObjective) to
// its priority. Implementations must be safe for concurrent use.
type Objectives interface {
	// Priority returns the objective's priority; ok is false for an unknown name.
	Priority(name string) (priority int, ok bool)
}

// Rewrites resolves the InferenceModelRewrite rule that applies to a request's model
// (*rewrite.Table implements it). Implementations must be safe for concurrent use.
type Rewrites interface {
	// Lookup returns the rule for model, by the resource's precedence; ok is false when
	// none applies.
	Lookup(model string) (d rewrite.Decision, ok bool)
}

// DefaultShedWaiting is the default ShedWaiting of kvrouter's configuration
// (limits.shed_queue_depth): the Inference Extension's default queue-depth threshold, so
// that sheddable requests are shed by default as its picker sheds them; vLLM queues a
// request only when its running batch or its KV cache has no room for it.
const DefaultShedWaiting = 5

// maxObjectiveName bounds the objective names the router keeps from a request's header:
// a Kubernetes object name has at most 253 characters, and a longer value names none.
const maxObjectiveName = 253

// DefaultRetryAfter is the default Options.RetryAfter: one scrape interval's worth, after
// which the router's view of the endpoints' queues and health is new.
const DefaultRetryAfter = time.Second

// Server implements Envoy's ExternalProcessor service. Create it with New.
type Server struct {
	// routing is what SetRouting swaps; a request reads it once, when it is decided.
	routing   atomic.Pointer[routing]
	fleet     Fleet
	appender  candidateAppender // fleet, when it can fill a reused buffer
	reporter  upstreamReporter  // fleet, when it takes passive health signals
	servesApp modelServer       // fleet, when it answers Serves without building candidates
	tok       Tokenizer
	tokApp    tokenAppender  // tok, when it can fill a reused buffer
	prefixApp prefixAppender // tok, when it also describes the ids' cached prefix
	maxBody   int
	maxTokens int
	budget    int64
	maxStrm   int
	idle      time.Duration
	reqMode   filterv3.ProcessingMode_BodySendMode
	respMode  filterv3.ProcessingMode_BodySendMode
	log       *zap.Logger
	now       func() time.Time
	after     func(time.Duration) <-chan time.Time
	intn      func(int) int // the rewrites' random source
	retry     string        // Retry-After value of 429 and 503 answers, in seconds
	m         *metrics
	// candidateBufs pools *[]scoring.Endpoint for fleets implementing candidateAppender.
	candidateBufs sync.Pool
	// idBufs pools *promptBuf token-id buffers for tokenizers implementing tokenAppender.
	idBufs sync.Pool
	// bodies pools the buffers of request bodies reassembled from several chunks.
	bodies bodyPool
	// Replies that depend only on an endpoint address: decisions in a headers reply or a
	// body reply, and the response-headers reply naming the served endpoint.
	headerReplies, bodyReplies, servedReplies replyCache

	seq      atomic.Uint64
	active   atomic.Int64
	draining atomic.Bool
	drainCh  chan struct{} // closed by Drain
	drainOne sync.Once
	held     atomic.Int64 // charge of the bodies held (ParseCost x bytes, RewriteCost x a rewritten copy's), bounded by budget
	// workers serve the streams, and the first Recv of each, on goroutines whose stacks
	// stay grown (see workers).
	workers *workers
}

// New builds a Server; it starts nothing. It panics only if Policy or Fleet is nil, a
// programming error.
func New(o Options) *Server {
	if o.Policy == nil || o.Fleet == nil {
		panic("extproc: New needs Options.Policy and Options.Fleet")
	}
	s := &Server{
		fleet:     o.Fleet,
		tok:       o.Tokenizer,
		maxBody:   o.MaxBodyBytes,
		maxTokens: o.MaxPromptTokens,
		budget:    o.BodyBudgetBytes,
		maxStrm:   o.MaxStreams,
		idle:      o.StreamIdleTimeout,
		drainCh:   make(chan struct{}),
		reqMode:   filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		respMode:  filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		log:       o.Logger,
		now:       o.Now,
		after:     o.After,
		intn:      o.IntN,
		retry:     retryAfterSeconds(o.RetryAfter),
		m:         newMetrics(o.Registerer),
		workers:   newWorkers(),
	}
	if a, ok := o.Fleet.(candidateAppender); ok {
		s.appender = a
	}
	if r, ok := o.Fleet.(upstreamReporter); ok {
		s.reporter = r
	}
	if m, ok := o.Fleet.(modelServer); ok {
		s.servesApp = m
	}
	if a, ok := o.Tokenizer.(tokenAppender); ok {
		s.tokApp = a
	}
	if a, ok := o.Tokenizer.(prefixAppender); ok {
		s.prefixApp = a
	}
	s.SetRouting(Routing{Policy: o.Policy, Fallback: o.Fallback, MaxHold: o.MaxHold, MaxFallbacks: o.MaxFallbacks, ShedWaiting: o.ShedWaiting,
		Objectives: o.Objectives, Rewrites: o.Rewrites})
	if s.maxBody <= 0 {
		s.maxBody = DefaultMaxBodyBytes
	}
	if o.AssumedModes != nil {
		s.reqMode, s.respMode = o.AssumedModes.RequestBodyMode, o.AssumedModes.ResponseBodyMode
	}
	if s.log == nil {
		s.log = zap.NewNop()
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.after == nil {
		s.after = time.After
	}
	if s.intn == nil {
		s.intn = rand.IntN
	}
	return s
}

// Routing is the part of a Server's options that may change while it serves (a
// configuration reload): the fields of Options of the same names.
type Routing struct {
	Policy       scoring.Policy
	Fallback     scoring.Policy // nil: scoring.NewLeastLoad()
	MaxHold      time.Duration
	MaxFallbacks int
	ShedWaiting  int
	Objectives   Objectives // nil: every request has priority 0
	Rewrites     Rewrites   // nil: no InferenceModelRewrite rule
}

// routing is a Routing in force, with the policy's Observer found once.
type routing struct {
	policy, fallback scoring.Policy
	observer         scoring.Observer // policy's, when it implements scoring.Observer
	maxHold          time.Duration
	maxFalls         int
	shed             int
	objectives       Objectives
	rewrites         Rewrites
}

// priority is the priority of the requests naming objective: its InferenceObjective's,
// or 0 (the Inference Extension's default) without one, for an unknown name or without
// Objectives.
func (rt *routing) priority(objective string) int {
	if objective == "" || rt.objectives == nil {
		return 0
	}
	p, _ := rt.objectives.Priority(objective)
	return p
}

// SetRouting puts r in force for the requests decided from now on. A request already
// decided keeps the policy that routed it to its end: its Observer calls (FirstToken,
// Finished) go to that policy, never to one it was not Routed by. Safe to call while
// streams are open. It panics only if r.Policy is nil, a programming error.
func (s *Server) SetRouting(r Routing) {
	if r.Policy == nil {
		panic("extproc: SetRouting needs a Policy")
	}
	rt := &routing{policy: r.Policy, fallback: r.Fallback, maxHold: r.MaxHold, maxFalls: r.MaxFallbacks, shed: r.ShedWaiting,
		objectives: r.Objectives, rewrites: r.Rewrites}
	if rt.fallback == nil {
		rt.fallback = scoring.NewLeastLoad()
	}
	if obs, ok := r.Policy.(scoring.Observer); ok {
		rt.observer = obs
	}
	s.routing.Store(rt)
}

// retryAfterSeconds is d as a Retry-After value: whole seconds, rounded up, at least 1.
func retryAfterSeconds(d time.Duration) string {
	if d <= 0 {
		d = DefaultRetryAfter
	}
	return strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10)
}

// Register adds the ExternalProcessor service to g.
func (s *Server) Register(g *grpc.Server) {
	extprocv3.RegisterExternalProcessorServer(g, s)
}

// ErrDraining is the status new streams get once Drain was called.
var ErrDraining = status.Error(codes.Unavailable, "kvrouter: draining, not accepting new streams")

// Drain makes the server refuse new streams with codes.Unavailable (ErrDraining) while
// the streams already open run to their end. Poll Active until it is 0, then stop the
// gRPC server. (grpc.Server.GracefulStop alone also finishes open streams, but only once
// the listener is closed; Drain lets health checks and refusals start first.)
func (s *Server) Drain() {
	s.draining.Store(true)
	s.drainOne.Do(func() { close(s.drainCh) })
}

// ErrTooManyStreams is the status a stream gets when Options.MaxStreams are open.
var ErrTooManyStreams = status.Error(codes.ResourceExhausted, "kvrouter: too many open ext_proc streams")

// errIdle ends a stream that sent nothing within Options.StreamIdleTimeout.
var errIdle = status.Error(codes.DeadlineExceeded, "kvrouter: no ext_proc message within the stream idle timeout")

// Active returns the number of open ext_proc streams.
func (s *Server) Active() int { return int(s.active.Load()) }

// Process serves one Envoy ext_proc stream (one HTTP request and its response). The
// stream is served on a worker goroutine (see workers), whose stack has grown already.
func (s *Server) Process(srv extprocv3.ExternalProcessor_ProcessServer) (err error) {
	s.workers.run(func() { err = s.process(srv) })
	return err
}

func (s *Server) process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	n := s.active.Add(1)
	defer s.active.Add(-1)
	if s.draining.Load() {
		s.m.refused.WithLabelValues("draining").Inc()
		return ErrDraining
	}
	if s.maxStrm > 0 && n > int64(s.maxStrm) {
		s.m.refused.WithLabelValues("max_streams").Inc()
		return ErrTooManyStreams
	}
	s.m.streams.Inc()
	defer s.m.streams.Dec()

	st := stream{s: s, srv: srv, reqMode: s.reqMode, respMode: s.respMode}
	defer st.release()
	defer st.unhold()
	defer st.unholdCopy()
	defer st.putBody()
	for {
		var msg *extprocv3.ProcessingRequest
		var err error
		if st.first {
			msg, err = srv.Recv()
		} else {
			msg, err = s.recvFirst(srv)
		}
		if err == errIdle || err == ErrDraining {
			s.m.streamErrors.WithLabelValues("idle").Inc()
			return err
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			// The client (Envoy) went away or the stream broke: release the endpoint.
			s.m.streamErrors.WithLabelValues("recv").Inc()
			return err
		}
		done, err := st.handle(msg)
		if err != nil {
			var pe *protocolError
			if errors.Is(err, errHoldCancelled) {
				// Envoy or the client gave up while the request was held: nothing was routed.
				s.m.streamErrors.WithLabelValues("cancelled").Inc()
				return status.FromContextError(srv.Context().Err()).Err()
			}
			if errors.As(err, &pe) {
				s.m.streamErrors.WithLabelValues("protocol").Inc()
				s.log.Warn("ext_proc protocol violation", zap.Error(err))
				return status.Error(codes.FailedPrecondition, err.Error())
			}
			s.m.streamErrors.WithLabelValues("send").Inc()
			return err
		}
		if done {
			return nil
		}
	}
}

// recvFirst is the stream's first Recv, bounded by the idle timeout and ended by Drain:
// a stream that never sends must hold neither a slot nor the drain. The Recv runs on a
// worker (see workers), whose Recv returns when the stream ends (returning from Process
// ends it).
func (s *Server) recvFirst(srv extprocv3.ExternalProcessor_ProcessServer) (*extprocv3.ProcessingRequest, error) {
	if s.idle <= 0 {
		return srv.Recv()
	}
	type result struct {
		msg *extprocv3.ProcessingRequest
		err error
	}
	ch := make(chan result, 1)
	s.workers.goFunc(func() {
		msg, err := srv.Recv()
		ch <- result{msg, err}
	})
	t := time.NewTimer(s.idle)
	defer t.Stop()
	select {
	case r := <-ch:
		return r.msg, r.err
	case <-t.C:
		return nil, errIdle
	case <-s.drainCh:
		return nil, ErrDraining
	}
}

// reserve takes charge bytes of the body budget; false means the budget is spent.
func (s *Server) reserve(charge int64) bool {
	if s.budget <= 0 {
		return true
	}
	if s.held.Add(charge) > s.budget {
		s.held.Add(-charge)
		return false
	}
	s.m.bodyBytesHeld.Add(float64(charge))
	return true
}

// unreserve returns charge bytes to the body budget.
func (s *Server) unreserve(charge int64) {
	if s.budget <= 0 || charge == 0 {
		return
	}
	s.held.Add(-charge)
	s.m.bodyBytesHeld.Sub(float64(charge))
}

func (s *Server) nextID() string {
	return strconv.FormatUint(s.seq.Add(1), 10)
}
