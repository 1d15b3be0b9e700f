package fleet

import (
	"go.uber.org/zap"
)

// Passive signals: what the router sees of an endpoint failing without probing it,
// named in ReportFailure and in kvrouter_fleet_passive_signals_total.
const (
	// SignalEvents: the endpoint's KV-event connection, which was up, ended (EOF,
	// reset, or the watchdog). A pod killed is seen this way within milliseconds.
	SignalEvents = "kv_events"
	// SignalUpstream: the proxy could not get a response from the endpoint (a connect
	// failure or a reset before the response headers: Envoy's local-reply 503, or a
	// fallback served a request routed to it).
	SignalUpstream = "upstream"
	// SignalScrape: a scrape of the endpoint's metrics could not connect.
	SignalScrape = "scrape"
)

// Results of a passive signal, in kvrouter_fleet_passive_signals_total.
const (
	passiveEjected  = "ejected"   // the endpoint became suspect
	passiveKeptLast = "kept_last" // it is the last eligible endpoint for one of its models
	passiveIgnored  = "ignored"   // unknown, already out, or without a metrics URL to probe
)

// ReportFailure tells the fleet of a passive signal that the endpoint at addr failed.
// A healthy endpoint becomes StateSuspect at once, and so stops being a candidate,
// unless it is the only eligible endpoint serving one of its models: passive signals
// alone never empty a model's candidates, which a router-wide cause (a proxy restart, a
// network blip on the router's side) would otherwise do to every endpoint. The
// endpoint comes back with the first scrape that starts after the signal and succeeds.
// Endpoints without a metrics URL have no probe to bring them back and are not
// ejected. Safe for concurrent use; cheap enough for the request path (no allocation
// unless the state changes).
func (f *Fleet) ReportFailure(addr, signal string) {
	ep := f.table.Load().byAddr[addr]
	if ep == nil || State(ep.state.Load()) != StateHealthy || ep.cfg.Load().MetricsURL == "" {
		f.countPassive(signal, passiveIgnored)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.table.Load()
	if t.byAddr[addr] != ep || State(ep.state.Load()) != StateHealthy {
		f.countPassive(signal, passiveIgnored)
		return
	}
	if lastFor(t, ep) {
		f.countPassive(signal, passiveKeptLast)
		return
	}
	ep.suspectAt.Store(f.now().UnixNano())
	ep.state.Store(int32(StateSuspect))
	f.countPassive(signal, passiveEjected)
	f.log.Warn("endpoint ineligible: passive failure signal", zap.String("endpoint", addr), zap.String("signal", signal))
	f.notify(Change{Kind: StateChanged, Address: addr, Endpoint: *ep.cfg.Load(), State: StateSuspect, Ready: !ep.unready.Load()})
}

// UpstreamFailed is ReportFailure(addr, SignalUpstream), for the ext_proc server.
func (f *Fleet) UpstreamFailed(addr string) { f.ReportFailure(addr, SignalUpstream) }

// lastFor reports whether ep is the only eligible endpoint serving one of its models
// or adapters (all endpoints when it serves none).
func lastFor(t *table, ep *endpoint) bool {
	cfg := ep.cfg.Load()
	others := func(list []*endpoint) bool {
		for _, o := range list {
			if o != ep && o.eligible() {
				return true
			}
		}
		return false
	}
	if len(cfg.Models) == 0 && len(cfg.LoRAAdapters) == 0 {
		return !others(t.all)
	}
	for _, m := range cfg.Models {
		if !others(t.byModel[m]) {
			return true
		}
	}
	for _, a := range cfg.LoRAAdapters {
		if !others(t.adapters[a.Name].eps) {
			return true
		}
	}
	return false
}

func (f *Fleet) countPassive(signal, result string) {
	if f.metrics != nil {
		f.metrics.passive.WithLabelValues(signal, result).Inc()
	}
}
