package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"k8s.io/utils/clock"

	"github.com/kvrouter/kvrouter/config"
	"github.com/kvrouter/kvrouter/extproc"
	"github.com/kvrouter/kvrouter/fleet"
)

// DefaultConfigCheckInterval is how often Run looks at the configuration file: one stat
// call, small beside the minute a ConfigMap update takes to reach a pod's files.
const DefaultConfigCheckInterval = 5 * time.Second

// Reload results, the result label of kvrouter_config_reloads_total.
const (
	// ReloadApplied: the file was valid and some setting that changes live changed.
	ReloadApplied = "applied"
	// ReloadUnchanged: the file was valid and no setting that changes live changed (the
	// ones needing a restart are reported, see ReloadReport.Restart).
	ReloadUnchanged = "unchanged"
	// ReloadInvalid: the file failed the checks of `kvrouter check-config`, or a policy
	// could not be built from it; the configuration in force stays.
	ReloadInvalid = "invalid"
)

// ReloadReport says what a reload did.
type ReloadReport struct {
	// Result is one of ReloadApplied, ReloadUnchanged, ReloadInvalid.
	Result string
	// Applied names the settings that changed and are now in force (YAML paths).
	Applied []string
	// Restart names the settings that differ from those running but take effect only
	// when the process restarts (listen addresses, the index, discovery, models...).
	Restart []string
}

// reloader is the state of configuration reloads.
type reloader struct {
	path     string
	interval time.Duration
	clock    clock.WithTicker

	mu    sync.Mutex // one reload at a time; guards stamp
	stamp os.FileInfo

	total   *prometheus.CounterVec
	restart prometheus.Gauge
}

func newReloader(o Options, reg prometheus.Registerer) *reloader {
	r := &reloader{path: o.ConfigPath, interval: o.ConfigCheckInterval, clock: o.Clock}
	if r.interval == 0 {
		r.interval = DefaultConfigCheckInterval
	}
	if r.clock == nil {
		r.clock = clock.RealClock{}
	}
	if r.path != "" {
		r.stamp, _ = os.Stat(r.path)
	}
	r.total = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvrouter_config_reloads_total",
		Help: "Configuration reloads (SIGHUP or a change of the file), by result: applied, unchanged or invalid (the configuration in force stays).",
	}, []string{"result"})
	r.restart = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kvrouter_config_restart_required",
		Help: "Settings in the configuration file, as last reloaded, that differ from those running and take effect only after a restart.",
	})
	for _, res := range []string{ReloadApplied, ReloadUnchanged, ReloadInvalid} {
		r.total.WithLabelValues(res)
	}
	reg.MustRegister(r.total, r.restart)
	return r
}

// sameFile says whether two stats are one version of a file: the same file (a ConfigMap
// update swaps a symlink to new files) with the same modification time and size.
func sameFile(a, b os.FileInfo) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return os.SameFile(a, b) && a.ModTime().Equal(b.ModTime()) && a.Size() == b.Size()
}

// watchConfig reloads the configuration whenever its file changes, until ctx ends. It
// polls the file's stat on the injected clock rather than using inotify: a ConfigMap
// update replaces the ..data symlink of the mounted directory, which a watch on the
// file itself never sees, and polling needs no new dependency and is deterministic in
// tests (tlscert checks the certificate files the same way).
func (a *App) watchConfig(ctx context.Context) {
	t := a.reload.clock.NewTicker(a.reload.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			fi, err := os.Stat(a.reload.path)
			if err != nil {
				continue // being replaced, or gone: the configuration in force stays
			}
			a.reload.mu.Lock()
			changed := !sameFile(a.reload.stamp, fi)
			a.reload.mu.Unlock()
			if changed {
				a.log.Info("configuration file changed: reloading", zap.String("file", a.reload.path))
				_, _ = a.Reload()
			}
		}
	}
}

// Reload reads the configuration file again (Options.ConfigPath) and puts in force what
// can change while serving: the static endpoints, the policy and its sections
// (policy.kv, policy.placement), the fallback, limits.max_hold, limits.max_fallbacks,
// limits.shed_queue_depth, limits.drain_timeout, the objectives map and model_rewrites.
// TLS certificate files are reloaded by the TLS source itself when they change. A file
// that fails `kvrouter check-config` is logged with check-config's messages and changes
// nothing. Settings that need a restart are logged and listed in the report. Requests
// already routed finish against the policy that routed them. Safe to call at any time,
// from any goroutine; reloads run one at a time.
func (a *App) Reload() (ReloadReport, error) {
	r := a.reload
	if r.path == "" {
		return ReloadReport{}, errors.New("app: reload: no configuration file (Options.ConfigPath)")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stamp, _ = os.Stat(r.path)
	rep, err := a.reloadLocked()
	r.total.WithLabelValues(rep.Result).Inc()
	if err != nil {
		a.log.Error("configuration reload rejected: the configuration in force stays",
			zap.String("file", r.path), zap.Strings("problems", strings.Split(err.Error(), "\n")))
		return rep, err
	}
	r.restart.Set(float64(len(rep.Restart)))
	if len(rep.Restart) > 0 {
		a.log.Warn("configuration reload: these settings changed but take effect only after a restart",
			zap.String("file", r.path), zap.Strings("settings", rep.Restart))
	}
	a.log.Info("configuration reloaded", zap.String("file", r.path), zap.String("result", rep.Result), zap.Strings("applied", rep.Applied))
	return rep, nil
}

func (a *App) reloadLocked() (ReloadReport, error) {
	rep := ReloadReport{Result: ReloadInvalid}
	next, err := loadChecked(a.reload.path, io.Discard)
	if err != nil {
		return rep, err
	}
	run := a.live.Load()
	rep.Restart = restartNeeded(run, next)

	applied := *run // restart-only settings stay as they run
	applied.Endpoints = next.Endpoints
	if a.replica != nil {
		// The peer replica shares the running policy's state: a new policy instance
		// would leave it reading the old one.
		rep.Restart = append(rep.Restart, diffFields("policy", run.Policy, next.Policy)...)
	} else {
		applied.Policy = next.Policy
	}
	applied.Limits.MaxHold = next.Limits.MaxHold
	applied.Limits.DrainTimeout = next.Limits.DrainTimeout
	applied.Limits.ShedQueueDepth = next.Limits.ShedQueueDepth
	applied.Limits.MaxFallbacks = next.Limits.MaxFallbacks
	if !reflect.DeepEqual(run.Endpoints, next.Endpoints) {
		rep.Applied = append(rep.Applied, "endpoints")
	}
	// The running pool's InferenceObjectives and InferenceModelRewrites stand for the
	// file's objectives and model_rewrites until a restart leaves inference_pool mode (the
	// file's discovery change is listed already).
	inPool := run.Discovery.Kubernetes != nil && run.Discovery.Kubernetes.InferencePool != ""
	poolOwned := func(name string, changed bool, apply func()) {
		switch {
		case !changed:
		case inPool:
			rep.Restart = append(rep.Restart, name)
		default:
			apply()
			rep.Applied = append(rep.Applied, name)
		}
	}
	poolOwned("objectives", !maps.Equal(run.Objectives, next.Objectives), func() { applied.Objectives = next.Objectives })
	poolOwned("model_rewrites", !reflect.DeepEqual(run.ModelRewrites, next.ModelRewrites), func() { applied.ModelRewrites = next.ModelRewrites })
	rep.Applied = append(rep.Applied, diffFields("policy", run.Policy, applied.Policy)...)
	rep.Applied = append(rep.Applied, diffFields("limits", run.Limits, applied.Limits)...)
	if len(rep.Applied) == 0 {
		rep.Result = ReloadUnchanged
		return rep, nil
	}

	pols := a.pols.Load()
	if !reflect.DeepEqual(run.Policy, applied.Policy) {
		// Policies are built with their own random source: the old ones may still be
		// serving requests decided before the swap.
		if pols, err = a.buildPolicies(applied.Policy, nil, a.policyReg); err != nil {
			return rep, err
		}
	}
	rewrites, err := a.rewrites(&applied)
	if err != nil {
		return rep, err
	}
	a.applyEndpoints(run.Endpoints, next.Endpoints)
	a.extproc.SetRouting(extproc.Routing{Policy: pols.policy, Fallback: pols.fallback, MaxHold: applied.Limits.MaxHold,
		MaxFallbacks: applied.Limits.MaxFallbacks, ShedWaiting: applied.Limits.ShedQueueDepth, Objectives: a.objectives(&applied),
		Rewrites: rewrites})
	a.pols.Store(pols)
	a.live.Store(&applied)
	rep.Result = ReloadApplied
	return rep, nil
}

// applyEndpoints makes the fleet's static endpoints next's: those gone are removed, new
// or changed ones upserted (discovery's endpoints are not touched).
func (a *App) applyEndpoints(old, next []fleet.EndpointConfig) {
	keep := map[string]fleet.EndpointConfig{}
	for _, ep := range next {
		keep[ep.Address] = ep
	}
	for _, ep := range old {
		if _, ok := keep[ep.Address]; !ok {
			a.fleet.Remove(ep.Address)
		}
	}
	was := map[string]fleet.EndpointConfig{}
	for _, ep := range old {
		was[ep.Address] = ep
	}
	for _, ep := range next {
		if prev, ok := was[ep.Address]; ok && reflect.DeepEqual(prev, ep) {
			continue
		}
		if err := a.fleet.Upsert(ep); err != nil {
			a.log.Error("configuration reload: endpoint not applied", zap.String("endpoint", ep.Address), zap.Error(err))
		}
	}
}

// restartNeeded names the settings of next that differ from run and that only a restart
// puts in force.
func restartNeeded(run, next *config.Config) []string {
	var out []string
	out = append(out, diffFields("listen", run.Listen, next.Listen)...)
	if !reflect.DeepEqual(run.Models, next.Models) {
		out = append(out, "models")
	}
	out = append(out, diffFields("kv", run.KV, next.KV)...)
	out = append(out, diffFields("discovery", run.Discovery, next.Discovery)...)
	out = append(out, diffFields("replicas", run.Replicas, next.Replicas)...)
	l := next.Limits
	l.MaxHold, l.DrainTimeout, l.ShedQueueDepth, l.MaxFallbacks = run.Limits.MaxHold, run.Limits.DrainTimeout, run.Limits.ShedQueueDepth,
		run.Limits.MaxFallbacks
	out = append(out, diffFields("limits", run.Limits, l)...)
	return out
}

// diffFields names the fields (by YAML path under prefix) where the structs a and b
// differ; inline fields are looked into, other fields compared whole.
func diffFields(prefix string, a, b any) []string {
	var out []string
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	if va.Kind() != reflect.Struct {
		if !reflect.DeepEqual(a, b) {
			out = append(out, prefix)
		}
		return out
	}
	t := va.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		fa, fb := va.Field(i).Interface(), vb.Field(i).Interface()
		switch {
		case name == "-":
		case slices.Contains(strings.Split(opts, ","), "inline") || (name == "" && f.Anonymous):
			out = append(out, diffFields(prefix, fa, fb)...)
		case !reflect.DeepEqual(fa, fb):
			if name == "" {
				name = strings.ToLower(f.Name)
			}
			out = append(out, prefix+"."+name)
		}
	}
	return out
}

// replacingRegisterer registers collectors on a registry, replacing an equal collector
// registered before: a policy rebuilt by a reload takes over its predecessor's metric
// names (its counters start from 0, which Prometheus' rate() reads as a reset).
type replacingRegisterer struct{ reg prometheus.Registerer }

func (r replacingRegisterer) Register(c prometheus.Collector) error {
	err := r.reg.Register(c)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		r.reg.Unregister(are.ExistingCollector)
		err = r.reg.Register(c)
	}
	if err != nil {
		return fmt.Errorf("app: %w", err)
	}
	return nil
}

func (r replacingRegisterer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

func (r replacingRegisterer) Unregister(c prometheus.Collector) bool { return r.reg.Unregister(c) }
