package app

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvrouter/kvrouter/chattemplate"
	"github.com/kvrouter/kvrouter/config"
	"github.com/kvrouter/kvrouter/extproc"
	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/index"
	"github.com/kvrouter/kvrouter/index/kvsink"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/prompt"
	"github.com/kvrouter/kvrouter/scoring"
	"github.com/kvrouter/kvrouter/tokenizer"
)

// kvPath is the KV-cache side of the router: the block index, the KV-event subscriber
// that feeds it through kvsink, and the view of which endpoints' events are healthy.
type kvPath struct {
	log    *zap.Logger
	ix     *index.Index
	sink   *kvsink.Sink
	sub    *kvevents.Subscriber
	health *eventHealth
	fleet  *fleet.Fleet
	scrape time.Duration

	models atomic.Pointer[map[string]string] // endpoint address -> base model rooting its blocks

	// Owned by the goroutine running follow.
	subscribed map[string]fleet.KVEventsConfig
	capacity   map[string]int

	queueMu sync.Mutex
	queue   []fleet.Change
	wake    chan struct{}

	// forget is told of endpoints that left the fleet (the policy's per-endpoint state).
	forget func(addr string)

	eventsSkipped prometheus.Counter
}

func newKVPath(cfg *config.Config, f *fleet.Fleet, log *zap.Logger, reg prometheus.Registerer, now func() time.Time) (*kvPath, error) {
	ix, err := index.New(cfg.KV.Index, reg)
	if err != nil {
		return nil, fmt.Errorf("app: %w", err)
	}
	k := &kvPath{log: log, ix: ix, fleet: f, scrape: cfg.Limits.Scrape.Interval,
		subscribed: map[string]fleet.KVEventsConfig{}, capacity: map[string]int{}, wake: make(chan struct{}, 1)}
	empty := map[string]string{}
	k.models.Store(&empty)
	k.sink, err = kvsink.New(ix, k.modelOf, kvsink.DefaultConfig(), reg)
	if err != nil {
		return nil, fmt.Errorf("app: %w", err)
	}
	var clock kvevents.Clock
	if now != nil {
		clock = funcClock(now)
	}
	k.sub, err = kvevents.NewSubscriber(cfg.Subscriber(), k.sink, log, reg, clock)
	if err != nil {
		return nil, fmt.Errorf("app: %w", err)
	}
	// A KV-event connection that ends is the first sign of a pod killed (milliseconds,
	// where scrapes take up to FailuresBeforeIneligible intervals): a passive signal.
	k.sub.OnConnectionLost(func(addr string) { f.ReportFailure(addr, fleet.SignalEvents) })
	k.health = newEventHealth(k.sub, f, cfg.KV.HealthRefresh, cfg.KV.EventsStaleAfter, now)
	k.eventsSkipped = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvrouter_kv_events_unusable_endpoints_total",
		Help: "Endpoints whose kv_events could not be subscribed (rank addresses not on consecutive ports, or refused by the subscriber); they are scored by the approximate prediction.",
	})
	if reg != nil {
		reg.MustRegister(k.eventsSkipped)
	}
	return k, nil
}

type funcClock func() time.Time

func (f funcClock) Now() time.Time { return f() }

// modelOf names the base model an endpoint's blocks are rooted in: its first served
// model, as requests for it resolve (fleet.Candidates). An endpoint serving several
// base models under different names is keyed by the first (per-pod mode; in central
// mode each batch names its model in its topic, and that name is used).
func (k *kvPath) modelOf(addr string) string { return (*k.models.Load())[addr] }

func (k *kvPath) setModel(addr string, models []string) {
	old := *k.models.Load()
	m := make(map[string]string, len(old)+1)
	for a, v := range old {
		m[a] = v
	}
	if len(models) == 0 {
		delete(m, addr)
	} else {
		m[addr] = models[0]
	}
	k.models.Store(&m)
}

// onChange is the fleet subscription: it queues the change for follow (the fleet calls it
// with its lock held, so it must not block on the subscriber).
func (k *kvPath) onChange(c fleet.Change) {
	if c.Kind == fleet.StateChanged {
		return
	}
	k.queueMu.Lock()
	k.queue = append(k.queue, c)
	k.queueMu.Unlock()
	select {
	case k.wake <- struct{}{}:
	default:
	}
}

// run subscribes to the fleet's endpoints' events, follows fleet changes, and keeps the
// index's per-endpoint capacity at the scraped num_gpu_blocks, until ctx ends.
func (k *kvPath) run(ctx context.Context) error {
	unsubscribe := k.fleet.Subscribe(k.onChange)
	defer unsubscribe()
	for _, st := range k.fleet.Status() {
		k.apply(fleet.Change{Kind: fleet.Added, Address: st.Config.Address, Endpoint: st.Config})
	}
	errc := make(chan error, 1)
	go func() { errc <- k.sub.Run(ctx) }()

	tick := time.NewTicker(max(k.scrape, 100*time.Millisecond))
	defer tick.Stop()
	k.updateCapacity()
	for {
		select {
		case <-ctx.Done():
			return <-errc
		case err := <-errc:
			return err
		case <-k.wake:
			k.queueMu.Lock()
			q := k.queue
			k.queue = nil
			k.queueMu.Unlock()
			for _, c := range q {
				k.apply(c)
			}
		case <-tick.C:
			k.updateCapacity()
		}
	}
}

// apply follows one fleet change: Added subscribes, Removed unsubscribes and purges the
// endpoint from the index, Updated resubscribes when the events configuration changed.
func (k *kvPath) apply(c fleet.Change) {
	addr := c.Address
	switch c.Kind {
	case fleet.Added, fleet.Updated:
		k.setModel(addr, c.Endpoint.Models)
		ev := c.Endpoint.KVEvents
		if old, ok := k.subscribed[addr]; ok {
			if equalEvents(old, ev) {
				return
			}
			k.unsubscribe(addr)
		}
		if len(ev.Endpoints) == 0 && len(ev.CentralRanks) == 0 {
			return
		}
		if err := config.CheckRankPorts(ev); err != nil {
			k.eventsSkipped.Inc()
			k.log.Warn("kv events not subscribed: scored by prediction", zap.String("endpoint", addr), zap.Error(err))
			return
		}
		var ec kvevents.EndpointConfig
		if len(ev.CentralRanks) > 0 {
			// The pod's publishers connect to the bound socket; its topics name addr.
			ec = kvevents.EndpointConfig{Name: addr, Central: true, FirstRank: ev.CentralRanks[0], DPRanks: len(ev.CentralRanks)}
		} else {
			ec = kvevents.EndpointConfig{Name: addr, Address: ev.Endpoints[0], DPRanks: len(ev.Endpoints), Topic: ev.Topic}
		}
		if len(ev.ReplayEndpoints) > 0 {
			ec.ReplayAddress = ev.ReplayEndpoints[0]
		}
		if err := k.sub.Add(ec); err != nil {
			k.eventsSkipped.Inc()
			k.log.Warn("kv events not subscribed: scored by prediction", zap.String("endpoint", addr), zap.Error(err))
			return
		}
		k.subscribed[addr] = ev
		k.health.invalidate()
	case fleet.Removed:
		k.unsubscribe(addr)
		k.ix.Purge(addr)
		delete(k.capacity, addr)
		k.setModel(addr, nil)
		if k.forget != nil {
			k.forget(addr)
		}
	}
}

func (k *kvPath) unsubscribe(addr string) {
	if _, ok := k.subscribed[addr]; !ok {
		return
	}
	delete(k.subscribed, addr)
	if err := k.sub.Remove(addr); err != nil {
		k.log.Warn("kv events unsubscribe", zap.String("endpoint", addr), zap.Error(err))
	}
	k.health.invalidate()
}

func equalEvents(a, b fleet.KVEventsConfig) bool {
	return a.Topic == b.Topic && slices.Equal(a.Endpoints, b.Endpoints) && slices.Equal(a.ReplayEndpoints, b.ReplayEndpoints) &&
		slices.Equal(a.CentralRanks, b.CentralRanks)
}

// updateCapacity sets the index's bound of each endpoint from its scraped num_gpu_blocks.
func (k *kvPath) updateCapacity() {
	for _, st := range k.fleet.Status() {
		n := st.Metrics.NumGPUBlocks
		if n > 0 && k.capacity[st.Config.Address] != n {
			k.capacity[st.Config.Address] = n
			k.ix.SetCapacity(st.Config.Address, n)
		}
	}
}

var _ scoring.EventHealthSnapshot = (*eventHealth)(nil)

// eventHealth is the kv policy's view of which endpoints' KV events can be trusted: an
// endpoint is healthy when it is subscribed, every one of its rank streams is connected,
// and no stream has been silent for staleAfter while the endpoint was busy (requests in
// flight from this router, or running by its scraped metrics). The last rule catches a
// publisher that is connected but says nothing (its process alive, its event path stuck;
// a lost connection already shows as not connected): a busy vLLM stores blocks every few
// steps, an idle one legitimately says nothing. The view is
// rebuilt from the subscriber's and the fleet's status at most once per refresh period,
// so the routing path reads a map and never waits on either.
type eventHealth struct {
	sub        *kvevents.Subscriber
	fleet      *fleet.Fleet
	refresh    time.Duration
	staleAfter time.Duration
	now        func() time.Time

	mu        sync.Mutex // one rebuild at a time; guards quietFrom
	quietFrom map[string]time.Time
	view      atomic.Pointer[healthView]
}

type healthView struct {
	at      time.Time
	healthy map[string]bool
}

func newEventHealth(sub *kvevents.Subscriber, f *fleet.Fleet, refresh, staleAfter time.Duration, now func() time.Time) *eventHealth {
	if now == nil {
		now = time.Now
	}
	return &eventHealth{sub: sub, fleet: f, refresh: refresh, staleAfter: staleAfter, now: now, quietFrom: map[string]time.Time{}}
}

// EventsHealthy implements scoring.EventHealth.
func (h *eventHealth) EventsHealthy(endpoint string) bool { return h.current().healthy[endpoint] }

// EventsHealthyAll implements scoring.EventHealthSnapshot: one view (and one clock read)
// for all of a pick's candidates.
func (h *eventHealth) EventsHealthyAll(candidates []scoring.Endpoint, healthy []bool) {
	v := h.current()
	for i := range candidates {
		healthy[i] = v.healthy[candidates[i].Address]
	}
}

// current returns the view, rebuilt first when older than the refresh period.
func (h *eventHealth) current() *healthView {
	v := h.view.Load()
	if v == nil || h.now().Sub(v.at) >= h.refresh {
		switch {
		case h.mu.TryLock():
			v = h.rebuild()
			h.mu.Unlock()
		case v == nil:
			h.mu.Lock()
			if v = h.view.Load(); v == nil {
				v = h.rebuild()
			}
			h.mu.Unlock()
		}
		// Otherwise another caller is rebuilding: the previous view will do.
	}
	return v
}

func (h *eventHealth) invalidate() { h.view.Store(nil) }

// rebuild reads the subscriber's and the fleet's status; h.mu is held.
func (h *eventHealth) rebuild() *healthView {
	now := h.now()
	busy := map[string]bool{}
	for _, st := range h.fleet.Status() {
		busy[st.Config.Address] = st.InFlight > 0 || (st.Metrics.Valid && st.Metrics.Running > 0)
	}
	m := map[string]bool{}
	quiet := map[string]time.Time{}
	for _, st := range h.sub.Status() {
		key := st.Endpoint + "\x00" + strconv.Itoa(st.Rank)
		healthy := st.Connected
		if busy[st.Endpoint] {
			// Quiet since it was first seen busy, or since its last batch if later; an
			// endpoint that was idle until now is not held to its old silence.
			since, wasBusy := h.quietFrom[key]
			if !wasBusy {
				since = now
			}
			if st.LastBatchAt.After(since) {
				since = st.LastBatchAt
			}
			quiet[key] = since
			healthy = healthy && now.Sub(since) < h.staleAfter
		}
		ok, seen := m[st.Endpoint]
		m[st.Endpoint] = healthy && (ok || !seen)
	}
	h.quietFrom = quiet
	v := &healthView{at: now, healthy: m}
	h.view.Store(v)
	return v
}

// newTokenizer loads every configured model's tokenizer and chat template through the
// prompt registry. A model whose tokenizer cannot be reproduced exactly (an unsupported
// tokenizer kind, or two tokenizer files not named as in a model directory) is logged
// once here, marked 0 in kvrouter_model_tokenizer_ready, and its requests are routed by
// load (the registry returns the error, which the ext_proc server counts).
func newTokenizer(cfg *config.Config, log *zap.Logger, reg prometheus.Registerer, now func() time.Time) (extproc.Tokenizer, error) {
	ready := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kvrouter_model_tokenizer_ready",
		Help: "1 when the model's prompts are tokenized for KV-aware routing, 0 when its requests are routed by load.",
	}, []string{"model"})
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvrouter_chat_template_refusals_total",
		Help: "Chat templates kvrouter's Jinja engine refuses (a construct it does not implement), counted when the model loads; their chat requests are routed by load.",
	}, []string{"model"})
	metrics, err := prompt.NewMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("app: %w", err)
	}
	if reg != nil {
		reg.MustRegister(ready, refused)
	}
	pc := prompt.Config{PrefixCacheBytes: cfg.Tokenizer.PrefixCacheBytes, MessageCacheBytes: cfg.Tokenizer.MessageCacheBytes}
	for _, name := range sortedNames(cfg.Models) {
		m := cfg.Models[name]
		dir := m.Tokenizer
		if dir == "" {
			d := filepath.Dir(m.TokenizerJSON)
			if filepath.Base(m.TokenizerJSON) != "tokenizer.json" || filepath.Base(m.TokenizerConfig) != "tokenizer_config.json" ||
				filepath.Dir(m.TokenizerConfig) != d {
				ready.WithLabelValues(name).Set(0)
				log.Warn("model routed by load: tokenizer_json and tokenizer_config must be tokenizer.json and tokenizer_config.json in one directory",
					zap.String("model", name))
				continue
			}
			dir = d
		}
		pc.Models = append(pc.Models, prompt.ModelConfig{Name: name, Dir: dir, DefaultChatTemplateKwargs: m.DefaultChatTemplateKwargs})
	}
	r, err := prompt.NewRegistry(pc, prompt.RegistryOptions{Metrics: metrics, TokenizerMetrics: tokenizer.NewMetrics(reg), TemplateMetrics: chattemplate.NewMetrics(reg), Now: now})
	if err != nil {
		return nil, fmt.Errorf("app: %w", err)
	}
	for _, m := range pc.Models {
		b, err := r.Load(m.Name)
		var unsupported *prompt.UnsupportedError
		switch {
		case errors.As(err, &unsupported):
			ready.WithLabelValues(m.Name).Set(0)
			log.Warn("model routed by load: its tokenizer is not supported", zap.String("model", m.Name), zap.Error(err))
		case err != nil:
			return nil, fmt.Errorf("app: %w", err)
		default:
			ready.WithLabelValues(m.Name).Set(1)
			fields := []zap.Field{zap.String("model", m.Name), zap.String("dir", m.Dir)}
			if r := b.ChatTemplateRefusal(); r != nil {
				refused.WithLabelValues(m.Name).Inc()
				fields = append(fields, zap.String("chat_template_refused", r.Error()))
				log.Warn("model's chat requests routed by load: its chat template uses a construct kvrouter's Jinja engine does not implement", fields...)
				continue
			}
			log.Info("model tokenized for KV-aware routing", fields...)
		}
	}
	served := map[string]bool{}
	for _, ep := range cfg.Endpoints {
		for _, m := range ep.Models {
			if _, ok := cfg.Models[m]; !ok && !served[m] {
				served[m] = true
				log.Warn("model routed by load: no tokenizer configured under models", zap.String("model", m))
			}
		}
	}
	return r, nil
}

func sortedNames[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
