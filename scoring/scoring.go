package scoring

import (
	"errors"
	"time"

	"github.com/kvrouter/kvrouter/index"
)

// Endpoint is one candidate for a request as a policy sees it: its address and the load
// the router knows of. Policies never see protobufs, sockets or configuration.
type Endpoint struct {
	// Address is the endpoint's HTTP address, "ip:port", exactly as it is named to Envoy.
	Address string
	// InFlight counts requests the router has sent to the endpoint and not yet seen finish.
	InFlight int
	// Metrics holds the endpoint's last scraped vLLM metrics; Metrics.Valid is false when
	// they were never scraped or are older than the staleness limit.
	Metrics Metrics
}

// Metrics are the load figures vLLM reports on /metrics.
type Metrics struct {
	Valid        bool
	Running      int     // vllm:num_requests_running
	Waiting      int     // vllm:num_requests_waiting
	KVCacheUsage float64 // vllm:kv_cache_usage_perc, 0..1
	NumGPUBlocks int     // vllm:cache_config_info{num_gpu_blocks}
	BlockSize    int     // vllm:cache_config_info{block_size}
	// FinishedRequests and OutputTokens are vllm:request_generation_tokens' _count and
	// _sum: the requests the engine finished since it started and their output tokens
	// (both 0 when the family is absent). Their ratio is the endpoint's mean output.
	FinishedRequests, OutputTokens float64
	// At is when these figures were scraped (zero when unknown), on the clock the router
	// gives its policies: a policy that counts its own requests can tell how many of the
	// scraped ones were its own then, and so how many other router replicas sent.
	At time.Time
}

// Request is what a policy knows of one request.
type Request struct {
	// ID is unique among the router's in-flight requests; Observers key on it.
	ID string
	// Model is the served model name the client asked for (a base model or a LoRA adapter).
	Model string
	// BaseModel is the base model behind Model (equal to Model when no adapter is used).
	BaseModel string
	// LoRA is the adapter name, empty for the base model.
	LoRA string
	// CacheSalt is the request's cache_salt, folded into the first block's key.
	CacheSalt string
	// TokenIDs are the prompt's token ids exactly as vLLM computes them; nil when the
	// router could not tokenize the request (policies then choose by load). The slice is
	// borrowed: the ext_proc server reuses its buffer once Observer.Routed has returned,
	// so a policy keeps what it derives (block keys, counts), never the slice.
	TokenIDs []uint32
	// Prefix, when not nil, holds the block keys of TokenIDs' leading ids that earlier
	// requests computed (the tokenizer's prefix cache keeps them with those ids, so a
	// conversation's turn hashes only its new blocks): see Keys. Borrowed like TokenIDs.
	Prefix index.PrefixKeys
	// MaxTokens is the body's max_completion_tokens or max_tokens, vLLM's default (16)
	// on completions without one, 0 when unknown (openai.Request.MaxTokens): the most
	// output tokens the request can add.
	MaxTokens int
	// Held is how long the router has already held the request at a policy's request
	// (the sum of the Decision.Hold it honoured); 0 at the first Pick.
	Held time.Duration
}

// Root is the key the chain of the request's block keys starts from: its base model
// (Model when BaseModel is empty), LoRA adapter and cache_salt (index.Root).
func (r *Request) Root() uint64 {
	model := r.BaseModel
	if model == "" {
		model = r.Model
	}
	return index.Root(model, r.LoRA, r.CacheSalt)
}

// Keys appends the chained keys of TokenIDs' full blocks of blockSize tokens under
// Root to dst (index.Keys), taking those of the leading blocks from Prefix where it
// has them: the one way policies key a request's blocks.
func (r *Request) Keys(blockSize int, dst []uint64) []uint64 {
	return index.PrefixedKeys(r.Root(), r.TokenIDs, blockSize, r.Prefix, dst)
}

// Decision is a policy's answer.
type Decision struct {
	// Endpoint is the chosen address; it is always one of the candidates.
	Endpoint string
	// Fallbacks are further candidates, best first, for the proxy's retries.
	Fallbacks []string
	// Scores, when the policy keeps them, maps each candidate's address to its score
	// (higher is better) for the debug view. May be nil.
	Scores map[string]float64
	// Hold > 0 asks the router to hold the request for Hold, then call Pick again with
	// Request.Held increased by Hold (the candidates may have changed by then). Endpoint
	// is still a valid answer: a router that cannot wait (its own hold limit is reached,
	// or it does not hold at all) routes there instead. Policies bound their own holds
	// through Request.Held; the router bounds them again.
	Hold time.Duration
	// Kind names the rule that made the decision, for the route log and the proxy's
	// access log (extproc's kvrouter dynamic metadata): a short string from the policy's
	// documented closed set, "" for a policy that does not say. kv and approximate:
	// KindHit, KindLoad, KindUntokenized; least-load KindLoad, round-robin KindTurn,
	// random KindRandom; placement: its README's decision kinds (those of
	// kvrouter_scoring_placement_decisions_total). The router names the fallback
	// policy's decisions KindFallback.
	Kind string
}

// Decision kinds of the kv and approximate policies (Decision.Kind).
const (
	// KindHit: the chosen endpoint holds (or is predicted to hold) some of the prompt's
	// leading blocks.
	KindHit = "hit"
	// KindLoad: the chosen endpoint holds none of them; its load alone chose it.
	KindLoad = "load"
	// KindUntokenized: the request has no token ids; picked by load.
	KindUntokenized = "untokenized"
)

// Decision kinds of the policies that read no prompt: least-load's is KindLoad.
const (
	// KindTurn: round-robin's, the next endpoint in turn.
	KindTurn = "turn"
	// KindRandom: random's, a uniform draw.
	KindRandom = "random"
)

// KindFallback is the kind of every decision the router's fallback policy made for a
// request it could not score (no body, a body not parsed, a model no endpoint serves, or
// the configured policy failed): set by the router (extproc), whatever the fallback
// (load-only, naming no kind of its own) says, never by a policy.
const KindFallback = "fallback"

// MaxFallbacks bounds Decision.Fallbacks: enough for the proxy's retries, and a pick
// over many endpoints does not sort them all.
const MaxFallbacks = 4

// Policy picks one endpoint among candidates, or asks the router to hold the request
// briefly (Decision.Hold) and ask again. Candidates are never empty, are all
// eligible (healthy, serving the request's model) and are in a stable order. Pick must
// not keep the candidates slice once it returns (the router reuses it for the next
// request); the strings in it may be kept. Implementations must be safe for concurrent
// use.
type Policy interface {
	Name() string
	Pick(req *Request, candidates []Endpoint) (Decision, error)
}

// Observer is implemented by policies that follow the requests they routed, for instance
// to count the prefill and decode load already on an endpoint. The router calls Routed once
// the decision is final, Moved when the proxy served the request on another endpoint than
// the one Routed named (a listed fallback it retried on), FirstToken when the endpoint's
// response starts, and Finished exactly once when the request ends for any reason. Moved
// comes between Routed and Finished, at most once per request in practice; a policy that
// tracks the request moves what it counts on the old endpoint to the new one.
type Observer interface {
	Routed(req *Request, endpoint string)
	Moved(reqID, endpoint string)
	FirstToken(reqID string)
	Finished(reqID string)
}

// ErrNoCandidates is returned by Pick when it is called with no candidates.
var ErrNoCandidates = errors.New("scoring: no candidate endpoints")
