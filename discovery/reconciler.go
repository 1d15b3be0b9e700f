package discovery

import (
	"errors"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/kvrouter/kvrouter/fleet"
)

// Registry is what discovery changes: the fleet.
type Registry interface {
	Upsert(fleet.EndpointConfig) error
	Remove(addr string) bool
	SetReady(addr string, ready bool) bool
}

// Reconciler turns the complete set of targets a source sees, again and again, into
// fleet changes:
//   - a new ready target is added (Upsert); a new unready one is ignored until ready;
//   - a target that turns unready is held out of routing at once (SetReady false) and
//     removed when it stays unready for UnreadyGrace (Remove, which purges its KV state);
//   - a target back to ready within the grace is let back in with its KV state;
//   - a target that disappears, or whose address changes, is removed at once (the new
//     address is a new endpoint); with MissingIsUnready (dns) a target that disappears
//     is treated as unready instead.
//
// A Reconciler is not safe for concurrent use: the source that owns it calls Apply and
// Expire from one goroutine.
type Reconciler struct {
	source  string
	reg     Registry
	tc      TargetConfig
	ev      KVEventsConfig
	now     func() time.Time
	log     *zap.Logger
	metrics *Metrics
	// missingIsUnready treats a target absent from Apply's set as unready.
	missingIsUnready bool

	known  map[string]*tracked // by target ID
	byAddr map[string]string   // endpoint address -> target ID
	bad    map[string]string   // target ID -> last error logged, to log each error once
}

type tracked struct {
	cfg      fleet.EndpointConfig
	ready    bool
	deadline time.Time // when an unready target is removed
}

// ReconcilerOptions are a Reconciler's collaborators; every field may be left zero.
type ReconcilerOptions struct {
	// Logger logs endpoint changes and bad targets (not per request). Nil: no logs.
	Logger *zap.Logger
	// Metrics counts changes and errors. Nil: not counted.
	Metrics *Metrics
	// Now is the clock. Nil: time.Now.
	Now func() time.Time
	// MissingIsUnready treats a target that leaves the set as unready rather than gone.
	MissingIsUnready bool
}

// NewReconciler builds a reconciler feeding reg; source names it in metrics and logs
// ("kubernetes-service", "dns", ...).
func NewReconciler(source string, reg Registry, tc TargetConfig, ev KVEventsConfig, o ReconcilerOptions) *Reconciler {
	r := &Reconciler{
		source: source, reg: reg, tc: tc, ev: ev, now: o.Now, log: o.Logger, metrics: o.Metrics,
		missingIsUnready: o.MissingIsUnready,
		known:            map[string]*tracked{},
		byAddr:           map[string]string{},
		bad:              map[string]string{},
	}
	if r.now == nil {
		r.now = time.Now
	}
	if r.log == nil {
		r.log = zap.NewNop()
	}
	return r
}

// Apply makes the registry match targets, the complete set the source sees now. A
// target that cannot become an endpoint (bad annotation, no models) is logged, counted
// and handled as unready. Targets with the same ID: the first ready one wins.
func (r *Reconciler) Apply(targets []Target) {
	now := r.now()
	type want struct {
		t   Target
		cfg fleet.EndpointConfig
		ok  bool
	}
	wanted := make(map[string]*want, len(targets))
	for _, t := range targets {
		if w, dup := wanted[t.ID]; dup && (w.t.Ready || !t.Ready) {
			continue
		}
		if !t.IP.IsValid() && !t.Ready {
			wanted[t.ID] = &want{t: t} // a pod without an IP yet, or any more
			continue
		}
		cfg, err := EndpointFor(&r.tc, &r.ev, t)
		if err != nil {
			r.badTarget(t.ID, "target", err)
		} else {
			delete(r.bad, t.ID)
		}
		wanted[t.ID] = &want{t: t, cfg: cfg, ok: err == nil}
	}

	// Removals first, so that an address freed by one target can be taken by another.
	for _, id := range sortedIDs(r.known) {
		k := r.known[id]
		w, present := wanted[id]
		switch {
		case !present && r.missingIsUnready:
			r.unready(id, k, now)
		case !present:
			r.remove(id, k, "removed")
		case w.ok && w.cfg.Address != k.cfg.Address:
			r.remove(id, k, "removed") // changed IP or port: a new endpoint
		}
	}

	ids := make([]string, 0, len(wanted))
	for id := range wanted {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		w := wanted[id]
		k := r.known[id]
		ready := w.t.Ready && w.ok
		if k == nil {
			if ready {
				r.add(id, w.cfg)
			}
			continue
		}
		if w.ok && !equalEndpoint(&k.cfg, &w.cfg) {
			if err := r.reg.Upsert(w.cfg); err != nil {
				r.badTarget(id, "registry", err)
				ready = false
			} else {
				k.cfg = w.cfg
				r.count("updated")
			}
		}
		if ready {
			r.readyAgain(k)
		} else {
			r.unready(id, k, now)
		}
	}
	r.Expire()
}

// Expire removes the targets whose grace ended, and returns when the next grace ends
// (zero when no target is waiting). Sources call it when that time comes.
func (r *Reconciler) Expire() time.Time {
	now := r.now()
	var next time.Time
	for _, id := range sortedIDs(r.known) {
		k := r.known[id]
		if k.ready {
			continue
		}
		if !now.Before(k.deadline) {
			r.remove(id, k, "expired")
			continue
		}
		if next.IsZero() || k.deadline.Before(next) {
			next = k.deadline
		}
	}
	r.gauge()
	return next
}

// Endpoints returns the addresses the reconciler has in the registry, ready or not,
// sorted.
func (r *Reconciler) Endpoints() (ready, unready []string) {
	for _, k := range r.known {
		if k.ready {
			ready = append(ready, k.cfg.Address)
		} else {
			unready = append(unready, k.cfg.Address)
		}
	}
	slices.Sort(ready)
	slices.Sort(unready)
	return ready, unready
}

func (r *Reconciler) add(id string, cfg fleet.EndpointConfig) {
	if other, taken := r.byAddr[cfg.Address]; taken {
		r.badTarget(id, "address_conflict", errors.New("discovery: target "+id+": address "+cfg.Address+" is held by "+other))
		return
	}
	if err := r.reg.Upsert(cfg); err != nil {
		r.badTarget(id, "registry", err)
		return
	}
	// A pod that left and came back at the same address within its grace was never
	// removed; a new endpoint is ready.
	r.reg.SetReady(cfg.Address, true)
	r.known[id] = &tracked{cfg: cfg, ready: true}
	r.byAddr[cfg.Address] = id
	r.count("added")
	r.log.Info("endpoint discovered", zap.String("source", r.source), zap.String("target", id),
		zap.String("endpoint", cfg.Address), zap.Strings("models", cfg.Models))
}

func (r *Reconciler) readyAgain(k *tracked) {
	if k.ready {
		return
	}
	k.ready = true
	k.deadline = time.Time{}
	r.reg.SetReady(k.cfg.Address, true)
	r.count("ready")
	r.log.Info("endpoint ready again", zap.String("source", r.source), zap.String("endpoint", k.cfg.Address))
}

func (r *Reconciler) unready(id string, k *tracked, now time.Time) {
	if !k.ready {
		return
	}
	k.ready = false
	k.deadline = now.Add(r.tc.UnreadyGrace)
	r.reg.SetReady(k.cfg.Address, false)
	r.count("unready")
	r.log.Info("endpoint unready: held out of routing", zap.String("source", r.source), zap.String("target", id),
		zap.String("endpoint", k.cfg.Address), zap.Duration("grace", r.tc.UnreadyGrace))
}

func (r *Reconciler) remove(id string, k *tracked, kind string) {
	r.reg.Remove(k.cfg.Address)
	delete(r.known, id)
	delete(r.byAddr, k.cfg.Address)
	r.count(kind)
	r.log.Info("endpoint "+kind, zap.String("source", r.source), zap.String("target", id), zap.String("endpoint", k.cfg.Address))
}

func (r *Reconciler) badTarget(id, reason string, err error) {
	if r.metrics != nil {
		r.metrics.errors.WithLabelValues(r.source, reason).Inc()
	}
	if r.bad[id] != err.Error() {
		r.bad[id] = err.Error()
		r.log.Warn("target skipped", zap.String("source", r.source), zap.String("target", id), zap.Error(err))
	}
}

func (r *Reconciler) count(kind string) {
	if r.metrics != nil {
		r.metrics.changes.WithLabelValues(r.source, kind).Inc()
	}
}

func (r *Reconciler) gauge() {
	if r.metrics == nil {
		return
	}
	ready, unready := 0, 0
	for _, k := range r.known {
		if k.ready {
			ready++
		} else {
			unready++
		}
	}
	r.metrics.targets.WithLabelValues(r.source, "ready").Set(float64(ready))
	r.metrics.targets.WithLabelValues(r.source, "unready").Set(float64(unready))
}

func sortedIDs(m map[string]*tracked) []string {
	ids := make([]string, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

func equalEndpoint(a, b *fleet.EndpointConfig) bool {
	return a.Address == b.Address && slices.Equal(a.Models, b.Models) &&
		slices.Equal(a.LoRAAdapters, b.LoRAAdapters) && a.MetricsURL == b.MetricsURL &&
		slices.Equal(a.KVEvents.Endpoints, b.KVEvents.Endpoints) && a.KVEvents.Topic == b.KVEvents.Topic &&
		slices.Equal(a.KVEvents.ReplayEndpoints, b.KVEvents.ReplayEndpoints)
}
