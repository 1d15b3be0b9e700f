package kvbench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/kvrouter/kvrouter/extproc"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/scoring"
	"github.com/kvrouter/kvrouter/testbench/sim"
)

// ServerSpec is one simulated server: its KV cache size and its speed (1 = the calibrated
// step-time model, 0.5 = half as fast).
type ServerSpec struct {
	KVBytes int64
	Speed   float64
}

// ChurnEvent takes a server out of the fleet or brings it back at a virtual time. A server
// that leaves gets no new requests, finishes those it has, then drops its prefix cache
// (as a restarted pod would); one that joins starts routable with that empty cache. When
// a server leaves, policies and event sinks with a Forget(endpoint) method are told.
type ChurnEvent struct {
	At     time.Duration
	Server int
	Leave  bool
}

// PolicyEnv is what a policy factory gets to build one router replica's policy for one run.
type PolicyEnv struct {
	// Policy is the policy's registered name.
	Policy string
	// Seed makes the policy's random choices reproducible; it differs per replica and
	// repetition.
	Seed uint64
	// Replica is the router replica, 0-based.
	Replica int
	// Endpoints are the servers' addresses; NumGPUBlocks their KV capacity in blocks of
	// BlockSize tokens.
	Endpoints    []string
	NumGPUBlocks []int
	BlockSize    int
	Model        string
	// Now is the run's clock (the fleet's virtual clock in sim mode), for policies that
	// measure time.
	Now func() time.Time
}

// EventSink receives one server's decoded KV event batches (a block index).
type EventSink interface {
	Apply(endpoint string, b *kvevents.Batch) error
}

// Router is one router replica's parts: its policy and, when the policy reads KV events,
// the index that events feed (nil otherwise).
type Router struct {
	Policy scoring.Policy
	Events EventSink
	// Sync, when set, is the replica's shared state (package peersync's Replica): the sim
	// carries its snapshots to the other replicas through the same Publish and Receive the
	// real transport uses, SimConfig.Sync.Delay after they were built.
	Sync Syncer
}

// Syncer is one router replica's shared state: Publish returns its state to send (nil:
// nothing due), Receive applies another replica's.
type Syncer interface {
	Publish() []byte
	Receive(b []byte) error
}

// SyncConfig models the replicas' state sync: every Interval each replica publishes its
// state if due, and the others receive it Delay later. Interval 0: no sync.
type SyncConfig struct {
	Interval time.Duration
	Delay    time.Duration
}

// RequestTokenizer computes a request's prompt token ids from its HTTP path and JSON body
// exactly as vLLM will.
type RequestTokenizer interface {
	PromptTokens(path string, body []byte) ([]uint32, error)
}

// PolicyFactory builds a fresh Router for one replica of one run.
type PolicyFactory func(env PolicyEnv) (Router, error)

// SimConfig is sim mode: a simulated fleet on a virtual clock, routed by the real policies
// through the real index and tokenizer.
type SimConfig struct {
	// Servers are the fleet; Engine is the template of every engine's configuration (its
	// NumGPUBlocks and Speed are replaced from each server's spec).
	Servers  []ServerSpec
	Engine   sim.Config
	Geometry sim.Geometry
	// Model is the served model name requests carry.
	Model string
	// RTT is the client's round trip to the fleet: a request reaches the router RTT/2
	// after it is sent, and tokens reach the client RTT/2 after the server made them.
	RTT time.Duration
	// EventLag delays each KV event batch from the step that produced it to the index.
	EventLag time.Duration
	// ScrapeInterval is how often the router's view of the servers' metrics is refreshed;
	// 0 reads them at every decision.
	ScrapeInterval time.Duration
	// Replicas is the number of router replicas; request i goes to replica i mod Replicas.
	// Each sees every KV event but only its own in-flight requests.
	Replicas int
	// Sync is how replicas exchange state (routers with a Sync only).
	Sync SyncConfig
	// Churn is a schedule of servers leaving and joining.
	Churn []ChurnEvent
	// MaxHold bounds how long a request may be held at the router when its policy asks
	// (scoring.Decision.Hold), in all; 0 routes every request at its first answer.
	MaxHold time.Duration
	// EventEncoding is the msgpack layout the engines publish.
	EventEncoding kvevents.Encoding
	// Tokenizer tokenizes the router's view of each completions request (each prefix once
	// per run, each tail per request); nil uses the workload's ids.
	Tokenizer Tokenizer
	// Prompts, when set, computes each chat request's token ids from its HTTP body as
	// the router does (parse, render the chat template, tokenize). Chat needs it.
	Prompts RequestTokenizer
	// Policies builds the routers.
	Policies PolicyFactory
	// RouteLog, when set, receives every routing decision and first token (nil: none).
	RouteLog *RouteLog
}

// DefaultMaxHold is the router's bound on holding one request (SimConfig.MaxHold):
// kvrouter's limits.max_hold default. The simulated decision takes no time, so the bound
// is the holds' sum, as extproc measures it when parsing and tokenizing cost nothing.
const DefaultMaxHold = extproc.DefaultMaxHold

// DefaultSimConfig is the reference fleet as the simulator's calibration against the
// reference baseline has it (sim.DefaultReference): six workers with 1 GiB of KV cache
// each for Qwen3-0.6B, two on the fast GPU and four on the slower ones, and its client
// round trip; plus 5 ms of KV event delivery lag and a 50 ms metrics scrape interval.
func DefaultSimConfig() SimConfig {
	ref := sim.DefaultReference()
	servers := make([]ServerSpec, len(ref.Servers))
	for i, s := range ref.Servers {
		servers[i] = ServerSpec{KVBytes: 1 << 30, Speed: s.Speed}
	}
	return SimConfig{
		Servers:        servers,
		Engine:         sim.DefaultConfig(),
		Geometry:       sim.Qwen3_0_6B,
		Model:          "Qwen/Qwen3-0.6B",
		RTT:            time.Duration(ref.RTT * float64(time.Second)),
		EventLag:       5 * time.Millisecond,
		ScrapeInterval: 50 * time.Millisecond,
		Replicas:       1,
		MaxHold:        DefaultMaxHold,
		EventEncoding:  kvevents.EncodingMap,
	}
}

// Validate reports the first invalid field.
func (c *SimConfig) Validate() error {
	if len(c.Servers) == 0 {
		return errors.New("kvbench: sim mode needs at least one server")
	}
	for i, s := range c.Servers {
		if s.KVBytes <= 0 || s.Speed <= 0 {
			return fmt.Errorf("kvbench: server %d: KV bytes and speed must be positive", i)
		}
		if c.Geometry.NumBlocks(s.KVBytes, c.Engine.BlockSize) < 2 {
			return fmt.Errorf("kvbench: server %d: %d KV bytes hold fewer than 2 blocks", i, s.KVBytes)
		}
	}
	if c.RTT < 0 || c.EventLag < 0 || c.ScrapeInterval < 0 || c.MaxHold < 0 {
		return errors.New("kvbench: rtt, event lag, scrape interval and max hold must not be negative")
	}
	if c.Replicas < 1 {
		return fmt.Errorf("kvbench: replicas must be at least 1, got %d", c.Replicas)
	}
	if c.Sync.Interval < 0 || c.Sync.Delay < 0 {
		return errors.New("kvbench: sync interval and delay must not be negative")
	}
	for _, ev := range c.Churn {
		if ev.Server < 0 || ev.Server >= len(c.Servers) || ev.At < 0 {
			return fmt.Errorf("kvbench: churn event %+v: no such server or negative time", ev)
		}
	}
	if c.Policies == nil {
		return errors.New("kvbench: sim mode needs a policy factory")
	}
	return nil
}

// Address returns the address of simulated server i, as policies and reports see it.
func (c *SimConfig) Address(i int) string { return "127.0.1." + strconv.Itoa(i+1) + ":8000" }

// simRun is the state of one simulated run; everything happens inside fleet.Run on one
// goroutine.
type simRun struct {
	ctx     context.Context
	cfg     *SimConfig
	w       *Workload
	f       *sim.Fleet
	engines []*sim.Engine
	addrs   []string
	routers []Router
	obs     []scoring.Observer
	// inflight[replica][server] counts requests the replica routed and has not seen finish.
	inflight [][]int
	metrics  []scoring.Metrics
	up       []bool
	leaving  []bool
	busy     []bool
	kicked   []bool
	prefix   map[int][]uint32
	results  []Result
	err      error
	pending  int
	// syncMessages counts snapshots published (Sync), syncBytes the bytes delivered.
	syncMessages, syncBytes int
	// policy, rep and concurrency name the run in cfg.RouteLog.
	policy           string
	rep, concurrency int
}

// RunSim runs one repetition of one cell in the simulated fleet: the workload's warmup
// requests with a closed loop of concurrency clients, a drain, then the measured requests
// the same way. rep varies the policies' seeds.
func RunSim(ctx context.Context, cfg SimConfig, w *Workload, policy string, concurrency, rep int) (RunOutput, error) {
	if err := cfg.Validate(); err != nil {
		return RunOutput{}, err
	}
	if w.Config().API == APIChat && cfg.Prompts == nil {
		return RunOutput{}, errors.New("kvbench: chat in sim mode needs the chat template: the model's tokenizer_config.json (--tokenizer)")
	}
	if concurrency < 1 {
		return RunOutput{}, fmt.Errorf("kvbench: concurrency must be at least 1, got %d", concurrency)
	}
	r, blocks, err := newSimRun(ctx, &cfg, policy, rep, nil)
	if err != nil {
		return RunOutput{}, err
	}
	r.w = w
	r.concurrency = concurrency
	r.pending = len(w.Requests())
	r.scrape()
	reqs := w.Requests()
	r.results = make([]Result, len(reqs))
	warm := w.Config().Warmup
	var before []sim.Stats
	measured := func() {
		before = r.stats()
		r.closedLoop(ctx, reqs[warm:], concurrency, nil)
	}
	if warm > 0 {
		r.closedLoop(ctx, reqs[:warm], concurrency, measured)
	} else {
		measured()
	}
	r.f.Run()
	if r.err != nil {
		return RunOutput{}, r.err
	}
	if err := ctx.Err(); err != nil {
		return RunOutput{}, fmt.Errorf("kvbench: run interrupted: %w", err)
	}
	after := r.stats()
	var hits, queries int64
	for i := range after {
		hits += after[i].PrefixCacheHits - before[i].PrefixCacheHits
		queries += after[i].PrefixCacheQueries - before[i].PrefixCacheQueries
	}
	out := RunOutput{Results: r.results, Blocks: blocks, BlockSize: cfg.Engine.BlockSize,
		SyncMessages: r.syncMessages, SyncBytes: r.syncBytes}
	if queries > 0 {
		rate := float64(hits) / float64(queries)
		out.EngineHitRate = &rate
	}
	return out, nil
}

// newSimRun builds one run's fleet and routers from cfg (validated by the caller); vocab,
// when set, is the engines' output vocabulary. It schedules the churn events.
func newSimRun(ctx context.Context, cfg *SimConfig, policy string, rep int, vocab []uint32) (*simRun, []int, error) {
	engCfgs := make([]sim.Config, len(cfg.Servers))
	blocks := make([]int, len(cfg.Servers))
	for i, s := range cfg.Servers {
		c := cfg.Engine
		c.NumGPUBlocks = cfg.Geometry.NumBlocks(s.KVBytes, c.BlockSize)
		c.Speed = s.Speed
		c.EnableEvents = true
		c.HashSeed = uint64(i + 1) // unseeded vLLM: every engine hashes differently
		c.Vocabulary = vocab
		engCfgs[i] = c
		blocks[i] = c.NumGPUBlocks
	}
	f, err := sim.NewFleet(engCfgs, sim.FleetOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("kvbench: %w", err)
	}
	r := &simRun{ctx: ctx, cfg: cfg, f: f, prefix: map[int][]uint32{}, policy: policy, rep: rep}
	n := len(cfg.Servers)
	for i := 0; i < n; i++ {
		r.engines = append(r.engines, f.Engine(i))
		r.addrs = append(r.addrs, cfg.Address(i))
	}
	r.metrics = make([]scoring.Metrics, n)
	r.up = make([]bool, n)
	r.leaving = make([]bool, n)
	r.busy = make([]bool, n)
	r.kicked = make([]bool, n)
	for i := range r.up {
		r.up[i] = true
	}
	for k := 0; k < cfg.Replicas; k++ {
		rt, err := cfg.Policies(PolicyEnv{
			Policy: policy, Seed: uint64(rep)<<16 | uint64(k), Replica: k,
			Endpoints: r.addrs, NumGPUBlocks: blocks, BlockSize: cfg.Engine.BlockSize, Model: cfg.Model,
			Now: func() time.Time { return time.Unix(0, 0).Add(secs(f.Now())) },
		})
		if err != nil {
			return nil, nil, fmt.Errorf("kvbench: policy %q: %w", policy, err)
		}
		r.routers = append(r.routers, rt)
		o, _ := rt.Policy.(scoring.Observer)
		r.obs = append(r.obs, o)
		r.inflight = append(r.inflight, make([]int, n))
	}
	for _, ev := range cfg.Churn {
		ev := ev
		f.After(ev.At.Seconds(), func() { r.churn(ev) })
	}
	if cfg.Replicas > 1 && cfg.Sync.Interval > 0 {
		f.After(0, r.sync)
	}
	return r, blocks, nil
}

// sync has every replica publish its state if due, delivers it to the others
// Sync.Delay later, and schedules the next round while requests remain.
func (r *simRun) sync() {
	for k, rt := range r.routers {
		if rt.Sync == nil {
			continue
		}
		b := rt.Sync.Publish()
		if b == nil {
			continue
		}
		r.syncMessages++
		for j, to := range r.routers {
			if j == k || to.Sync == nil {
				continue
			}
			r.syncBytes += len(b)
			r.f.After(r.cfg.Sync.Delay.Seconds(), func() {
				if err := to.Sync.Receive(b); err != nil {
					r.setErr(fmt.Errorf("kvbench: replica %d's state: %w", k, err))
				}
			})
		}
	}
	r.f.After(r.cfg.Sync.Interval.Seconds(), func() {
		if r.pending > 0 && r.err == nil && r.ctx.Err() == nil {
			r.sync()
		}
	})
}

func (r *simRun) stats() []sim.Stats {
	out := make([]sim.Stats, len(r.engines))
	for i, e := range r.engines {
		out[i] = e.Stats()
	}
	return out
}

// closedLoop sends reqs with concurrency clients; then runs once all have finished.
func (r *simRun) closedLoop(ctx context.Context, reqs []Request, concurrency int, then func()) {
	next, left := 0, len(reqs)
	var send func()
	send = func() {
		if next >= len(reqs) {
			return
		}
		req := &reqs[next]
		next++
		if ctx.Err() != nil || r.err != nil {
			// Stop sending; account for the rest so the fleet drains and Run returns.
			r.pending -= len(reqs) - next + 1
			next = len(reqs)
			return
		}
		sent := r.f.Now()
		r.f.After(r.cfg.RTT.Seconds()/2, func() {
			r.dispatch(req, sent, func() {
				r.pending--
				left--
				last := left == 0 // only the request that ends the phase starts the next
				r.f.After(r.cfg.RTT.Seconds()/2, func() {
					send()
					if last && then != nil {
						then()
					}
				})
			})
		})
	}
	for range min(concurrency, len(reqs)) {
		send()
	}
}

// dispatch routes one request at the router and submits it to the chosen server; done runs
// when its response has ended at the server.
func (r *simRun) dispatch(req *Request, sent float64, done func()) {
	rtt2 := r.cfg.RTT.Seconds() / 2
	res := &r.results[req.Seq]
	*res = Result{Seq: req.Seq, Prefix: req.Prefix, Warmup: req.Warmup, Start: secs(sent)}
	fail := func(err error) {
		res.Err = err.Error()
		res.End = secs(r.f.Now() + rtt2)
		done()
	}
	ids, err := r.tokens(req)
	if err != nil {
		fail(err)
		return
	}
	replica := req.Seq % len(r.routers)
	sreq := &scoring.Request{ID: "req-" + strconv.Itoa(req.Seq), Model: r.cfg.Model, BaseModel: r.cfg.Model, TokenIDs: ids}
	r.pick(simJob{sreq: sreq, replica: replica, res: res, output: r.w.Config().OutputTokens, fail: fail, done: done})
}

// simJob is one request on its way through the router to a server: output is its
// max_tokens, onToken (optional) receives each generated token.
type simJob struct {
	sreq    *scoring.Request
	replica int
	res     *Result
	output  int
	onToken func(uint32)
	fail    func(error)
	done    func()
}

// pick asks the replica's policy for sreq's endpoint and submits it there; a hold the
// policy asks for (within MaxHold) waits on the virtual clock and picks again.
func (r *simRun) pick(j simJob) {
	sreq, replica, res, fail, done := j.sreq, j.replica, j.res, j.fail, j.done
	sreq.MaxTokens = j.output // the body's max_tokens, as the router parses it in URL mode
	rt := r.routers[replica]
	cands := r.candidates(replica)
	if len(cands) == 0 {
		fail(errors.New("no server is up"))
		return
	}
	t0 := time.Now()
	d, err := rt.Policy.Pick(sreq, cands)
	res.Decision += max(time.Since(t0), 1)
	if err != nil {
		fail(fmt.Errorf("policy: %w", err))
		return
	}
	if d.Hold > 0 && sreq.Held+d.Hold <= r.cfg.MaxHold {
		sreq.Held += d.Hold
		r.f.After(d.Hold.Seconds(), func() { r.pick(j) })
		return
	}
	ids := sreq.TokenIDs
	rtt2 := r.cfg.RTT.Seconds() / 2
	sent := res.Start.Seconds()
	server := -1
	for i, a := range r.addrs {
		if a == d.Endpoint {
			server = i
		}
	}
	if server < 0 || !r.up[server] {
		fail(fmt.Errorf("policy chose %q, not a candidate", d.Endpoint))
		return
	}
	res.Server = d.Endpoint
	r.logRoute(res, server, replica, sreq.Held, d.Kind, ids)
	obs := r.obs[replica]
	if obs != nil {
		obs.Routed(sreq, d.Endpoint)
	}
	r.inflight[replica][server]++
	finished := false
	cb := sim.Callbacks{
		Token: j.onToken,
		FirstToken: func(uint32, int) {
			res.TTFT = secs(r.f.Now() + rtt2 - sent)
			if r.cfg.RouteLog != nil {
				r.cfg.RouteLog.write(&RouteEvent{Policy: r.policy, Rep: r.rep, Concurrency: r.concurrency,
					Event: "first_token", T: r.f.Now(), Seq: res.Seq, Server: server, Replica: replica, Prefix: res.Prefix,
					Warmup: res.Warmup, TTFTMS: float64(res.TTFT) / float64(time.Millisecond)})
			}
			if obs != nil {
				obs.FirstToken(sreq.ID)
			}
		},
		Finish: func(o sim.Result) {
			if finished {
				return
			}
			finished = true
			r.inflight[replica][server]--
			if obs != nil {
				obs.Finished(sreq.ID)
			}
			res.End = secs(r.f.Now() + rtt2)
			res.PromptTokens, res.CachedTokens, res.OutputTokens = o.PromptTokens, o.CachedTokens, o.OutputTokens
			if r.cfg.RouteLog != nil {
				r.cfg.RouteLog.write(&RouteEvent{Policy: r.policy, Rep: r.rep, Concurrency: r.concurrency,
					Event: "finish", T: r.f.Now(), Seq: res.Seq, Server: server, Replica: replica, Prefix: res.Prefix,
					Warmup: res.Warmup, PromptTokens: o.PromptTokens, CachedTokens: o.CachedTokens})
			}
			if o.Reason == "abort" || o.Reason == "error" {
				res.Err = "server ended the request: " + o.Reason
			}
			r.maybeReset(server)
			done()
		},
	}
	if err := r.engines[server].AddRequest(sreq.ID, ids, j.output, cb); err != nil {
		var re *sim.RequestError
		res.Rejected = errors.As(err, &re)
		r.inflight[replica][server]--
		if obs != nil {
			obs.Finished(sreq.ID)
		}
		fail(err)
		return
	}
	r.kick(server)
}

// logRoute writes the routing of res (prompt ids) to server by a decision of kind to
// cfg.RouteLog, with every server's state.
func (r *simRun) logRoute(res *Result, server, replica int, held time.Duration, kind string, ids []uint32) {
	if r.cfg.RouteLog == nil {
		return
	}
	views := make([]ServerView, len(r.engines))
	for i, e := range r.engines {
		st := e.Stats()
		views[i] = ServerView{InFlight: r.inflight[replica][i], Running: st.Running, Waiting: st.Waiting,
			KVUsage: st.KVCacheUsage, ScrapedWaiting: r.metrics[i].Waiting, CachedBlocks: e.CachedBlocks(ids)}
	}
	r.cfg.RouteLog.write(&RouteEvent{Policy: r.policy, Rep: r.rep, Concurrency: r.concurrency,
		Event: "route", T: r.f.Now(), Seq: res.Seq, Server: server, Replica: replica, Prefix: res.Prefix,
		Warmup: res.Warmup, HeldMS: float64(held) / float64(time.Millisecond), Servers: views, Kind: kind})
}

// tokens is the router's tokenization: for chat, the whole body through the chat
// template; for completions, each prefix's text once per run and the tail per request.
func (r *simRun) tokens(req *Request) ([]uint32, error) {
	if r.w.Config().API == APIChat {
		return r.cfg.Prompts.PromptTokens(r.w.Path(), r.w.Body(req, r.cfg.Model, true))
	}
	tok := r.cfg.Tokenizer
	if tok == nil {
		return r.w.TokenIDs(req), nil
	}
	p, ok := r.prefix[req.Prefix]
	if !ok {
		var err error
		if p, err = tok.Encode(r.w.PrefixText(req.Prefix)); err != nil {
			return nil, fmt.Errorf("tokenizing prefix: %w", err)
		}
		r.prefix[req.Prefix] = p
	}
	tail, err := tok.Encode(req.Tail)
	if err != nil {
		return nil, fmt.Errorf("tokenizing tail: %w", err)
	}
	ids := make([]uint32, 0, len(p)+len(tail))
	return append(append(ids, p...), tail...), nil
}

// candidates are the servers that are up, with the replica's own in-flight counts and the
// last scraped metrics.
func (r *simRun) candidates(replica int) []scoring.Endpoint {
	if r.cfg.ScrapeInterval == 0 {
		r.scrapeNow()
	}
	out := make([]scoring.Endpoint, 0, len(r.addrs))
	for i, a := range r.addrs {
		if r.up[i] {
			out = append(out, scoring.Endpoint{Address: a, InFlight: r.inflight[replica][i], Metrics: r.metrics[i]})
		}
	}
	return out
}

// scrape refreshes the router's metrics and schedules the next refresh while requests
// remain.
func (r *simRun) scrape() {
	r.scrapeNow()
	if r.cfg.ScrapeInterval > 0 {
		r.f.After(r.cfg.ScrapeInterval.Seconds(), func() {
			if r.pending > 0 && r.err == nil && r.ctx.Err() == nil {
				r.scrape()
			}
		})
	}
}

func (r *simRun) scrapeNow() {
	for i, e := range r.engines {
		s := e.Stats()
		r.metrics[i] = scoring.Metrics{Valid: true, Running: s.Running, Waiting: s.Waiting,
			KVCacheUsage: s.KVCacheUsage, NumGPUBlocks: s.NumGPUBlocks, BlockSize: s.BlockSize,
			FinishedRequests: float64(s.FinishedRequests), OutputTokens: float64(s.FinishedOutputTokens),
			At: time.Unix(0, 0).Add(secs(r.f.Now()))}
	}
}

// kick starts server i's next step once every action due now has run.
func (r *simRun) kick(i int) {
	if r.busy[i] || r.kicked[i] {
		return
	}
	r.kicked[i] = true
	r.f.After(0, func() {
		r.kicked[i] = false
		r.step(i)
	})
}

func (r *simRun) step(i int) {
	if r.busy[i] {
		return
	}
	d, ok := r.engines[i].Begin()
	if !ok {
		return
	}
	r.busy[i] = true
	r.f.After(d, func() {
		r.busy[i] = false
		res := r.engines[i].Complete()
		r.publish(i, res.Events)
		r.step(i)
	})
}

// publish encodes a step's events as the engine would put them on the wire, and decodes
// them into every replica's index EventLag later.
func (r *simRun) publish(i int, events []kvevents.Event) {
	if len(events) == 0 {
		return
	}
	payload := kvevents.Encode(&kvevents.Batch{TS: r.f.Now(), Events: events, HasDPRank: true}, r.cfg.EventEncoding)
	r.f.After(r.cfg.EventLag.Seconds(), func() {
		var b kvevents.Batch
		if err := kvevents.Decode(payload, &b); err != nil {
			r.setErr(fmt.Errorf("kvbench: decoding server %d's events: %w", i, err))
			return
		}
		for _, rt := range r.routers {
			if rt.Events == nil {
				continue
			}
			if err := rt.Events.Apply(r.addrs[i], &b); err != nil {
				r.setErr(fmt.Errorf("kvbench: applying server %d's events: %w", i, err))
				return
			}
		}
	})
}

func (r *simRun) setErr(err error) {
	if r.err == nil {
		r.err = err
	}
}

// forgetter is implemented by policies and indexes that can drop an endpoint that left.
type forgetter interface{ Forget(endpoint string) }

func (r *simRun) churn(ev ChurnEvent) {
	if ev.Leave {
		r.up[ev.Server] = false
		r.leaving[ev.Server] = true
		for _, rt := range r.routers {
			if f, ok := rt.Policy.(forgetter); ok {
				f.Forget(r.addrs[ev.Server])
			}
			if f, ok := rt.Events.(forgetter); ok {
				f.Forget(r.addrs[ev.Server])
			}
		}
		r.maybeReset(ev.Server)
		return
	}
	r.up[ev.Server] = !r.leaving[ev.Server] || r.reset(ev.Server)
}

// maybeReset drops a departed server's cache once its last request has ended.
func (r *simRun) maybeReset(i int) {
	if r.leaving[i] && !r.engines[i].HasWork() {
		r.reset(i)
	}
}

func (r *simRun) reset(i int) bool {
	if !r.engines[i].ResetPrefixCache() {
		return false
	}
	r.leaving[i] = false
	r.publish(i, r.engines[i].TakeEvents())
	return true
}

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// ParseServers parses a per-server spec, servers separated by ";" and each a list of
// key=value among kv (bytes, with an optional KiB, MiB or GiB suffix) and speed, e.g.
// "kv=1GiB,speed=1;kv=512MiB,speed=0.5". Missing keys take def's values.
func ParseServers(spec string, def ServerSpec) ([]ServerSpec, error) {
	var out []ServerSpec
	for i, part := range strings.Split(spec, ";") {
		s := def
		part = strings.TrimSpace(part)
		if part == "" {
			return nil, fmt.Errorf("kvbench: server %d of %q is empty", i, spec)
		}
		for _, kv := range strings.Split(part, ",") {
			k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
			if !ok {
				return nil, fmt.Errorf("kvbench: server %d: %q is not key=value", i, kv)
			}
			switch k {
			case "kv":
				b, err := ParseBytes(v)
				if err != nil {
					return nil, fmt.Errorf("kvbench: server %d: %w", i, err)
				}
				s.KVBytes = b
			case "speed":
				f, err := strconv.ParseFloat(v, 64)
				if err != nil || f <= 0 {
					return nil, fmt.Errorf("kvbench: server %d: speed %q must be a positive number", i, v)
				}
				s.Speed = f
			default:
				return nil, fmt.Errorf("kvbench: server %d: unknown key %q (want kv or speed)", i, k)
			}
		}
		out = append(out, s)
	}
	return out, nil
}

// ParseBytes parses a byte count with an optional KiB, MiB, GiB (or K, M, G) suffix.
func ParseBytes(s string) (int64, error) {
	s = strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}} {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSuffix(s, u.suffix), u.mult
			break
		}
	}
	n, err := strconv.ParseFloat(s, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("kvbench: byte size %q must be a positive number with an optional KiB/MiB/GiB suffix", s)
	}
	return int64(n * float64(mult)), nil
}

// ParseChurn parses a churn schedule: events separated by ",", each "TIME:-SERVER"
// (leave) or "TIME:+SERVER" (join), TIME a Go duration of virtual time, SERVER 0-based,
// e.g. "20s:-2,40s:+2".
func ParseChurn(s string) ([]ChurnEvent, error) {
	var out []ChurnEvent
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	for _, part := range strings.Split(s, ",") {
		at, who, ok := strings.Cut(strings.TrimSpace(part), ":")
		if !ok || len(who) < 2 || (who[0] != '-' && who[0] != '+') {
			return nil, fmt.Errorf("kvbench: churn event %q: want TIME:-SERVER or TIME:+SERVER", part)
		}
		d, err := time.ParseDuration(at)
		if err != nil || d < 0 {
			return nil, fmt.Errorf("kvbench: churn event %q: bad time", part)
		}
		n, err := strconv.Atoi(who[1:])
		if err != nil || n < 0 {
			return nil, fmt.Errorf("kvbench: churn event %q: bad server", part)
		}
		out = append(out, ChurnEvent{At: d, Server: n, Leave: who[0] == '-'})
	}
	return out, nil
}
