package sim

import (
	"errors"
	"fmt"
	"hash/fnv"

	"github.com/kvrouter/kvrouter/kvevents"
)

// Callbacks receive a request's progress. They run on the goroutine that calls Complete
// (or Step) and must not call back into the Engine.
type Callbacks struct {
	// FirstToken is called once, when the first output token is produced, with the number
	// of prompt tokens served from the prefix cache at admission.
	FirstToken func(token uint32, cachedTokens int)
	// Token is called for every output token, the first included.
	Token func(token uint32)
	// Finish is called exactly once when the request ends.
	Finish func(Result)
}

// Result is a finished request.
type Result struct {
	ID           string
	PromptTokens int
	OutputTokens int
	// CachedTokens is the prompt tokens found in the prefix cache at first admission
	// (vLLM's num_cached_tokens, reported as usage.prompt_tokens_details.cached_tokens).
	CachedTokens int
	Preemptions  int
	// Reason is "length" when max_tokens were generated, "abort" when aborted.
	Reason string
}

// RequestError reports a request the engine refuses; HTTP servers answer it with 400.
type RequestError struct{ Msg string }

func (e *RequestError) Error() string { return "sim: " + e.Msg }

// ErrDuplicateID is returned by AddRequest for an id already in the engine.
var ErrDuplicateID = errors.New("sim: duplicate request id")

type status uint8

const (
	statusWaiting status = iota
	statusRunning
	statusPreempted
	statusFinished
)

type request struct {
	id          string
	tokens      []uint32 // prompt then outputs
	numPrompt   int
	maxTokens   int
	numComputed int
	blocks      []int32
	digests     [][32]byte // chained digests of full blocks of tokens
	hashes      []uint64   // their event handles
	numCached   int        // leading blocks of blocks[] that are cached (hashed)
	cached      int        // num_cached_tokens, -1 until first admission
	preemptions int
	status      status
	aborted     bool
	seed        uint64
	salt        string
	cb          Callbacks
	scheduled   int // tokens scheduled in the current step
}

func (r *request) numTokens() int { return len(r.tokens) }

// Stats are the figures vLLM exposes on /metrics, cumulative where vLLM's are counters.
type Stats struct {
	Running, Waiting int
	KVCacheUsage     float64
	// PrefixCacheQueries and PrefixCacheHits count tokens, for requests admitted without
	// a previous preemption (as vLLM's vllm:prefix_cache_queries / _hits).
	PrefixCacheQueries, PrefixCacheHits int64
	PromptTokens, GenerationTokens      int64
	Preemptions                         int64
	// FinishedRequests and FinishedOutputTokens count the requests that ended (any
	// reason) and their output tokens: vLLM's vllm:request_generation_tokens histogram's
	// _count and _sum.
	FinishedRequests, FinishedOutputTokens int64
	NumGPUBlocks, BlockSize                int
	// CachedBlocks counts the distinct block hashes the prefix cache holds: what a
	// KV-event subscriber's index should hold for this engine once its events are read.
	CachedBlocks int
}

// StepResult is what one engine step did.
type StepResult struct {
	// Duration is the step's simulated length in seconds (0 when nothing was scheduled).
	Duration float64
	// Events are the KV cache events of the step, in order; nil when events are off.
	Events []kvevents.Event
	// Finished are the requests that ended in this step.
	Finished []Result
	// PrefillTokens and DecodeSeqs describe the batch; Preempted counts requests preempted
	// while scheduling it.
	PrefillTokens, DecodeSeqs, Preempted int
}

// Engine is one simulated vLLM v1 engine core: scheduler, KV cache manager and a step-time
// model. It has no clock and no goroutines: callers drive it with Begin/Complete (or Step)
// and advance their own clock by each step's Duration. An Engine is not safe for
// concurrent use.
type Engine struct {
	cfg     Config
	pool    *blockPool
	hasher  *hasher
	reqs    map[string]*request
	waiting []*request // front is next; preempted requests are prepended
	running []*request
	sched   []*request // scheduled in the step under way
	inStep  bool
	pending StepResult
	stats   Stats
	spare   []int32
	aborts  int // aborted requests not yet reaped
}

// New builds an engine; it starts nothing.
func New(cfg Config) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Engine{
		cfg:    cfg,
		pool:   newBlockPool(cfg.NumGPUBlocks, cfg.BlockSize, cfg.EnableEvents),
		hasher: newHasher(cfg.HashSeed),
		reqs:   make(map[string]*request),
	}, nil
}

// Config returns the engine's configuration.
func (e *Engine) Config() Config { return e.cfg }

// AddRequest queues a request. maxTokens <= 0 means up to max_model_len. The prompt is
// copied. Errors are *RequestError for requests vLLM would reject, or ErrDuplicateID.
func (e *Engine) AddRequest(id string, prompt []uint32, maxTokens int, cb Callbacks) error {
	return e.AddRequestSalted(id, prompt, maxTokens, "", cb)
}

// AddRequestSalted is AddRequest with vLLM's cache_salt, folded into the first block's
// hash so that requests with different salts never share cached blocks.
func (e *Engine) AddRequestSalted(id string, prompt []uint32, maxTokens int, salt string, cb Callbacks) error {
	if _, ok := e.reqs[id]; ok {
		return fmt.Errorf("%w: %q", ErrDuplicateID, id)
	}
	if len(prompt) == 0 {
		return &RequestError{Msg: "the prompt is empty"}
	}
	if maxTokens <= 0 {
		maxTokens = e.cfg.MaxModelLen - len(prompt)
	}
	if len(prompt)+maxTokens > e.cfg.MaxModelLen {
		return &RequestError{Msg: fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
			e.cfg.MaxModelLen, len(prompt)+maxTokens, len(prompt), maxTokens)}
	}
	if need := (len(prompt) + maxTokens + e.cfg.BlockSize - 1) / e.cfg.BlockSize; need > e.cfg.NumGPUBlocks-1 {
		return &RequestError{Msg: fmt.Sprintf("the request needs %d KV cache blocks but the cache holds only %d", need, e.cfg.NumGPUBlocks-1)}
	}
	h := fnv.New64a()
	h.Write([]byte(id))
	toks := make([]uint32, len(prompt), len(prompt)+maxTokens)
	copy(toks, prompt)
	nb := (len(prompt) + maxTokens) / e.cfg.BlockSize
	r := &request{id: id, tokens: toks, numPrompt: len(prompt), maxTokens: maxTokens, cached: -1, seed: h.Sum64(), salt: salt, cb: cb,
		digests: make([][32]byte, 0, nb), hashes: make([]uint64, 0, nb), blocks: make([]int32, 0, nb+1)}
	e.reqs[id] = r
	e.waiting = append(e.waiting, r)
	return nil
}

// Abort ends a request early; its Finish callback runs with reason "abort" at the next
// Complete (or at once if it is only waiting). It reports whether the id was known.
func (e *Engine) Abort(id string) bool {
	r, ok := e.reqs[id]
	if !ok || r.aborted {
		return ok
	}
	r.aborted = true
	e.aborts++
	if !e.inStep {
		e.reapAborted()
	}
	return true
}

// CachedBlocks returns how many leading blocks of an unsalted prompt the prefix cache
// holds now, as admission would find them (never counting the last prompt token). It
// changes nothing: a trace (kvbench's --route-log) reads where a prefix is cached when a
// request is routed.
func (e *Engine) CachedBlocks(prompt []uint32) int {
	bs := e.cfg.BlockSize
	var d [32]byte
	n := 0
	for ; n < (len(prompt)-1)/bs; n++ {
		var parent *[32]byte
		if n > 0 {
			parent = &d
		}
		d = e.hasher.next(parent, prompt[n*bs:(n+1)*bs], "")
		if _, ok := e.pool.lookup(handle(d)); !ok {
			break
		}
	}
	return n
}

// HasWork reports whether any request is waiting or running.
func (e *Engine) HasWork() bool { return len(e.waiting)+len(e.running) > 0 }

// Stats returns the engine's current figures.
func (e *Engine) Stats() Stats {
	s := e.stats
	s.Running, s.Waiting = len(e.running), len(e.waiting)
	s.KVCacheUsage = e.pool.usage()
	s.NumGPUBlocks, s.BlockSize = e.cfg.NumGPUBlocks, e.cfg.BlockSize
	s.CachedBlocks = len(e.pool.cached)
	return s
}

// ResetPrefixCache drops every cached block, emitting AllBlocksCleared with the next
// step's events (or from TakeEvents); it fails while requests hold blocks.
func (e *Engine) ResetPrefixCache() bool { return e.pool.reset() }

// TakeEvents returns and clears KV events produced outside a step (ResetPrefixCache).
func (e *Engine) TakeEvents() []kvevents.Event {
	ev := e.pool.events
	e.pool.events = nil
	return ev
}

// Step runs Begin and Complete back to back.
func (e *Engine) Step() StepResult {
	if _, ok := e.Begin(); !ok {
		return StepResult{Events: e.TakeEvents()}
	}
	return e.Complete()
}

// Begin schedules one step as vLLM's Scheduler.schedule does and returns its duration in
// seconds; ok is false when nothing could be scheduled (the engine is idle). Requests may
// be added between Begin and Complete; they wait for the next step.
func (e *Engine) Begin() (duration float64, ok bool) {
	if e.inStep {
		return e.pending.Duration, true
	}
	e.reapAborted()
	e.pending = StepResult{}
	e.sched = e.sched[:0]
	budget := e.cfg.MaxNumBatchedTokens
	preempted := 0

	// Running requests first, in admission order.
	for i := 0; i < len(e.running) && budget > 0; {
		r := e.running[i]
		n := min(r.numTokens()-r.numComputed, budget, e.cfg.MaxModelLen-1-r.numComputed)
		if n <= 0 {
			i++
			continue
		}
		allocated := false
		for {
			if e.allocateSlots(r, n, 0) {
				allocated = true
				break
			}
			// Preempt the newest running request (FCFS policy).
			victim := e.running[len(e.running)-1]
			e.running = e.running[:len(e.running)-1]
			e.preempt(victim)
			preempted++
			if victim == r {
				break
			}
		}
		if !allocated {
			break
		}
		r.scheduled = n
		e.sched = append(e.sched, r)
		budget -= n
		i++
	}

	// Then waiting requests, unless this step preempted any.
	if preempted == 0 {
		for len(e.waiting) > 0 && budget > 0 && len(e.running) < e.cfg.MaxNumSeqs {
			r := e.waiting[0]
			hits := e.findCacheHit(r)
			n := min(r.numTokens()-hits*e.cfg.BlockSize, budget)
			if e.cfg.ReserveFullISL && !e.fits(r, r.numTokens()-hits*e.cfg.BlockSize, hits) {
				break
			}
			if !e.allocateSlots(r, n, hits) {
				break
			}
			e.waiting = e.waiting[1:]
			e.running = append(e.running, r)
			computed := hits * e.cfg.BlockSize
			if r.cached < 0 {
				r.cached = computed
			}
			if r.preemptions == 0 {
				e.stats.PrefixCacheQueries += int64(r.numTokens())
				e.stats.PrefixCacheHits += int64(computed)
			}
			r.numComputed = computed
			r.status = statusRunning
			r.scheduled = n
			e.sched = append(e.sched, r)
			budget -= n
		}
	}
	if len(e.sched) == 0 {
		return 0, false
	}

	// Step time from the batch's composition.
	var attn float64
	for _, r := range e.sched {
		n, c := r.scheduled, r.numComputed
		if n == 1 && r.numTokens() > r.numPrompt && c == r.numTokens()-1 {
			e.pending.DecodeSeqs++
		} else {
			e.pending.PrefillTokens += n
		}
		attn += float64(n) * (float64(c) + float64(n)/2) / 1e6
		r.numComputed += n
	}
	t := e.cfg.Timing
	e.pending.Duration = (t.Base + t.PrefillToken*float64(e.pending.PrefillTokens) +
		t.DecodeSeq*float64(e.pending.DecodeSeqs) + t.Attention*attn) / e.cfg.Speed
	e.pending.Preempted = preempted
	e.stats.Preemptions += int64(preempted)
	e.inStep = true
	return e.pending.Duration, true
}

// Complete finishes the step Begin scheduled, as vLLM's update_from_output does: every
// request whose tokens are all computed samples one token; requests reaching max_tokens
// finish and free their blocks. Callbacks run here. Without a step under way it only
// returns pending events.
func (e *Engine) Complete() StepResult {
	if !e.inStep {
		return StepResult{Events: e.TakeEvents()}
	}
	e.inStep = false
	res := e.pending
	e.pending = StepResult{}
	for _, r := range e.sched {
		if r.aborted || r.status != statusRunning || r.numComputed < r.numTokens() {
			continue // partial prefill chunk, or aborted mid-step
		}
		tok := pseudoToken(r.seed, r.numTokens()-r.numPrompt)
		if v := e.cfg.Vocabulary; len(v) > 0 {
			tok = v[tok%uint32(len(v))]
		}
		r.tokens = append(r.tokens, tok)
		e.stats.GenerationTokens++
		out := r.numTokens() - r.numPrompt
		if out == 1 {
			e.stats.PromptTokens += int64(r.numPrompt)
			if r.cb.FirstToken != nil {
				r.cb.FirstToken(tok, r.cached)
			}
		}
		if r.cb.Token != nil {
			r.cb.Token(tok)
		}
		if out >= r.maxTokens {
			res.Finished = append(res.Finished, e.finish(r, "length"))
		}
	}
	e.sched = e.sched[:0]
	e.reapAborted()
	res.Events = e.TakeEvents()
	return res
}

// findCacheHit returns how many leading blocks of r are cached, never counting the last
// prompt token (vLLM recomputes it for logits: max_cache_hit_length = num_tokens - 1).
func (e *Engine) findCacheHit(r *request) int {
	maxBlocks := (r.numTokens() - 1) / e.cfg.BlockSize
	e.ensureHashes(r, maxBlocks)
	n := 0
	for n < maxBlocks {
		if _, ok := e.pool.lookup(r.hashes[n]); !ok {
			break
		}
		n++
	}
	return n
}

// fits reports whether numNew tokens after hitBlocks cached blocks would find free blocks
// (vLLM's get_num_blocks_to_allocate against the free queue).
func (e *Engine) fits(r *request, numNew, hitBlocks int) bool {
	bs := e.cfg.BlockSize
	computed := r.numComputed + hitBlocks*bs
	need := (computed+numNew+bs-1)/bs - len(r.blocks) - hitBlocks
	for i := range hitBlocks {
		id, _ := e.pool.lookup(r.hashes[i])
		if e.pool.blocks[id].ref == 0 {
			need++ // a free cached block leaves the free queue when touched
		}
	}
	return need <= e.pool.numFree
}

// allocateSlots is KVCacheManager.allocate_slots for one request scheduling numNew tokens
// after hitBlocks newly found cached blocks. It returns false, changing nothing, when the
// free queue cannot supply the blocks.
func (e *Engine) allocateSlots(r *request, numNew, hitBlocks int) bool {
	if !e.fits(r, numNew, hitBlocks) {
		return false
	}
	bs := e.cfg.BlockSize
	computed := r.numComputed + hitBlocks*bs
	need := (computed+numNew+bs-1)/bs - len(r.blocks) - hitBlocks
	if hitBlocks > 0 {
		hit := e.spare[:0]
		for i := range hitBlocks {
			id, _ := e.pool.lookup(r.hashes[i])
			hit = append(hit, id)
		}
		e.pool.touch(hit)
		r.blocks = append(r.blocks, hit...)
		r.numCached = hitBlocks
		e.spare = hit
	}
	if need > 0 {
		r.blocks = e.pool.allocate(need, r.blocks)
	}
	e.cacheFullBlocks(r, min(computed+numNew, r.numTokens())/bs)
	return true
}

// cacheFullBlocks caches r's blocks up to numFull and emits one BlockStored for them.
func (e *Engine) cacheFullBlocks(r *request, numFull int) {
	if numFull <= r.numCached {
		return
	}
	e.ensureHashes(r, numFull)
	bs := e.cfg.BlockSize
	for i := r.numCached; i < numFull; i++ {
		e.pool.cacheBlock(r.blocks[i], r.hashes[i])
	}
	if e.pool.emit {
		ev := &kvevents.BlockStored{
			BlockHashes: append([]uint64(nil), r.hashes[r.numCached:numFull]...),
			TokenIDs:    append([]uint32(nil), r.tokens[r.numCached*bs:numFull*bs]...),
			BlockSize:   bs,
			Medium:      "GPU",
		}
		if r.numCached > 0 {
			ev.ParentHash, ev.HasParent = r.hashes[r.numCached-1], true
		}
		e.pool.events = append(e.pool.events, ev)
	}
	r.numCached = numFull
}

// ensureHashes extends r's chained block hashes to its first n full blocks.
func (e *Engine) ensureHashes(r *request, n int) {
	bs := e.cfg.BlockSize
	for i := len(r.hashes); i < n; i++ {
		var parent *[32]byte
		extra := r.salt
		if i > 0 {
			parent, extra = &r.digests[i-1], ""
		}
		d := e.hasher.next(parent, r.tokens[i*bs:(i+1)*bs], extra)
		r.digests = append(r.digests, d)
		r.hashes = append(r.hashes, handle(d))
	}
}

// preempt frees a running request's blocks and puts it back at the front of the waiting
// queue to be recomputed (vLLM's preemption by recompute).
func (e *Engine) preempt(r *request) {
	e.pool.free(r.blocks)
	r.blocks = r.blocks[:0]
	r.numCached = 0
	r.numComputed = 0
	r.preemptions++
	r.status = statusPreempted
	e.waiting = append([]*request{r}, e.waiting...)
}

// finish frees r and reports it.
func (e *Engine) finish(r *request, reason string) Result {
	switch r.status {
	case statusRunning:
		for i, x := range e.running {
			if x == r {
				e.running = append(e.running[:i], e.running[i+1:]...)
				break
			}
		}
	case statusWaiting, statusPreempted:
		for i, x := range e.waiting {
			if x == r {
				e.waiting = append(e.waiting[:i], e.waiting[i+1:]...)
				break
			}
		}
	}
	e.pool.free(r.blocks)
	r.blocks = nil
	r.status = statusFinished
	delete(e.reqs, r.id)
	res := Result{ID: r.id, PromptTokens: r.numPrompt, OutputTokens: r.numTokens() - r.numPrompt,
		CachedTokens: max(r.cached, 0), Preemptions: r.preemptions, Reason: reason}
	e.stats.FinishedRequests++
	e.stats.FinishedOutputTokens += int64(res.OutputTokens)
	if r.cb.Finish != nil {
		r.cb.Finish(res)
	}
	return res
}

func (e *Engine) reapAborted() {
	if e.aborts == 0 {
		return
	}
	e.aborts = 0
	for _, r := range e.reqs {
		if r.aborted && r.status != statusFinished {
			e.finish(r, "abort")
		}
	}
}

// pseudoToken is the deterministic output token at position i of a request.
func pseudoToken(seed uint64, i int) uint32 {
	x := seed + uint64(i)*0x9E3779B97F4A7C15
	x ^= x >> 30
	x *= 0xBF58476D1CE4E5B9
	x ^= x >> 27
	x *= 0x94D049BB133111EB
	x ^= x >> 31
	return 1000 + uint32(x%100000)
}
