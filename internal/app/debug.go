package app

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"time"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/openai"
	"github.com/kvrouter/kvrouter/scoring"
)

// KVRank is one data-parallel rank of an endpoint in GET /debug/kv: its event stream and
// what the index holds for it.
type KVRank struct {
	Rank           int       `json:"rank"`
	Address        string    `json:"address"`
	Connected      bool      `json:"connected"`
	LastSeq        uint64    `json:"last_seq"`
	HasSeq         bool      `json:"has_seq"`
	Batches        uint64    `json:"batches"`
	Gaps           uint64    `json:"gaps"`
	Replays        uint64    `json:"replays"`
	ReplayFailures uint64    `json:"replay_failures"`
	Drops          uint64    `json:"drops"`
	DecodeErrors   uint64    `json:"decode_errors"`
	Clears         uint64    `json:"clears"`
	EventLagMS     float64   `json:"event_lag_ms"`
	LastBatchAt    time.Time `json:"last_batch_at,omitzero"`
	Blocks         int       `json:"indexed_blocks"`
	Capacity       int       `json:"capacity"`
	Orphans        uint64    `json:"orphans"`
	Evicted        uint64    `json:"evicted"`
	// LastError is what last went wrong with the stream (dial, connection, gap, replay,
	// clear, decode, topic), LastErrorAt when; ForeignTopic the topic of the last
	// message dropped for not starting with the configured topic.
	LastError    string    `json:"last_error,omitempty"`
	LastErrorAt  time.Time `json:"last_error_at,omitzero"`
	ForeignTopic string    `json:"foreign_topic,omitempty"`
}

// KVEndpoint is one endpoint in GET /debug/kv; the totals sum (or, for the lag, take the
// worst of) its ranks.
type KVEndpoint struct {
	Endpoint         string   `json:"endpoint"`
	EventsConfigured bool     `json:"events_configured"`
	Connected        bool     `json:"connected"`
	EventsHealthy    bool     `json:"events_healthy"`
	IndexedBlocks    int      `json:"indexed_blocks"`
	NumGPUBlocks     int      `json:"num_gpu_blocks"`
	LastSeq          []uint64 `json:"last_seq"`
	Gaps             uint64   `json:"gaps"`
	Replays          uint64   `json:"replays"`
	Drops            uint64   `json:"drops"`
	EventLagMS       float64  `json:"event_lag_ms"`
	Ranks            []KVRank `json:"ranks"`
}

// DebugKV returns the view GET /debug/kv serves: every endpoint of the fleet, plus any
// the index or subscriber still know of, sorted by address.
func (a *App) DebugKV() []KVEndpoint {
	byAddr := map[string]*KVEndpoint{}
	var order []string
	get := func(addr string) *KVEndpoint {
		e := byAddr[addr]
		if e == nil {
			e = &KVEndpoint{Endpoint: addr, LastSeq: []uint64{}, Ranks: []KVRank{}}
			byAddr[addr] = e
			order = append(order, addr)
		}
		return e
	}
	rank := func(e *KVEndpoint, r int) *KVRank {
		for i := range e.Ranks {
			if e.Ranks[i].Rank == r {
				return &e.Ranks[i]
			}
		}
		e.Ranks = append(e.Ranks, KVRank{Rank: r})
		return &e.Ranks[len(e.Ranks)-1]
	}
	for _, st := range a.fleet.Status() {
		e := get(st.Config.Address)
		e.EventsConfigured = len(st.Config.KVEvents.Endpoints) > 0 || len(st.Config.KVEvents.CentralRanks) > 0
		e.NumGPUBlocks = st.Metrics.NumGPUBlocks
	}
	for _, st := range a.kv.sub.Status() {
		e := get(st.Endpoint)
		r := rank(e, st.Rank)
		fillStream(r, &st)
	}
	for _, s := range a.kv.ix.Stats() {
		e := get(s.Endpoint)
		e.IndexedBlocks = s.Blocks
		if s.NumGPUBlocks > 0 {
			e.NumGPUBlocks = s.NumGPUBlocks
		}
		for _, rs := range s.Ranks {
			r := rank(e, rs.Rank)
			r.Blocks, r.Capacity, r.Orphans, r.Evicted = rs.Blocks, rs.Capacity, rs.Orphans, rs.Evicted
		}
	}
	out := make([]KVEndpoint, 0, len(order))
	slicesSort(order)
	for _, addr := range order {
		e := byAddr[addr]
		sortRanks(e.Ranks)
		streams := 0
		e.Connected = true
		for _, r := range e.Ranks {
			if r.Address == "" {
				continue // index-only rank
			}
			streams++
			e.Connected = e.Connected && r.Connected
			e.LastSeq = append(e.LastSeq, r.LastSeq)
			e.Gaps += r.Gaps
			e.Replays += r.Replays
			e.Drops += r.Drops + r.DecodeErrors
			e.EventLagMS = max(e.EventLagMS, r.EventLagMS)
		}
		e.Connected = e.Connected && streams > 0
		e.EventsHealthy = a.kv.health.EventsHealthy(addr)
		out = append(out, *e)
	}
	return out
}

func fillStream(r *KVRank, st *kvevents.StreamStatus) {
	r.Address, r.Connected, r.LastSeq, r.HasSeq = st.Address, st.Connected, st.LastSeq, st.HasSeq
	r.Batches, r.Gaps, r.Replays, r.ReplayFailures, r.Drops = st.Batches, st.Gaps, st.Replays, st.ReplayFailures, st.Drops
	for _, n := range st.DecodeErrors {
		r.DecodeErrors += n
	}
	for _, n := range st.Clears {
		r.Clears += n
	}
	r.EventLagMS = float64(st.LastLag) / float64(time.Millisecond)
	r.LastBatchAt = st.LastBatchAt
	r.LastError, r.LastErrorAt, r.ForeignTopic = st.LastError, st.LastErrorAt, st.ForeignTopic
}

func (a *App) serveDebugKV(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, a.DebugKV())
}

// RouteEndpoint is one candidate in POST /debug/route.
type RouteEndpoint struct {
	Address       string  `json:"address"`
	InFlight      int     `json:"in_flight"`
	Running       int     `json:"running"`
	Waiting       int     `json:"waiting"`
	KVCacheUsage  float64 `json:"kv_cache_usage"`
	MetricsValid  bool    `json:"metrics_valid"`
	EventsHealthy bool    `json:"events_healthy"`
	BlockSize     int     `json:"block_size"`
	RequestBlocks int     `json:"request_blocks"`
	// IndexedLeadingBlocks is how many of the request's leading blocks the event-fed
	// index says the endpoint holds (whatever the policy).
	IndexedLeadingBlocks int `json:"indexed_leading_blocks"`
	// Load is least-load's figure: in-flight + running + waiting.
	Load int `json:"load"`
}

// PolicyView is what one policy would do with the request.
type PolicyView struct {
	Policy string `json:"policy"`
	// Pick is the endpoint it would choose now; empty when the choice is random.
	Pick string `json:"pick"`
	// Kind is the kind its decision would name (scoring.Decision.Kind): kv and
	// approximate say hit, load or untokenized; empty for a policy that names none (the
	// load-only ones) or cannot say without routing the request (placement).
	Kind string `json:"kind,omitempty"`
	Note string `json:"note,omitempty"`
	// Scores holds the kv and approximate policies' cost terms per candidate.
	Scores *scoring.Explanation `json:"scores,omitempty"`
}

// RouteExplanation answers POST /debug/route: why a request would go where it goes.
type RouteExplanation struct {
	// Model is the model the request is routed for: its own, or the target a model
	// rewrite chose (RewrittenFrom then holds its own, Rewrite the InferenceModelRewrite).
	Model         string `json:"model"`
	RewrittenFrom string `json:"rewritten_from,omitempty"`
	Rewrite       string `json:"rewrite,omitempty"`
	BaseModel     string `json:"base_model"`
	LoRA          string `json:"lora,omitempty"`
	// Tokens is the prompt's token count; TokenizeError says why there is none.
	Tokens        int    `json:"tokens"`
	TokenizeError string `json:"tokenize_error,omitempty"`
	// Used names the policy the router would use (the configured one, or the fallback
	// when the model is not served), and Pick its choice.
	Used           string `json:"used"`
	FallbackReason string `json:"fallback_reason,omitempty"`
	Pick           string `json:"pick"`
	// Kind is the kind the router's decision would name in the proxy's metadata
	// (kvrouter:decision) and kvrouter_routing_decision_kinds_total: the used policy's
	// (Policy.Kind), or fallback when the fallback policy would route the request.
	Kind      string          `json:"kind,omitempty"`
	Endpoints []RouteEndpoint `json:"endpoints"`
	Policy    PolicyView      `json:"policy"`
	Fallback  PolicyView      `json:"fallback"`
}

// errBadDebugRequest is wrapped by ExplainRoute for bodies it cannot read.
var errBadDebugRequest = errors.New("app: bad request")

// ExplainRoute computes what the router would do with an OpenAI request body sent to path
// ("" guesses chat when the body has messages): the model rewrite that applies (a
// weighted rule draws once), the token count, each candidate's
// matched leading blocks in the index, and each policy's scores and pick. It changes no
// routing state (no in-flight count, no policy bookkeeping, no round-robin turn).
func (a *App) ExplainRoute(path string, body []byte) (*RouteExplanation, error) {
	if path == "" {
		path = "/v1/completions"
		var top map[string]json.RawMessage
		if json.Unmarshal(body, &top) == nil && top["messages"] != nil {
			path = "/v1/chat/completions"
		}
	}
	req, err := openai.Parse(path, body)
	if err != nil {
		return nil, errors.Join(errBadDebugRequest, err)
	}
	from, rule := "", ""
	if a.extproc != nil {
		if target, r := a.extproc.Rewrite(req.Model, ""); target != req.Model {
			from, rule, req.Model = req.Model, r, target
		}
	}
	eps, base, lora, ok := a.fleet.Candidates(req.Model)
	pols := a.pols.Load()
	x := &RouteExplanation{Model: req.Model, RewrittenFrom: from, Rewrite: rule, BaseModel: base, LoRA: lora, Used: pols.policy.Name(),
		Endpoints: []RouteEndpoint{}}
	if !ok {
		x.Used, x.FallbackReason = pols.fallback.Name(), "unknown_model"
	}
	sreq := &scoring.Request{ID: "debug", Model: req.Model, BaseModel: base, LoRA: lora, CacheSalt: req.CacheSalt, MaxTokens: req.MaxTokens}
	switch {
	case !ok:
	case a.tok == nil:
		x.TokenizeError = "no tokenizer configured"
	default:
		ids, err := a.tok.PromptTokens(req, base)
		if err != nil {
			x.TokenizeError = err.Error()
		} else {
			sreq.TokenIDs, x.Tokens = ids, len(ids)
		}
	}
	bs := a.blockSize()
	keys := map[int][]uint64{}
	for _, e := range eps {
		re := RouteEndpoint{Address: e.Address, InFlight: e.InFlight, Running: e.Metrics.Running, Waiting: e.Metrics.Waiting,
			KVCacheUsage: e.Metrics.KVCacheUsage, MetricsValid: e.Metrics.Valid, Load: scoring.Load(&e),
			EventsHealthy: a.kv.health.EventsHealthy(e.Address), BlockSize: bs}
		if e.Metrics.Valid && e.Metrics.BlockSize > 0 {
			re.BlockSize = e.Metrics.BlockSize
		}
		if sreq.TokenIDs != nil {
			k, ok := keys[re.BlockSize]
			if !ok {
				k = sreq.Keys(re.BlockSize, nil)
				keys[re.BlockSize] = k
			}
			re.RequestBlocks = len(k)
			re.IndexedLeadingBlocks = a.kv.ix.LeadingBlocks(k, []string{e.Address}, nil)[0]
		}
		x.Endpoints = append(x.Endpoints, re)
	}
	if len(eps) == 0 {
		x.Policy = PolicyView{Policy: pols.policy.Name(), Note: "no eligible endpoint: the router answers 503"}
		x.Fallback = PolicyView{Policy: pols.fallback.Name(), Note: x.Policy.Note}
		return x, nil
	}
	x.Policy = explainPolicy(pols.policy, sreq, eps)
	x.Fallback = explainPolicy(pols.fallback, sreq, eps)
	x.Pick, x.Kind = x.Policy.Pick, x.Policy.Kind
	if !ok {
		x.Pick, x.Kind = x.Fallback.Pick, scoring.KindFallback
	}
	return x, nil
}

func explainPolicy(p scoring.Policy, req *scoring.Request, eps []scoring.Endpoint) PolicyView {
	v := PolicyView{Policy: p.Name()}
	switch p := p.(type) {
	case explainer:
		ex, err := p.Explain(req, eps)
		if err != nil {
			v.Note = err.Error()
			return v
		}
		v.Pick, v.Kind, v.Scores = ex.Pick, ex.Kind, &ex
		switch {
		case ex.Sampled:
			v.Note = "temperature > 0: the policy samples; pick is the most likely candidate"
		case ex.Ties > 1:
			v.Note = "several candidates share the lowest cost: the policy picks one of them at random"
		}
		if !ex.Tokenized {
			v.Note = "no token ids: scored by load alone"
		}
	case *scoring.RoundRobin:
		v.Pick, v.Kind, v.Note = p.Peek(eps), scoring.KindTurn, "the next candidate in turn"
	case *scoring.LeastLoad:
		d, err := p.Pick(req, eps) // stateless
		if err != nil {
			v.Note = err.Error()
		}
		v.Pick, v.Kind = d.Endpoint, d.Kind
	case *scoring.Random:
		v.Kind, v.Note = scoring.KindRandom, "chooses at random"
	default:
		// placement keeps state its pick changes (placements, pending requests, holds).
		v.Note = "the policy cannot explain a request without routing it: its decisions' kinds are in the proxy's metadata (kvrouter:decision) and kvrouter_routing_decision_kinds_total"
	}
	return v
}

// maxDebugBody bounds POST /debug/route bodies.
const maxDebugBody = 16 << 20

func (a *App) serveDebugRoute(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxDebugBody))
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "reading the body: " + err.Error()})
		return
	}
	if len(bytes.TrimSpace(body)) == 0 {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "post an OpenAI completions or chat completions body"})
		return
	}
	x, err := a.ExplainRoute(r.URL.Query().Get("path"), body)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, x)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func slicesSort(s []string) { slices.Sort(s) }

func sortRanks(r []KVRank) {
	slices.SortFunc(r, func(a, b KVRank) int { return a.Rank - b.Rank })
}
