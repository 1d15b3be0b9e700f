package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kvrouter/kvrouter/testbench/kvbench"
)

// maxRouters bounds Options.Routers: replicas of one router on one machine.
const maxRouters = 8

// routerName is replica i's process name: "kvrouter" for the first (as with one router),
// "kvrouter 1", "kvrouter 2"... for the others.
func routerName(i int) string {
	if i == 0 {
		return "kvrouter"
	}
	return fmt.Sprintf("kvrouter %d", i)
}

// routerProc is one kvrouter replica of a process stack.
type routerProc struct {
	name              string
	ext               string // ext_proc address
	metricsURL, debug string // http://ip:port
	cfgPath           string
	gossip, advertise string // memberlist bind address and the address peers use ("" unsynced)
}

// routers returns o.Routers as a count (0 means one).
func (o *Options) routers() int { return max(o.Routers, 1) }

// replicasSection is the `replicas:` section of replica self's configuration: the other
// replicas' advertised gossip addresses as a static list (what the chart's headless
// Service resolves to), this replica's name, bind and advertised address; the rest are
// peersync's defaults.
func replicasSection(rs []routerProc, self int) string {
	var peers []string
	for i, r := range rs {
		if i != self {
			peers = append(peers, strconv.Quote(r.advertise))
		}
	}
	return fmt.Sprintf("replicas:\n  name: %q\n  bind: %q\n  advertise: %q\n  peers: [%s]\n",
		gossipName(self), rs[self].gossip, rs[self].advertise, strings.Join(peers, ", "))
}

// startRouters writes each replica's configuration (first's listeners for replica 0, new
// free ports for the others; a replicas section unless o.Unsynced) and starts them. With
// po.peerProxies, each replica's gossip is advertised on a proxy (peerProxy) that
// RunReplicaFaults can cut.
func (s *procStack) startRouters(o *Options, po ProcessOptions, policy string, servers []serverAddrs, first listenAddrs) error {
	n := o.routers()
	// Per replica: gossip bind and proxy ports; then four listeners for each replica after the first.
	ports, err := freePorts(2*n + 4*(n-1))
	if err != nil {
		return err
	}
	addr := func(p int) string { return fmt.Sprintf("127.0.0.1:%d", p) }
	ls := []listenAddrs{first}
	for i := 1; i < n; i++ {
		b := 2*n + 4*(i-1)
		ls = append(ls, listenAddrs{extproc: addr(ports[b]), health: addr(ports[b+1]), metrics: addr(ports[b+2]), debug: addr(ports[b+3])})
	}
	s.routers = nil
	for i := range n {
		r := routerProc{name: routerName(i), ext: ls[i].extproc, metricsURL: "http://" + ls[i].metrics, debug: "http://" + ls[i].debug}
		if n > 1 && !o.Unsynced {
			r.gossip, r.advertise = addr(ports[2*i]), addr(ports[2*i])
			if po.peerProxies {
				r.advertise = addr(ports[2*i+1])
			}
		}
		s.routers = append(s.routers, r)
	}
	for i := range s.routers {
		r := &s.routers[i]
		if po.peerProxies && r.gossip != "" {
			p, err := newPeerProxy(i, r.advertise, r.gossip, &s.partition)
			if err != nil {
				return err
			}
			s.proxies = append(s.proxies, p)
		}
		cfg := routerConfig(o, servers, policy, ls[i])
		if r.gossip != "" {
			cfg = append(cfg, replicasSection(s.routers, i)...)
		}
		suffix := policy
		if n > 1 {
			suffix = fmt.Sprintf("%s-%d", policy, i)
		}
		r.cfgPath = filepath.Join(po.WorkDir, "kvrouter-"+suffix+".yaml")
		if err := os.WriteFile(r.cfgPath, cfg, 0o644); err != nil {
			return err
		}
		if err := s.spawn(r.name, filepath.Join(po.WorkDir, "kvrouter-"+suffix+".log"), nil, filepath.Join(po.BinDir, "kvrouter"),
			"--config", r.cfgPath, "--log-level", "info"); err != nil {
			return err
		}
	}
	for _, p := range s.proxies {
		p.start(s.routers)
	}
	s.routerConfig, s.extproc = s.routers[0].cfgPath, s.routers[0].ext
	s.routerURL, s.debugURL = s.routers[0].metricsURL, s.routers[0].debug
	return nil
}

// extprocs is the gateway's -extproc: every replica's ext_proc address.
func (s *procStack) extprocs() string {
	var out []string
	for _, r := range s.routers {
		out = append(out, r.ext)
	}
	return strings.Join(out, ",")
}

// replicasView is a replica's GET /debug/replicas.
type replicasView struct {
	Self    string   `json:"self"`
	Members []string `json:"members"`
	Peers   []struct {
		Name        string                     `json:"name"`
		Incarnation uint64                     `json:"incarnation"`
		Live        bool                       `json:"live"`
		AgeMS       float64                    `json:"age_ms"`
		Loads       map[string]json.RawMessage `json:"loads"`
	} `json:"peers"`
}

// livePeers returns the names of the peers whose state counts in the view (nil when the
// view could not be read; ok false).
func livePeers(ctx context.Context, debugURL string) (names []string, ok bool) {
	var v replicasView
	if json.Unmarshal([]byte(get(ctx, debugURL+"/debug/replicas")), &v) != nil {
		return nil, false
	}
	for _, p := range v.Peers {
		if p.Live {
			names = append(names, p.Name)
		}
	}
	return names, true
}

// replicasReady reports whether every replica of a stack is ready and, when they share
// state, holds a live snapshot from every other replica.
func replicasReady(ctx context.Context, client *http.Client, st Stack) (bool, string) {
	s, ok := st.(*procStack)
	if !ok || len(s.routers) < 2 {
		return true, ""
	}
	for _, r := range s.routers[1:] {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.metricsURL+"/readyz", nil)
		if err != nil {
			return false, err.Error()
		}
		resp, err := client.Do(req)
		if err != nil {
			return false, r.name + ": " + err.Error()
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return false, fmt.Sprintf("%s: /readyz: HTTP %d", r.name, resp.StatusCode)
		}
	}
	if s.routers[0].gossip == "" {
		return true, ""
	}
	for _, r := range s.routers {
		var v replicasView
		if err := json.Unmarshal([]byte(get(ctx, r.debug+"/debug/replicas")), &v); err != nil {
			return false, r.name + ": /debug/replicas: " + err.Error()
		}
		if v.Self == "" {
			continue // a policy that shares no state (kv...): kvrouter runs no peersync
		}
		live, _ := livePeers(ctx, r.debug)
		if len(live) < len(s.routers)-1 {
			return false, fmt.Sprintf("%s: %d of %d peers live", r.name, len(live), len(s.routers)-1)
		}
	}
	return true, ""
}

// RouterStats is one kvrouter replica's share of a run: the differences of its counters
// between the start and the end of the load (its /metrics) and its CPU time over the
// same span (/proc/<pid>/stat).
type RouterStats struct {
	Name string `json:"name"`
	// Routed is kvrouter_routing_decisions_total: the requests this replica routed.
	Routed float64 `json:"routed"`
	// CPUSeconds is the process's user + system time during the load (10 ms steps).
	CPUSeconds float64 `json:"cpu_s"`
	// Sync* are kvrouter_peersync_messages_total and _bytes_total: snapshots built and
	// sent (each to every peer), received (applied) and stale, and their bytes.
	SyncSent          float64 `json:"sync_sent"`
	SyncReceived      float64 `json:"sync_received"`
	SyncStale         float64 `json:"sync_stale"`
	SyncBytesSent     float64 `json:"sync_bytes_sent"`
	SyncBytesReceived float64 `json:"sync_bytes_received"`
	// Holds and HoldSeconds are kvrouter_routing_holds_total and
	// kvrouter_routing_hold_seconds_total: decisions that waited behind a miss in
	// progress (placement's holds), and the time they waited.
	Holds       float64 `json:"holds"`
	HoldSeconds float64 `json:"hold_s"`
	// Decision is kvrouter_routing_decision_duration_seconds over the load, SyncLag
	// kvrouter_peersync_lag_seconds (in JSON: ReplicaRun's figures).
	Decision *LagHistogram `json:"-"`
	SyncLag  *LagHistogram `json:"-"`
}

// routerSample is what routerStats differences.
type routerSample struct {
	values            map[string]float64
	cpu               time.Duration
	decision, syncLag *LagHistogram
}

const (
	decisionMetric    = "kvrouter_routing_decision_duration_seconds"
	syncLagMetric     = "kvrouter_peersync_lag_seconds"
	holdsMetric       = "kvrouter_routing_holds_total"
	holdSecondsMetric = "kvrouter_routing_hold_seconds_total"
)

// sampleRouters reads every replica's counters and CPU time (a stack without replicas:
// nil).
func sampleRouters(ctx context.Context, st Stack) []routerSample {
	s, ok := st.(*procStack)
	if !ok || len(s.routers) == 0 {
		return nil
	}
	out := make([]routerSample, len(s.routers))
	for i, r := range s.routers {
		body := get(ctx, r.metricsURL+"/metrics")
		out[i].values = sumFamilies(body, "kvrouter_routing_decisions_total",
			`kvrouter_peersync_messages_total{direction="sent"}`, `kvrouter_peersync_messages_total{direction="received"}`,
			`kvrouter_peersync_messages_total{direction="stale"}`, `kvrouter_peersync_bytes_total{direction="sent"}`,
			`kvrouter_peersync_bytes_total{direction="received"}`, holdsMetric, holdSecondsMetric)
		out[i].decision, _ = parseHistogram(strings.NewReader(body), decisionMetric)
		out[i].syncLag, _ = parseHistogram(strings.NewReader(body), syncLagMetric)
		if u, err := s.usage(r.name)(); err == nil {
			out[i].cpu = u.CPU
		}
	}
	return out
}

// routerStats differences two samples of the same stack.
func routerStats(st Stack, before, after []routerSample) []RouterStats {
	s, ok := st.(*procStack)
	if !ok || len(before) != len(s.routers) || len(after) != len(s.routers) {
		return nil
	}
	out := make([]RouterStats, len(s.routers))
	for i, r := range s.routers {
		d := func(k string) float64 { return after[i].values[k] - before[i].values[k] }
		out[i] = RouterStats{Name: r.name, Routed: d("kvrouter_routing_decisions_total"),
			CPUSeconds: (after[i].cpu - before[i].cpu).Seconds(),
			SyncSent:   d(`kvrouter_peersync_messages_total{direction="sent"}`), SyncReceived: d(`kvrouter_peersync_messages_total{direction="received"}`),
			SyncStale:     d(`kvrouter_peersync_messages_total{direction="stale"}`),
			SyncBytesSent: d(`kvrouter_peersync_bytes_total{direction="sent"}`), SyncBytesReceived: d(`kvrouter_peersync_bytes_total{direction="received"}`),
			Holds: d(holdsMetric), HoldSeconds: d(holdSecondsMetric),
			Decision: subHistogram(after[i].decision, before[i].decision), SyncLag: subHistogram(after[i].syncLag, before[i].syncLag)}
	}
	return out
}

// sumFamilies sums, for each key, the samples of a metrics page whose name is the key
// (any labels) or that start with it when it carries labels itself.
func sumFamilies(page string, keys ...string) map[string]float64 {
	out := make(map[string]float64, len(keys))
	for _, l := range strings.Split(page, "\n") {
		if l == "" || l[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(l, ' ')
		if i < 0 {
			continue
		}
		name := l[:i]
		v, err := strconv.ParseFloat(l[i+1:], 64)
		if err != nil {
			continue
		}
		family, _, _ := strings.Cut(name, "{")
		for _, k := range keys {
			if name == k || (!strings.Contains(k, "{") && family == k) {
				out[k] += v
			}
		}
	}
	return out
}

// subHistogram is a minus b (b may be nil: a unchanged; a nil: nil), bucket by bucket.
func subHistogram(a, b *LagHistogram) *LagHistogram {
	if a == nil || b == nil {
		return a
	}
	out := &LagHistogram{Count: a.Count - b.Count, SumSeconds: a.SumSeconds - b.SumSeconds}
	for i, bk := range a.Buckets {
		c := bk.Count
		if i < len(b.Buckets) && b.Buckets[i].LE == bk.LE {
			c -= b.Buckets[i].Count
		}
		out.Buckets = append(out.Buckets, LagBucket{LE: bk.LE, Count: c})
	}
	return out
}

// addHistogram merges histograms with the same buckets (nil ones are skipped).
func addHistogram(hs ...*LagHistogram) *LagHistogram {
	var out *LagHistogram
	for _, h := range hs {
		if h == nil {
			continue
		}
		if out == nil {
			out = &LagHistogram{Buckets: append([]LagBucket(nil), h.Buckets...)}
			out.Count, out.SumSeconds = h.Count, h.SumSeconds
			continue
		}
		out.Count += h.Count
		out.SumSeconds += h.SumSeconds
		for i := range out.Buckets {
			if i < len(h.Buckets) && h.Buckets[i].LE == out.Buckets[i].LE {
				out.Buckets[i].Count += h.Buckets[i].Count
			}
		}
	}
	return out
}

// ReplicaSetup is one way to run the routers in CompareReplicas.
type ReplicaSetup struct {
	Name     string `json:"name"`
	Routers  int    `json:"routers"`
	Unsynced bool   `json:"unsynced"`
}

// ReplicaSetups are issue 13's full-stack comparison: one router, n replicas sharing
// their in-flight state, n replicas that do not.
func ReplicaSetups(n int) []ReplicaSetup {
	return []ReplicaSetup{{Name: "1 router", Routers: 1}, {Name: fmt.Sprintf("%d replicas, synced", n), Routers: n},
		{Name: fmt.Sprintf("%d replicas, unsynced", n), Routers: n, Unsynced: true}}
}

// ReplicaRun is one (setup, policy, seed) run of CompareReplicas.
type ReplicaRun struct {
	Setup   string          `json:"setup"`
	Policy  string          `json:"policy"`
	Seed    uint64          `json:"seed"`
	Summary kvbench.Summary `json:"summary"`
	Routers []RouterStats   `json:"routers"`
	// DecisionMeanUs and DecisionP99LEUs are kvrouter_routing_decision_duration_seconds
	// over every replica during the load: the mean, and the upper bound of the bucket
	// holding the 99th percentile (-1: beyond the last finite bucket).
	DecisionMeanUs  float64 `json:"decision_mean_us"`
	DecisionP99LEUs float64 `json:"decision_p99_le_us"`
	// SyncLagMeanMs and SyncLagP99LEMs are kvrouter_peersync_lag_seconds over every
	// replica during the load (a snapshot's age when a peer applied it), in the same
	// form; nil without sync.
	SyncLagMeanMs  *float64 `json:"sync_lag_mean_ms,omitempty"`
	SyncLagP99LEMs *float64 `json:"sync_lag_p99_le_ms,omitempty"`
}

// ReplicaReport is what `kvdemo replicas --json` writes (docs/data/replicas/fullstack.json).
type ReplicaReport struct {
	Workers      int            `json:"workers"`
	KVMiB        int64          `json:"kv_mib"`
	TimeScale    float64        `json:"time_scale"`
	Prefixes     int            `json:"prefixes"`
	PrefixTokens int            `json:"prefix_tokens"`
	TailTokens   int            `json:"tail_tokens"`
	OutputTokens int            `json:"output_tokens"`
	Requests     int            `json:"requests"`
	Concurrency  int            `json:"concurrency"`
	Setups       []ReplicaSetup `json:"setups"`
	Runs         []ReplicaRun   `json:"runs"`
}

// CompareReplicas runs the workload of o once per seed, setup and policy (in that
// nesting, so that machine load drifts over every setup alike), each on a fresh process
// stack behind the dev gateway.
func CompareReplicas(ctx context.Context, o Options, po ProcessOptions, setups []ReplicaSetup, seeds []uint64) (ReplicaReport, error) {
	rep := ReplicaReport{Workers: o.Workers, KVMiB: o.KVBytes >> 20, TimeScale: o.TimeScale, Prefixes: o.Prefixes,
		PrefixTokens: o.PrefixTokens, TailTokens: o.TailTokens, OutputTokens: o.OutputTokens, Requests: o.Requests,
		Concurrency: o.Concurrency, Setups: setups}
	if po.Envoy != "" {
		return rep, errors.New("demo: replicas run behind the dev gateway only")
	}
	if _, _, err := o.workload(); err != nil { // loads the tokenizer once for every run
		return rep, err
	}
	for _, seed := range seeds {
		for _, su := range setups {
			oc := o
			oc.Seed, oc.Routers, oc.Unsynced = seed, su.Routers, su.Unsynced
			o.logf("%s, seed %d", su.Name, seed)
			res, err := Compare(ctx, oc, Processes(po))
			if err != nil {
				return rep, fmt.Errorf("demo: %s, seed %d: %w", su.Name, seed, err)
			}
			for _, r := range res {
				rr := ReplicaRun{Setup: su.Name, Policy: r.Policy, Seed: seed, Summary: r.Summary, Routers: r.Routers}
				c := SumRouters(r.Routers)
				if h := c.Decision; h != nil && h.Count > 0 {
					rr.DecisionMeanUs, rr.DecisionP99LEUs = 1000*h.MeanMs(), 1000*h.QuantileBoundMs(0.99)
					if math.IsInf(rr.DecisionP99LEUs, 1) {
						rr.DecisionP99LEUs = -1
					}
				}
				if h := c.SyncLag; h != nil && h.Count > 0 {
					m, p := h.MeanMs(), h.QuantileBoundMs(0.99)
					if math.IsInf(p, 1) {
						p = -1
					}
					rr.SyncLagMeanMs, rr.SyncLagP99LEMs = &m, &p
				}
				if su.Routers > 1 && !su.Unsynced && c.Routed > 0 {
					m, b := c.SyncSent/c.Routed, c.SyncBytesReceived/c.Routed
					rr.Summary.SyncMessagesPerRequest, rr.Summary.SyncBytesPerRequest = &m, &b
				}
				rep.Runs = append(rep.Runs, rr)
			}
		}
	}
	return rep, nil
}

// SumRouters adds the replicas' stats (CPU time and counters; the decision histograms
// merged).
func SumRouters(rs []RouterStats) RouterStats {
	var out RouterStats
	var hs, lags []*LagHistogram
	for _, r := range rs {
		out.Routed += r.Routed
		out.CPUSeconds += r.CPUSeconds
		out.SyncSent += r.SyncSent
		out.SyncReceived += r.SyncReceived
		out.SyncStale += r.SyncStale
		out.SyncBytesSent += r.SyncBytesSent
		out.SyncBytesReceived += r.SyncBytesReceived
		out.Holds += r.Holds
		out.HoldSeconds += r.HoldSeconds
		hs, lags = append(hs, r.Decision), append(lags, r.SyncLag)
	}
	out.Decision, out.SyncLag = addHistogram(hs...), addHistogram(lags...)
	return out
}

// WriteReplicaCost prints, per result, what its routers cost: requests each replica
// routed, CPU per routed request, state-sharing messages and bytes, decision latency.
func WriteReplicaCost(w io.Writer, results []Result) error {
	var b strings.Builder
	b.WriteString("\n| policy | routed per replica | CPU ms per routed request | snapshots sent / request | bytes received / request | decision mean / p99 <= us |\n")
	b.WriteString("|---|---|---|---|---|---|\n")
	for _, r := range results {
		var routed []string
		for _, x := range r.Routers {
			routed = append(routed, strconv.FormatFloat(x.Routed, 'f', 0, 64))
		}
		c := SumRouters(r.Routers)
		per := func(v float64) string {
			if c.Routed == 0 {
				return "-"
			}
			return strconv.FormatFloat(v/c.Routed, 'f', 2, 64)
		}
		dec := "-"
		if c.Decision != nil && c.Decision.Count > 0 {
			dec = fmt.Sprintf("%.0f / %g", 1000*c.Decision.MeanMs(), 1000*c.Decision.QuantileBoundMs(0.99))
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", r.Policy, strings.Join(routed, " + "), per(1000*c.CPUSeconds),
			per(c.SyncSent), per(c.SyncBytesReceived), dec)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
