package fleet

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvrouter/kvrouter/scoring"
)

// State is an endpoint's health as the fleet sees it.
type State int32

const (
	// StatePending: the endpoint has a metrics URL and no scrape has succeeded yet. Not
	// eligible.
	StatePending State = iota
	// StateHealthy: the last scrape succeeded, or fewer than FailuresBeforeIneligible
	// have failed since. Eligible.
	StateHealthy
	// StateUnhealthy: FailuresBeforeIneligible scrapes in a row failed. Not eligible
	// until a scrape succeeds.
	StateUnhealthy
	// StateUnscraped: the endpoint has no metrics URL. Always eligible.
	StateUnscraped
	// StateSuspect: a passive signal (ReportFailure: its KV-event connection ended, the
	// proxy could not reach it, a scrape was refused) took the endpoint out before
	// scrapes would have. Not eligible until a scrape that started after the signal
	// succeeds.
	StateSuspect
)

var stateNames = [...]string{"pending", "healthy", "unhealthy", "unscraped", "suspect"}

// String returns the state's metric label: pending, healthy, unhealthy, unscraped or
// suspect.
func (s State) String() string {
	if s >= 0 && int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("State(%d)", int32(s))
}

// Eligible reports whether an endpoint in this state may receive requests.
func (s State) Eligible() bool { return s == StateHealthy || s == StateUnscraped }

// ChangeKind says what happened to an endpoint.
type ChangeKind int

const (
	// Added: a new endpoint.
	Added ChangeKind = iota
	// Updated: an endpoint's configuration changed (models, adapters, URLs).
	Updated
	// Removed: the endpoint is gone; its KV state should be forgotten.
	Removed
	// StateChanged: the endpoint's State changed (and maybe its eligibility).
	StateChanged
)

// String returns the kind's metric label: added, updated, removed or state_changed.
func (k ChangeKind) String() string {
	switch k {
	case Added:
		return "added"
	case Updated:
		return "updated"
	case Removed:
		return "removed"
	case StateChanged:
		return "state_changed"
	}
	return fmt.Sprintf("ChangeKind(%d)", int(k))
}

// Change tells subscribers about one endpoint.
type Change struct {
	Kind ChangeKind
	// Address identifies the endpoint.
	Address string
	// Endpoint is the endpoint's configuration (the last one, for Removed).
	Endpoint EndpointConfig
	// State is the endpoint's state after the change.
	State State
	// Ready is false while discovery holds the endpoint out of routing (SetReady); such
	// an endpoint keeps its KV state but receives no requests.
	Ready bool
}

// Options are the fleet's collaborators; every field may be left zero.
type Options struct {
	// Logger logs state changes (never per request). Nil: no logs.
	Logger *zap.Logger
	// Registerer receives the fleet's metrics. Nil: metrics are not exported.
	Registerer prometheus.Registerer
	// Now is the clock used for metric ages and staleness. Nil: time.Now.
	Now func() time.Time
	// Client performs scrapes. Nil: a client with no overall timeout (each scrape is
	// bounded by ScrapeConfig.Timeout).
	Client *http.Client
	// ScrapeConcurrency bounds the scrapes in flight at once in ScrapeAll. Zero: 16.
	ScrapeConcurrency int
	// PoolName is the name label of the Inference Extension's inference_pool_* series
	// the fleet exports (the InferencePool the endpoints come from). Empty: DefaultPoolName.
	PoolName string
}

// DefaultPoolName names the pool in the inference_pool_* series when no InferencePool
// gives the endpoints: the fleet is the one pool this router picks from.
const DefaultPoolName = "kvrouter"

// Fleet is the endpoint registry. See the package documentation for its concurrency
// guarantees.
type Fleet struct {
	scrape  ScrapeConfig
	log     *zap.Logger
	now     func() time.Time
	client  *http.Client
	conc    int
	metrics *metrics

	mu    sync.Mutex // serializes Upsert, Remove and the notification of changes
	table atomic.Pointer[table]
	subs  atomic.Pointer[[]*subscriber]
}

type subscriber struct{ fn func(Change) }

// endpoint is one registry entry. Its identity (address) never changes; an Upsert with a
// new configuration swaps cfg and keeps the counters.
type endpoint struct {
	addr     string
	cfg      atomic.Pointer[EndpointConfig]
	inFlight atomic.Int64
	state    atomic.Int32
	unready  atomic.Bool // set by SetReady(addr, false): held out of routing
	failures atomic.Int32
	// suspectAt is when a passive signal made the endpoint suspect (UnixNano on the
	// fleet's clock): only a scrape started after it may clear it.
	suspectAt atomic.Int64
	last      atomic.Pointer[sample]
	scraping  sync.Mutex // one scrape of this endpoint at a time
}

// eligible reports whether the endpoint may receive requests now.
func (ep *endpoint) eligible() bool {
	return State(ep.state.Load()).Eligible() && !ep.unready.Load()
}

type sample struct {
	m  scoring.Metrics
	at time.Time
}

// table is an immutable routing snapshot, rebuilt on every Upsert and Remove.
type table struct {
	all      []*endpoint // by address
	byAddr   map[string]*endpoint
	byModel  map[string][]*endpoint
	adapters map[string]adapterRoute
}

type adapterRoute struct {
	base string
	eps  []*endpoint
}

// New builds a fleet holding cfg's static endpoints; it starts nothing (Run scrapes).
func New(cfg Config, o Options) (*Fleet, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("fleet: invalid configuration: %w", err)
	}
	f := &Fleet{
		scrape: cfg.Scrape,
		log:    o.Logger,
		now:    o.Now,
		client: o.Client,
		conc:   o.ScrapeConcurrency,
	}
	if f.log == nil {
		f.log = zap.NewNop()
	}
	if f.now == nil {
		f.now = time.Now
	}
	if f.client == nil {
		f.client = &http.Client{}
	}
	if f.conc <= 0 {
		f.conc = 16
	}
	f.table.Store(buildTable(nil))
	f.subs.Store(&[]*subscriber{})
	for _, ep := range cfg.Endpoints {
		if err := f.Upsert(ep); err != nil {
			return nil, err
		}
	}
	pool := o.PoolName
	if pool == "" {
		pool = DefaultPoolName
	}
	f.metrics = newMetrics(f, o.Registerer, pool)
	return f, nil
}

func buildTable(eps []*endpoint) *table {
	t := &table{
		all:      eps,
		byAddr:   make(map[string]*endpoint, len(eps)),
		byModel:  map[string][]*endpoint{},
		adapters: map[string]adapterRoute{},
	}
	for _, ep := range eps {
		t.byAddr[ep.addr] = ep
		cfg := ep.cfg.Load()
		for _, m := range cfg.Models {
			t.byModel[m] = append(t.byModel[m], ep)
		}
		for _, a := range cfg.LoRAAdapters {
			r := t.adapters[a.Name]
			r.base = a.BaseModel
			r.eps = append(r.eps, ep)
			t.adapters[a.Name] = r
		}
	}
	return t
}

// ErrConflict is returned (wrapped) by Upsert when the endpoint disagrees with the
// others: a LoRA adapter tied to another base model elsewhere, or named like a model.
var ErrConflict = errors.New("fleet: endpoint conflicts with the fleet")

// Upsert adds the endpoint, or replaces the configuration of the endpoint with the same
// address (keeping its in-flight count, last metrics and health). Subscribers hear Added
// or Updated; an identical configuration changes nothing.
func (f *Fleet) Upsert(cfg EndpointConfig) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("fleet: endpoint %q: %w", cfg.Address, err)
	}
	cfg = cloneConfig(cfg)
	f.mu.Lock()
	defer f.mu.Unlock()
	old := f.table.Load()
	if err := conflicts(old, &cfg); err != nil {
		return err
	}
	kind := Added
	eps := slices.Clone(old.all)
	ep, exists := old.byAddr[cfg.Address]
	if exists {
		if equalConfig(ep.cfg.Load(), &cfg) {
			return nil
		}
		kind = Updated
		prevURL := ep.cfg.Load().MetricsURL
		ep.cfg.Store(&cfg)
		if (prevURL == "") != (cfg.MetricsURL == "") {
			f.resetState(ep, &cfg)
		}
	} else {
		ep = &endpoint{addr: cfg.Address}
		ep.cfg.Store(&cfg)
		f.resetState(ep, &cfg)
		i, _ := slices.BinarySearchFunc(eps, cfg.Address, func(e *endpoint, a string) int { return strings.Compare(e.addr, a) })
		eps = slices.Insert(eps, i, ep)
	}
	f.table.Store(buildTable(eps))
	f.notify(Change{Kind: kind, Address: cfg.Address, Endpoint: cfg, State: State(ep.state.Load()), Ready: !ep.unready.Load()})
	if f.metrics != nil {
		f.metrics.changes.WithLabelValues(kind.String()).Inc()
	}
	f.log.Info("endpoint "+kind.String(), zap.String("endpoint", cfg.Address), zap.Strings("models", cfg.Models))
	return nil
}

func (f *Fleet) resetState(ep *endpoint, cfg *EndpointConfig) {
	ep.failures.Store(0)
	ep.last.Store(nil)
	if cfg.MetricsURL == "" {
		ep.state.Store(int32(StateUnscraped))
	} else {
		ep.state.Store(int32(StatePending))
	}
}

func conflicts(t *table, cfg *EndpointConfig) error {
	for _, a := range cfg.LoRAAdapters {
		if r, ok := t.adapters[a.Name]; ok && r.base != a.BaseModel {
			for _, ep := range r.eps {
				if ep.addr != cfg.Address {
					return fmt.Errorf("%w: adapter %q has base model %q on %s, not %q", ErrConflict, a.Name, r.base, ep.addr, a.BaseModel)
				}
			}
		}
		for _, ep := range t.byModel[a.Name] {
			if ep.addr != cfg.Address {
				return fmt.Errorf("%w: adapter %q is a model served by %s", ErrConflict, a.Name, ep.addr)
			}
		}
	}
	for _, m := range cfg.Models {
		for _, ep := range t.adapters[m].eps {
			if ep.addr != cfg.Address {
				return fmt.Errorf("%w: model %q is a LoRA adapter on %s", ErrConflict, m, ep.addr)
			}
		}
	}
	return nil
}

func cloneConfig(c EndpointConfig) EndpointConfig {
	c.Models = slices.Clone(c.Models)
	c.LoRAAdapters = slices.Clone(c.LoRAAdapters)
	c.KVEvents.Endpoints = slices.Clone(c.KVEvents.Endpoints)
	c.KVEvents.ReplayEndpoints = slices.Clone(c.KVEvents.ReplayEndpoints)
	c.KVEvents.CentralRanks = slices.Clone(c.KVEvents.CentralRanks)
	return c
}

func equalConfig(a, b *EndpointConfig) bool {
	return a.Address == b.Address && slices.Equal(a.Models, b.Models) &&
		slices.Equal(a.LoRAAdapters, b.LoRAAdapters) && a.MetricsURL == b.MetricsURL &&
		slices.Equal(a.KVEvents.Endpoints, b.KVEvents.Endpoints) && a.KVEvents.Topic == b.KVEvents.Topic &&
		slices.Equal(a.KVEvents.ReplayEndpoints, b.KVEvents.ReplayEndpoints) &&
		slices.Equal(a.KVEvents.CentralRanks, b.KVEvents.CentralRanks)
}

// Remove deletes the endpoint with this address and tells subscribers; it reports
// whether the endpoint existed. Requests already routed to it finish normally.
func (f *Fleet) Remove(addr string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	old := f.table.Load()
	ep, ok := old.byAddr[addr]
	if !ok {
		return false
	}
	eps := slices.DeleteFunc(slices.Clone(old.all), func(e *endpoint) bool { return e == ep })
	f.table.Store(buildTable(eps))
	if f.metrics != nil {
		f.metrics.forget(addr)
		f.metrics.changes.WithLabelValues(Removed.String()).Inc()
	}
	f.notify(Change{Kind: Removed, Address: addr, Endpoint: *ep.cfg.Load(), State: State(ep.state.Load()), Ready: !ep.unready.Load()})
	f.log.Info("endpoint removed", zap.String("endpoint", addr))
	return true
}

// SetReady holds the endpoint at addr out of routing (ready false) or lets it back in
// (ready true), for discovery: a Kubernetes pod that turns unready stops receiving
// requests at once while the endpoint, and so its KV state, stays registered. The
// endpoint is eligible only when it is ready and its State is eligible. Subscribers hear
// StateChanged when readiness changes. It reports whether the endpoint exists.
func (f *Fleet) SetReady(addr string, ready bool) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	ep, ok := f.table.Load().byAddr[addr]
	if !ok {
		return false
	}
	if ep.unready.Swap(!ready) == !ready {
		return true
	}
	f.notify(Change{Kind: StateChanged, Address: addr, Endpoint: *ep.cfg.Load(), State: State(ep.state.Load()), Ready: ready})
	f.log.Info("endpoint readiness", zap.String("endpoint", addr), zap.Bool("ready", ready))
	return true
}

// Subscribe registers fn to hear of every later change, in order. fn runs in the
// goroutine making the change, with the registry's write lock held: it must return
// quickly and must not call Upsert, Remove or Subscribe. The returned function
// unsubscribes.
func (f *Fleet) Subscribe(fn func(Change)) (unsubscribe func()) {
	s := &subscriber{fn: fn}
	f.mu.Lock()
	defer f.mu.Unlock()
	subs := append(slices.Clone(*f.subs.Load()), s)
	f.subs.Store(&subs)
	return func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		subs := slices.DeleteFunc(slices.Clone(*f.subs.Load()), func(x *subscriber) bool { return x == s })
		f.subs.Store(&subs)
	}
}

// notify runs with f.mu held.
func (f *Fleet) notify(c Change) {
	for _, s := range *f.subs.Load() {
		s.fn(c)
	}
}

// Serves reports whether some endpoint serves model (a base model or a LoRA adapter),
// eligible now or not: Candidates' ok without building the candidates (one atomic load
// and a map look-up), for the ext_proc server's model rewrites.
func (f *Fleet) Serves(model string) bool {
	_, _, _, ok := f.table.Load().resolve(model)
	return ok
}

// Candidates returns the eligible endpoints serving model, ordered by address, with the
// base model and LoRA adapter the name resolves to. For an adapter name, base is its base
// model and lora the adapter; for a base model, lora is empty. ok is false when no
// endpoint serves model: eps then holds every eligible endpoint (so the caller can still
// route by load) and base and lora are empty. Model "" means any model: every eligible
// endpoint, ok true. The slice is the caller's.
func (f *Fleet) Candidates(model string) (eps []scoring.Endpoint, base, lora string, ok bool) {
	t := f.table.Load()
	list, base, lora, ok := t.resolve(model)
	return f.appendEligible(make([]scoring.Endpoint, 0, len(list)), list), base, lora, ok
}

// AppendCandidates is Candidates writing into dst[:0] (grown when too small), so that a
// caller on the hot path can reuse one buffer instead of allocating a slice per request.
// The endpoints come from the registry's current snapshot: one atomic load, then one
// atomic read per endpoint for its state, in-flight count and last metrics; no lock.
func (f *Fleet) AppendCandidates(dst []scoring.Endpoint, model string) (eps []scoring.Endpoint, base, lora string, ok bool) {
	list, base, lora, ok := f.table.Load().resolve(model)
	return f.appendEligible(dst[:0], list), base, lora, ok
}

func (t *table) resolve(model string) (list []*endpoint, base, lora string, ok bool) {
	switch {
	case model == "":
		return t.all, "", "", true
	case t.byModel[model] != nil:
		return t.byModel[model], model, "", true
	case t.adapters[model].eps != nil:
		r := t.adapters[model]
		return r.eps, r.base, model, true
	}
	return t.all, "", "", false
}

func (f *Fleet) appendEligible(out []scoring.Endpoint, list []*endpoint) []scoring.Endpoint {
	now := f.now()
	for _, ep := range list {
		if !ep.eligible() {
			continue
		}
		out = append(out, scoring.Endpoint{
			Address:  ep.addr,
			InFlight: int(ep.inFlight.Load()),
			Metrics:  f.fresh(ep, now),
		})
	}
	return out
}

// fresh returns the endpoint's last metrics, Valid only when within the staleness limit.
func (f *Fleet) fresh(ep *endpoint, now time.Time) scoring.Metrics {
	s := ep.last.Load()
	if s == nil {
		return scoring.Metrics{}
	}
	m := s.m
	m.At = s.at
	if age := now.Sub(s.at); age > f.scrape.StalenessLimit || age < -f.scrape.StalenessLimit {
		m.Valid = false
	}
	return m
}

// Begin counts one more request routed to addr; unknown addresses are ignored.
func (f *Fleet) Begin(addr string) {
	if ep := f.table.Load().byAddr[addr]; ep != nil {
		ep.inFlight.Add(1)
	}
}

// End counts one request to addr as finished; the count never goes below zero, and
// unknown addresses (an endpoint removed meanwhile) are ignored.
func (f *Fleet) End(addr string) {
	ep := f.table.Load().byAddr[addr]
	if ep == nil {
		return
	}
	for {
		n := ep.inFlight.Load()
		if n <= 0 || ep.inFlight.CompareAndSwap(n, n-1) {
			return
		}
	}
}

// Ready reports whether at least one endpoint is eligible.
func (f *Fleet) Ready() bool {
	for _, ep := range f.table.Load().all {
		if ep.eligible() {
			return true
		}
	}
	return false
}

// EndpointStatus is a point-in-time view of one endpoint, for debugging and tests.
type EndpointStatus struct {
	Config EndpointConfig
	State  State
	// Ready is false while discovery holds the endpoint out of routing (SetReady).
	Ready    bool
	InFlight int
	// Failures counts the scrapes that failed since the last good one.
	Failures int
	// SuspectSince is when a passive signal made the endpoint StateSuspect; zero when
	// it is not suspect.
	SuspectSince time.Time
	// Metrics are the last scraped figures (Valid false once stale or never scraped).
	Metrics scoring.Metrics
	// ScrapedAt is when the last good scrape ended; zero if none.
	ScrapedAt time.Time
}

// Status returns every endpoint, ordered by address.
func (f *Fleet) Status() []EndpointStatus {
	t := f.table.Load()
	now := f.now()
	out := make([]EndpointStatus, 0, len(t.all))
	for _, ep := range t.all {
		st := EndpointStatus{
			Config:   cloneConfig(*ep.cfg.Load()),
			State:    State(ep.state.Load()),
			Ready:    !ep.unready.Load(),
			InFlight: int(ep.inFlight.Load()),
			Failures: int(ep.failures.Load()),
			Metrics:  f.fresh(ep, now),
		}
		if s := ep.last.Load(); s != nil {
			st.ScrapedAt = s.at
		}
		if st.State == StateSuspect {
			st.SuspectSince = time.Unix(0, ep.suspectAt.Load())
		}
		out = append(out, st)
	}
	return out
}
